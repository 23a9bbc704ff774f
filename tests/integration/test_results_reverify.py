"""`rollmesh reverify` against a fake verifier servicer: VerifyBatch, bounded window, per-item errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.rpc import code_pb2
from google.rpc import status_pb2
from typer.testing import CliRunner
from typer.testing import Result

from rollmesh.cli import build_app
from rollmesh.commands._reverify import reverify
from rollmesh.mesh.server import ServiceBinding
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh_client.v1 import verifier_pb2
from rollmesh_client.v1 import verifier_pb2_grpc
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
        expected = task.get("expected_answer", "")  # a missing field defaults, as some servers' do
        if expected == "boom":
            err = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="cannot parse the task")
            return verifier_pb2.VerifyBatchResponse(id=item.id, error=err)
        ok = answer.strip() == expected
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


def nemo_row(t: int, answer: str, recorded: float, content: object) -> dict[str, object]:
    """A row as NeMo Gym records a rollout (its own key, no rollmesh task_index): the verify
    response it got, without the dataset row's other fields."""
    out = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}
    return {
        "responses_create_params": {"input": [{"role": "user", "type": "message", "content": content}]},
        "response": {"object": "response", "status": "completed", "output": [out]},
        "reward": recorded,
        "_ng_task_index": t,
        "_ng_rollout_index": 0,
    }


def image_question(t: int) -> list[dict[str, str]]:
    image = {"type": "input_image", "image_url": f"data:image/png;base64,{t}AAAA"}
    return [image, {"type": "input_text", "text": "How many circles?"}]  # the same text each row


async def invoke(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, build_app(), list(args))


async def test_errors_fail_the_command_and_the_means_are_over_what_was_rescored(
    verifier: tuple[str, FakeVerifier], tmp_path: Path
) -> None:
    """#43: `reverified 0 rows (5 errors ...); mean reward 0.9160 -> 0.9160` exited 0."""
    address, _ = verifier
    src = tmp_path / "rollouts.jsonl"
    rows = [row(0, "7", "7", 0.0), row(1, "7", "7", 0.0), row(2, "7", "boom", 1.0)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rescored.jsonl"
    res = await invoke("reverify", str(src), "-e", "arithmetic", "--verifier", address, "-o", str(out))
    assert res.exit_code == 1, res.output  # every row is still written
    assert (
        "reverified 2 rows (1 errors, 2 rewards changed); mean reward over them 0.0000 -> 1.0000"
        in res.stderr
    )
    assert [r.get("reverify_error", "") for r in map(json.loads, out.read_text().splitlines())][2]
    src.write_text(json.dumps(row(0, "7", "boom", 1.0)) + "\n")
    none = await invoke("reverify", str(src), "-e", "arithmetic", "--verifier", address, "-o", str(out))
    assert none.exit_code == 1 and "no mean reward (nothing was re-scored)" in none.stderr, none.stderr


async def test_tasks_with_image_parts_are_joined_not_refused(
    verifier: tuple[str, FakeVerifier], tmp_path: Path
) -> None:
    """#43: `--tasks` refused rows with image parts ("only text content parts are supported"), but
    reverify calls no model: each rollout is joined to its row by its parts as written."""
    address, _ = verifier
    tasks = tmp_path / "example.jsonl"
    task_rows = [
        {
            "responses_create_params": {
                "input": [{"role": "user", "type": "message", "content": image_question(t)}]
            },
            "expected_answer": str(t + 3),
        }
        for t in range(3)
    ]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in task_rows))
    src = tmp_path / "example_rollouts.jsonl"
    src.write_text(
        "".join(json.dumps(nemo_row(t, str(t + 3), 1.0, image_question(t))) + "\n" for t in (2, 0, 1))
    )
    out = tmp_path / "rescored.jsonl"
    args = [
        "reverify",
        str(src),
        "-e",
        "circles",
        "--tasks",
        str(tasks),
        "--verifier",
        address,
        "-o",
        str(out),
    ]
    res = await invoke(*args)
    assert res.exit_code == 0, res.output
    assert (
        "match no row" not in res.stderr and "reverified 3 rows (0 errors, 0 rewards changed)" in res.stderr
    )
    assert [r["reward"] for r in map(json.loads, out.read_text().splitlines())] == [1.0, 1.0, 1.0]


async def test_a_recorded_reward_never_silently_becomes_0_without_its_row(
    verifier: tuple[str, FakeVerifier], tmp_path: Path
) -> None:
    """#43: without --tasks, NeMo Gym's recorded rollouts (which lack row fields a verify needs;
    circle_count's server then counts no circles) turned recorded 1s into 0s, exit 0. Such a drop
    is flagged on the row and fails the command."""
    address, _ = verifier
    src = tmp_path / "example_rollouts.jsonl"
    rows = [nemo_row(0, "3", 1.0, image_question(0)), nemo_row(1, "4", 1.0, image_question(1))]
    rows[1]["expected_answer"] = "4"  # this one carries what its verify reads: re-scored 1
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rescored.jsonl"
    res = await invoke("reverify", str(src), "-e", "circles", "--verifier", address, "-o", str(out))
    assert res.exit_code == 1, res.output
    assert "1 fell to 0 without --tasks" in res.stderr and "give --tasks" in res.stderr, res.stderr
    dropped, kept = map(json.loads, out.read_text().splitlines())
    assert (
        dropped["reward"] == 0.0
        and dropped["previous_reward"] == 1.0
        and "--tasks" in dropped["reverify_warning"]
    )
    assert kept["reward"] == 1.0 and "reverify_warning" not in kept
