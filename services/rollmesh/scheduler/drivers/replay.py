"""Replaying a stored rollout through the agent loop, its recorded assistant turns standing in for
the model: how `rollmesh reverify` re-scores a rollout of an environment that takes turns.

Such a rollout's reward is its steps' rewards plus verify's, and the steps need the episode's
session, which is gone once the rollout ended: verifying the final messages alone would score
another thing (a game's verify, without its session, sees no game). So the rollout is played again
in a new session: `run_agent` (the one loop) with `RecordedModel` as its model, so seeding, the
calls to the environment's own tools, each step and verify run exactly as they did live, in order,
and the outcome carries the replayed steps and reward. Each recorded assistant message is one model
turn; a turn with tool calls counts as finished with "tool_calls", any other as "stop" (a row keeps
no per-turn finish reason). The replay ends where the loop ends: a step that says `done`, or the
last recorded turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace
from typing import Any

from rollmesh.scheduler.drivers.agent_loop import AgentOutcome
from rollmesh.scheduler.drivers.agent_loop import AgentSettings
from rollmesh.scheduler.drivers.agent_loop import EnvPort
from rollmesh.scheduler.drivers.agent_loop import GenerateCall
from rollmesh.scheduler.drivers.agent_loop import Json
from rollmesh.scheduler.drivers.agent_loop import Turn
from rollmesh.scheduler.drivers.agent_loop import run_agent
from rollmesh.scheduler.errors import NothingToReplay
from rollmesh.scheduler.records import Rollout


class RecordedModel:
    """A ModelPort that answers each call with the next recorded assistant message."""

    def __init__(self, messages: list[Json]) -> None:
        self._turns = [m for m in messages if m.get("role") == "assistant"]
        self._next = 0

    @property
    def turns(self) -> int:
        return len(self._turns)

    @property
    def used(self) -> int:
        """The recorded turns answered so far."""
        return self._next

    async def generate(self, call: GenerateCall) -> Turn:
        if self._next >= len(self._turns):
            raise NothingToReplay(
                f"the loop asked for turn {self._next + 1}; the rollout recorded {self.turns}"
            )
        message = self._turns[self._next]
        self._next += 1
        return Turn(message=message, finish_reason="tool_calls" if message.get("tool_calls") else "stop")

    async def close_session(self, session_id: str) -> None:
        return None

    async def engine_capacity(self, model: str) -> int:
        return 0


@dataclass(frozen=True)
class Replayed:
    """A replay's outcome and, when it did not end where the recorded episode ended, why
    (`diverged`, "" when it did): its reward then scores another episode than the one recorded."""

    outcome: AgentOutcome
    diverged: str = ""


async def replay(rollout: Rollout, *, environment: str, env: EnvPort, session_prefix: str) -> Replayed:
    """Play `rollout` again against `environment` on `env`, in the session
    `{session_prefix}/{task_index}/{rollout_index}` (closed afterwards)."""
    model = RecordedModel(rollout.messages)
    if not model.turns:
        raise NothingToReplay("the rollout has no assistant turn to replay")
    settings = AgentSettings(environment=environment, max_steps=model.turns)
    task: dict[str, Any] = dict(rollout.task)
    outcome = await run_agent(
        job_id=session_prefix,
        key=rollout.key,
        task=task,
        seed=rollout.seed,
        settings=settings,
        model=model,
        env=env,
    )
    # the recorded turns carry no token ids: nothing to build
    return Replayed(replace(outcome, turns=[]), _divergence(rollout, outcome, model))


def _divergence(rollout: Rollout, outcome: AgentOutcome, model: RecordedModel) -> str:
    """Why the replay did not end where the recorded episode ended ("" when it did, or when the
    episode took no turns): over (`done`) live and not when the recorded turns ran out, or over with
    recorded turns left."""
    if not rollout.env_steps and not outcome.steps:
        return ""
    was_done = bool(rollout.env_steps) and bool(rollout.env_steps[-1].get("done"))
    is_done = bool(outcome.steps) and outcome.steps[-1].done
    if was_done and not is_done:
        return (
            f"the recorded episode ended (done) after {len(rollout.env_steps)} steps; replayed, it was not"
            f" over when its {model.turns} recorded turns ran out"
        )
    if is_done and model.used < model.turns:
        return f"the replayed episode ended (done) after {model.used} of its {model.turns} recorded turns"
    return ""
