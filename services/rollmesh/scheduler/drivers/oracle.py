"""The oracle driver: a rollout that runs the task's reference solution instead of a model (a job
with `AgentSpec.oracle`, `rollmesh run --oracle`), then verifies it, as Harbor's oracle agent does:
the conformance check of a task set (every task with a solution should score 1).

seed the session with the row marked `"oracle": true` (mesh/oracle.py; the environment may then
offer its hidden oracle tool: container tasks run solution/solve.sh in the rollout's machine) ->
call `ORACLE_TOOL` -> verify -> close. No model is called: the row has no turns and no token
record. An environment without an oracle tool fails the rollout with its TOOL_NOT_FOUND (never a
reward of 0); a task without a solution fails with the environment's own error (container tasks:
NO_SOLUTION).
"""

from __future__ import annotations

import dataclasses

from rollmesh.mesh.oracle import ORACLE_ROW_KEY
from rollmesh.mesh.oracle import ORACLE_TOOL
from rollmesh.scheduler.drivers.agent_loop import AgentOutcome
from rollmesh.scheduler.drivers.agent_loop import AgentSettings
from rollmesh.scheduler.drivers.agent_loop import EnvPort
from rollmesh.scheduler.drivers.agent_loop import Json
from rollmesh.scheduler.drivers.agent_loop import close_sessions
from rollmesh.scheduler.records import RolloutKey

FINISH_REASON = "oracle"


async def run_oracle(
    *, job_id: str, key: RolloutKey, task: Json, settings: AgentSettings, env: EnvPort
) -> AgentOutcome:
    session_id = f"{job_id}/{key.task_index}/{key.rollout_index}"
    row = {**task, ORACLE_ROW_KEY: True}
    seeded = False
    try:
        await env.seed_session(settings.environment, row, session_id)
        seeded = True
        call = {"id": "oracle-0", "type": "function", "function": {"name": ORACLE_TOOL, "arguments": "{}"}}
        result = await env.call_tool(session_id, call)
        messages: list[Json] = [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "oracle-0", "name": ORACLE_TOOL, "content": result.output},
        ]
        verdict = await env.verify(settings.environment, row, messages, session_id)
        verdict = dataclasses.replace(verdict, details={**verdict.details, "oracle": True})
        return AgentOutcome(messages=messages, verdict=verdict, turns=[], finish_reason=FINISH_REASON)
    finally:
        await close_sessions(env if seeded else None, None, session_id)
