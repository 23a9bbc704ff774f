"""`rollmesh reverify` against a fake verifier servicer: VerifyBatch, bounded window, per-item errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.rpc import code_pb2, status_pb2
from typer.testing import CliRunner

from rollmesh.cli import build_app
from rollmesh.commands._reverify import reverify
from rollmesh.mesh.server import ServiceBinding
from rollmesh.scheduler.records import Rollout, RolloutKey
from rollmesh_client.v1 import verifier_pb2, verifier_pb2_grpc
from tests.conftest import StartServer


class FakeVerifier(verifier_pb2_grpc.EnvironmentVerifierServicer):
    """Reward 1 when the last assistant message equals the task's expected_answer; a task with
    expected_answer "boom" gets a per-item error."""

    def __init__(self, hold: int = 4) -> None:
        self.hold = hold
        self.max_outstanding = 0
        self.environments: set[str] = set()

    async def VerifyBatch(
        self,
        request_iterator: AsyncIterator[verifier_pb2.VerifyBatchRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[verifier_pb2.VerifyBatchResponse]:
        # Hold answers until `hold` requests are waiting (or the client half-closed), and give the
        # client time to (wrongly) send more: max_outstanding shows how many it ever had in flight.
        pending: list[verifier_pb2.VerifyBatchRequest] = []
        arrived = asyncio.Event()
        done = False

        async def read() -> None:
            nonlocal done
            async for item in request_iterator:
                pending.append(item)
                self.max_outstanding = max(self.max_outstanding, len(pending))
                arrived.set()
            done = True
            arrived.set()

        reader = asyncio.create_task(read())
        try:
            while not (done and not pending):
                await arrived.wait()
                arrived.clear()
                if len(pending) < self.hold and not done:
                    continue
                await asyncio.sleep(0.02)  # a window-breaking client would push more now
                batch, pending[:] = list(pending), []
                for item in batch:
                    yield self.answer(item)
        finally:
            reader.cancel()

    def answer(self, item: verifier_pb2.VerifyBatchRequest) -> verifier_pb2.VerifyBatchResponse:
        self.environments.add(item.request.environment)
        task = json.loads(item.request.task_json)
        answer = [m.content for m in item.request.response.messages if m.role == "assistant"][-1]
        if task["expected_answer"] == "boom":
            err = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="cannot parse the task")
            return verifier_pb2.VerifyBatchResponse(id=item.id, error=err)
        ok = answer.strip() == task["expected_answer"]
        return verifier_pb2.VerifyBatchResponse(
            id=item.id,
            result=verifier_pb2.VerifyResult(
                reward=1.0 if ok else 0.0,
                components={"exact": 1.0 if ok else 0.0},
                extracted_answer=answer.strip(),
                details_json=json.dumps({"checked": True}),
            ),
        )


def row(t: int, answer: str, expected: str, stored_reward: float) -> dict[str, object]:
    return Rollout(
        key=RolloutKey(t, 0),
        job_id="j",
        task={"expected_answer": expected},
        messages=[{"role": "assistant", "content": answer}],
        reward=stored_reward,
    ).to_row()


@pytest.fixture
async def verifier(start_server: StartServer) -> tuple[str, FakeVerifier]:
    fake = FakeVerifier()  # type: ignore[abstract]  # only VerifyBatch is served
    binding = ServiceBinding(
        "rollmesh.v1.EnvironmentVerifier", fake, verifier_pb2_grpc.add_EnvironmentVerifierServicer_to_server
    )
    server = await start_server([binding])
    return server.address, fake


async def test_reverify_rescoring_with_a_bounded_window(verifier: tuple[str, FakeVerifier]) -> None:
    address, fake = verifier
    rows = [row(t, str(t), str(t) if t % 3 else "x", stored_reward=0.5) for t in range(30)]
    rows.append(row(30, "1", "boom", stored_reward=1.0))
    progress: list[int] = []
    report = await reverify(
        rows, environment="arithmetic", verifier=address, window=4, on_progress=progress.append
    )
    assert fake.environments == {"arithmetic"}
    assert fake.max_outstanding == 4  # the window was used, never exceeded
    assert report.scored == 30 and report.errors == 1 and sum(progress) == 31
    by_task = {r["task_index"]: r for r in report.rows}
    assert by_task[1]["reward"] == 1.0 and by_task[1]["previous_reward"] == 0.5
    assert by_task[3]["reward"] == 0.0 and by_task[3]["verify_details"] == {"checked": True}
    assert by_task[30]["reverify_error"] == "INVALID_ARGUMENT: cannot parse the task"
    assert by_task[30]["reward"] == 1.0  # an item that failed keeps its row
    assert report.changed == 30
    assert [r["task_index"] for r in report.rows] == list(range(31))  # input order kept


async def test_reverify_cli(verifier: tuple[str, FakeVerifier], tmp_path: Path) -> None:
    address, _ = verifier
    src = tmp_path / "rollouts.jsonl"
    src.write_text("".join(json.dumps(row(t, "7", "7" if t else "8", 0.0)) + "\n" for t in range(5)))
    out = tmp_path / "rescored.jsonl"
    args = ["reverify", str(src), "--environment", "arithmetic", "--verifier", address, "--out", str(out)]
    res = await asyncio.to_thread(CliRunner().invoke, build_app(), args)
    assert res.exit_code == 0, res.output
    rescored = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["reward"] for r in rescored] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert "reverified 5 rows (0 errors, 4 rewards changed)" in res.stderr


async def test_reverify_cli_errors(tmp_path: Path) -> None:
    src = tmp_path / "rollouts.jsonl"
    src.write_text(json.dumps(row(0, "7", "7", 0.0)) + "\n")
    runner = CliRunner()
    args = ["reverify", str(src), "--environment", "e", "--verifier", "127.0.0.1:1", "--timeout", "5"]
    res = await asyncio.to_thread(runner.invoke, build_app(), args)
    assert res.exit_code == 1 and "VERIFIER_UNAVAILABLE" in res.stderr
    missing = await asyncio.to_thread(runner.invoke, build_app(), ["reverify", "nope.jsonl", "-e", "e"])
    assert missing.exit_code == 2 and "no such file" in missing.stderr
