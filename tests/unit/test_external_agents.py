"""External agent programs, without servers: the gateway's capture store (gateway/captures.py), token
records with segments (scheduler/tokens.py) and the program runner's failure classes and environment
(scheduler/drivers/program.py) with in-process ports and tiny shell programs."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from rollmesh.gateway import errors as gw_errors
from rollmesh.gateway.backends.base import SamplingInput
from rollmesh.gateway.backends.fake import FakeTokenizer
from rollmesh.gateway.captures import CaptureStore
from rollmesh.gateway.types import GenerateInput
from rollmesh.mesh.chat import Message
from rollmesh.scheduler.drivers.agent_loop import AgentSettings
from rollmesh.scheduler.drivers.agent_loop import Turn
from rollmesh.scheduler.drivers.program import CapturedTurn
from rollmesh.scheduler.drivers.program import CaptureOpened
from rollmesh.scheduler.drivers.program import CaptureRecord
from rollmesh.scheduler.drivers.program import ProgramSpec
from rollmesh.scheduler.drivers.program import run_program
from rollmesh.scheduler.drivers.tool_endpoint import ToolEndpoint
from rollmesh.scheduler.errors import AgentProgramExited
from rollmesh.scheduler.errors import AgentProgramNoModelCall
from rollmesh.scheduler.errors import AgentProgramTimedOut
from rollmesh.scheduler.errors import AgentProgramUnstartable
from rollmesh.scheduler.errors import TokenRecordMismatch
from rollmesh.scheduler.records import SEGMENT_KEY
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import TurnSpan
from rollmesh.scheduler.tokens import build_token_record
from rollmesh.scheduler.tokens import validate_rollout
from rollmesh.scheduler.tokens import validate_token_record
from tests.fakes import LocalEnv
from tests.fakes import LocalModel

# -- the capture store ---------------------------------------------------------------------------


def test_a_capture_needs_the_http_facade() -> None:
    with pytest.raises(gw_errors.CaptureUnavailable):
        CaptureStore().open("job/0/0")


def test_a_call_runs_with_the_captures_model_session_seed_and_request_ids() -> None:
    store = CaptureStore()
    store.http_root = "http://127.0.0.1:9"
    capture = store.open(
        "job/0/0",
        model="policy",
        sampling=SamplingInput(temperature=0.5, max_tokens=64, seed=7, logprobs=True),
        session_id="job/0/0",
        max_calls=2,
    )
    assert store.base_url(capture) == f"http://127.0.0.1:9/capture/{capture.key}/v1"
    assert "job" not in capture.path  # the URL holds a random key, not the rollout's id
    sent = GenerateInput(
        model="gpt-4o", messages=(Message("user", "hi"),), sampling=SamplingInput(temperature=0.0, seed=1)
    )
    first = store.get(capture.key, capture.token).apply(sent)
    assert (first.model, first.session_id, first.request_id) == ("policy", "job/0/0", "job/0/0/0")
    # The call's own temperature wins; what it leaves unset is the capture's; seed and logprobs are the job's.
    assert first.sampling == SamplingInput(temperature=0.0, max_tokens=64, seed=7, logprobs=True)
    assert capture.apply(sent).request_id == "job/0/0/1"
    with pytest.raises(gw_errors.CaptureCallsExhausted):
        capture.apply(sent)
    assert capture.refused == 1
    with pytest.raises(gw_errors.CaptureTokenWrong):
        store.get(capture.key, "not-the-token")
    with pytest.raises(gw_errors.CaptureExists):
        store.open("job/0/0")
    assert store.close("job/0/0") is capture
    with pytest.raises(gw_errors.CaptureNotFound):
        store.get(capture.key, capture.token)
    with pytest.raises(gw_errors.CaptureNotFound):
        store.close("job/0/0")


# -- token records with segments -----------------------------------------------------------------


def _turn(prompt: list[int], out: list[int], *, new_segment: bool = False, **kw: Any) -> Turn:
    return Turn(
        message={"role": "assistant", "content": ""},
        prompt_token_ids=prompt,
        output_token_ids=out,
        logprobs=[-0.5] * len(out),
        new_segment=new_segment,
        **kw,
    )


def test_a_turn_that_rewrites_history_starts_a_segment() -> None:
    turns = [
        _turn([1, 2], [3]),
        _turn([1, 2, 3, 4], [5]),
        _turn([9, 8], [7], new_segment=True),
        _turn([9, 8, 7, 6], [5]),
    ]
    record = build_token_record(turns, logprobs_wanted=True)
    assert record.token_ids == [1, 2, 3, 4, 5, 9, 8, 7, 6, 5]
    assert record.loss_mask == [0, 0, 1, 0, 1, 0, 0, 1, 0, 1]
    assert [(t.prompt_start, t.output_start, t.output_end, t.segment) for t in record.turns] == [
        (0, 2, 3, 0),
        (3, 4, 5, 0),
        (5, 7, 8, 1),
        (8, 9, 10, 1),
    ]
    assert validate_token_record(record) == []
    # Without the mark the same turns do not line up: the built-in loop never starts a segment.
    turns[2].new_segment = False
    with pytest.raises(TokenRecordMismatch):
        build_token_record(turns)


def test_validate_refuses_a_segment_that_skips() -> None:
    record = build_token_record([_turn([1], [2]), _turn([5], [6], new_segment=True)])
    record.turns[1] = TurnSpan(2, 3, 4, segment=2)
    assert any("segment 2 does not follow segment 0" in r for r in validate_token_record(record))


def test_validate_checks_each_segments_text() -> None:
    tok = FakeTokenizer()
    a, b = tok.encode("the plan<|end|>"), tok.encode("done<|end|>")
    turns = [_turn([1, 2], a), _turn([4, 5], b, new_segment=True)]
    messages = [
        {"role": "assistant", "content": "the plan"},
        {"role": "user", "content": "summary", SEGMENT_KEY: 1},
        {"role": "assistant", "content": "old answer"},  # history the program wrote itself
        {"role": "assistant", "content": "done"},
    ]
    rollout = Rollout(RolloutKey(0, 0), "j", {}, messages, 1.0, tokens=build_token_record(turns))
    assert validate_rollout(rollout, tokenizer=tok) == []
    messages[3]["content"] = "not done"
    assert any("turn 2" in r for r in validate_rollout(rollout, tokenizer=tok))
    del messages[1][SEGMENT_KEY]
    assert validate_rollout(rollout, tokenizer=tok) == ["2 token record segments but the messages hold 1"]


# -- the runner ----------------------------------------------------------------------------------


class CaptureModel(LocalModel):
    """A model port whose capture hands back `record` (the calls the program would have made)."""

    def __init__(self, record: CaptureRecord | None = None) -> None:
        super().__init__()
        self.record = record or CaptureRecord()
        self.opened: list[tuple[str, dict[str, Any]]] = []

    async def open_capture(
        self, capture_id: str, *, model: str, sampling: Any, session_id: str
    ) -> CaptureOpened:
        self.opened.append((capture_id, dict(sampling)))
        return CaptureOpened(base_url="http://127.0.0.1:9/capture/k/v1", token="capture-token")

    async def close_capture(self, capture_id: str) -> CaptureRecord:
        return self.record


HERE = Path(__file__).resolve().parent

TASK = {
    "responses_create_params": {"input": [{"role": "user", "content": "add 3"}]},
    "expected_answer": "3",
}
SETTINGS = AgentSettings(environment="session_state", max_steps=4, sampling={"temperature": 0.0})


async def _run(
    argv: list[str],
    model: CaptureModel,
    env: LocalEnv | None = None,
    timeout_s: float = 30.0,
    *,
    task: dict[str, Any] | None = None,
    settings: AgentSettings = SETTINGS,
) -> Any:
    tools = ToolEndpoint()
    try:
        return await run_program(
            job_id="job",
            key=RolloutKey(0, 1),
            task=task or TASK,
            seed=11,
            settings=settings,
            program=ProgramSpec(argv=tuple(argv), timeout_s=timeout_s),
            model=model,
            env=env or LocalEnv(),
            tools=tools,
        )
    finally:
        await tools.stop()


async def test_a_program_that_exits_non_zero_fails_by_name() -> None:
    with pytest.raises(AgentProgramExited) as exc:
        await _run(["sh", "-c", "echo broke >&2; exit 3"], CaptureModel())
    assert exc.value.reason == "AGENT_PROGRAM_EXITED" and "exited with 3" in exc.value.message
    assert "broke" in exc.value.message


async def test_a_program_with_no_model_call_fails_by_name() -> None:
    with pytest.raises(AgentProgramNoModelCall):
        await _run(["true"], CaptureModel())


async def test_a_program_past_its_deadline_is_killed() -> None:
    env = LocalEnv()
    with pytest.raises(AgentProgramTimedOut):
        await _run(["sh", "-c", "sleep 30 & sleep 30"], CaptureModel(), env, timeout_s=0.5)
    assert env.closed == ["job/0/1"]  # the session is closed whatever happened


async def test_a_program_that_cannot_start_fails_by_name() -> None:
    with pytest.raises(AgentProgramUnstartable):
        await _run(["/nonexistent/agent"], CaptureModel())


async def test_the_program_gets_the_task_the_urls_and_never_the_mesh_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ROLLMESH_API_KEY", "mesh-secret")
    script = (
        "import json, os, sys\n"
        "stdin = json.load(sys.stdin)\n"
        "with open(os.environ['ROLLMESH_TASK_FILE']) as f: task = json.load(f)\n"
        "print(json.dumps({'env': dict(os.environ), 'stdin': stdin, 'file': task}))\n"
        "open(os.environ['ROLLMESH_ANSWER_FILE'], 'w').write('3')\n"
    )
    turn = _turn([1, 2], [3], finish_reason="stop")
    turn.message = {"role": "assistant", "content": "3"}
    record = CaptureRecord(
        calls=[CapturedTurn("chat.completions", [{"role": "user", "content": "add 3"}], turn)]
    )
    env = LocalEnv()
    model = CaptureModel(record)
    outcome = await _run([sys.executable, "-c", script], model, env)
    got = json.loads(outcome.program["stdout"])  # (it may write only its own folder)
    assert "ROLLMESH_API_KEY" not in got["env"]
    assert got["env"]["OPENAI_API_KEY"] == "capture-token"
    assert got["env"]["OPENAI_BASE_URL"] == "http://127.0.0.1:9/capture/k/v1"
    assert got["env"]["ROLLMESH_TOOLS_URL"].startswith("http://127.0.0.1:")
    assert got["stdin"] == got["file"]
    assert got["file"]["messages"] == [{"role": "user", "content": "add 3"}]
    assert {t["function"]["name"] for t in got["file"]["tools"]} == {"increment", "get_count"}  # LocalEnv's
    assert model.opened == [("job/0/1", {"temperature": 0.0, "seed": 11})]  # the rollout's seed
    assert outcome.messages == [{"role": "assistant", "content": "3"}]
    assert outcome.program["exit_code"] == 0 and outcome.program["answer_file"] is True
    assert outcome.program["calls"] == 1
    assert not await asyncio.to_thread(
        os.path.exists, got["env"]["ROLLMESH_TASK_FILE"]
    )  # the program's folder is removed


# -- the trainer SDK -----------------------------------------------------------------------------


def test_a_trainer_sees_segments_and_collate_never_joins_them() -> None:
    from rollmesh.scheduler import convert
    from rollmesh_client.trainer import TrainerRollout
    from rollmesh_client.trainer import collate

    def trainer_rollout(turns: list[Turn]) -> TrainerRollout:
        record = build_token_record(turns, logprobs_wanted=True)
        return TrainerRollout.from_pb(
            convert.rollout_to_pb(Rollout(RolloutKey(0, 0), "j", {}, [], 1.0, tokens=record))
        )

    one = trainer_rollout([_turn([1, 2], [3]), _turn([1, 2, 3, 4], [5])])
    two = trainer_rollout([_turn([1, 2], [3]), _turn([9, 8], [7], new_segment=True)])
    assert one.segments == [(0, 5)] and two.segments == [(0, 3), (3, 6)]
    assert len(collate([one])) == 1
    with pytest.raises(ValueError, match="rollout j/0/0 has 2 token record segments"):
        collate([one, two])


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace needs CAP_SYS_ADMIN (root)")
async def test_the_program_reaches_its_tools_and_capture_ports_and_nothing_else() -> None:
    """In the `network` mode the program's loopback holds only its capture's and tools' ports,
    relayed to the scheduler: a server on another loopback port of the host is out of its reach."""
    other = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    other_port = other.sockets[0].getsockname()[1]
    script = (
        "import json, os, socket, urllib.request\n"
        "tools = json.load(urllib.request.urlopen(os.environ['ROLLMESH_TOOLS_URL'], timeout=10))\n"
        "print(sorted(t['function']['name'] for t in tools['tools']))\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {other_port}), timeout=5)\n"
        "    print('reached')\n"
        "except OSError:\n"
        "    print('unreachable')\n"
    )
    turn = _turn([1], [2], finish_reason="stop")
    record = CaptureRecord(
        calls=[CapturedTurn("chat.completions", [{"role": "user", "content": "add 3"}], turn)]
    )
    try:
        outcome = await _run([sys.executable, "-c", script], CaptureModel(record))
    finally:
        other.close()
    assert outcome.program["sandbox"] == "uid+mount+pid+network"
    assert outcome.program["stdout"].splitlines() == ["['get_count', 'increment']", "unreachable"]


def test_a_program_rollout_keeps_its_run_and_segments_over_the_wire_and_in_its_row() -> None:
    from rollmesh.scheduler import convert

    record = build_token_record([_turn([1], [2]), _turn([5], [6], new_segment=True)])
    run = {"sandbox": "network", "exit_code": 0, "segments": 2}
    rollout = Rollout(RolloutKey(0, 0), "j", {"q": 1}, [], 1.0, tokens=record, agent_program=run)
    back = convert.rollout_from_pb(convert.rollout_to_pb(rollout))
    assert back.agent_program == run and [t.segment for t in back.tokens.turns] == [0, 1]
    row = Rollout.from_row(rollout.to_row())
    assert row.agent_program == run and row.task == {"q": 1}  # not taken for a task field
    assert "agent_program" not in Rollout(RolloutKey(0, 0), "j", {}, [], 1.0).to_row()


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid and namespaces of its own need root")
async def test_the_program_runs_as_its_own_uid_under_an_init_and_writes_only_its_folder() -> None:
    script = (
        "import json, os\n"
        "def attempt(path):\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        return 'wrote'\n"
        "    except OSError as exc:\n"
        "        return exc.strerror\n"
        "print(json.dumps({'uid': os.getuid(), 'pid': os.getpid(), 'ppid': os.getppid(),\n"
        "    'here': attempt('mine'),\n"
        f"    'repo': attempt({str(HERE / 'planted')!r}),\n"
        "    'root': sorted(os.listdir('/root'))}))\n"
    )
    turn = _turn([1], [2], finish_reason="stop")
    record = CaptureRecord(
        calls=[CapturedTurn("chat.completions", [{"role": "user", "content": "add 3"}], turn)]
    )
    outcome = await _run([sys.executable, "-c", script], CaptureModel(record))
    seen = json.loads(outcome.program["stdout"])
    assert outcome.program["sandbox"] == "uid+mount+pid+network"
    assert 65000 <= seen["uid"] <= 65533 and (seen["pid"], seen["ppid"]) == (2, 1)  # under its init
    assert seen["here"] == "wrote" and seen["repo"] == "Read-only file system"
    assert not await asyncio.to_thread((HERE / "planted").exists)
    assert ".ssh" not in seen["root"]  # only what it runs is there, read-only
