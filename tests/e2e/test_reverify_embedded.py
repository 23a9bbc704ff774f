"""`rollmesh reverify` with no verifier named starts one in its own process, as `rollmesh run` does,
serving the environments of the artifact roots (here a plugin in the working directory): one step
instead of a verifier started by hand and waited for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.procs import run_cli

PLUGIN = '''
from rollmesh.verifier import Environment, Response, Session, Task, VerifyResult


class Shouty(Environment):
    """Right when the answer is the expected one in capitals."""

    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        return VerifyResult(reward=float(response.final_text == str(task.row["expected_answer"]).upper()))
'''


def _row(i: int, said: str) -> dict[str, object]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"Say {i} loudly"}]},
        "expected_answer": f"yes{i}",
        "reward": 0.0,
        "_ng_task_index": i,
        "_ng_rollout_index": 0,
        "response": {"output": [{"type": "message", "role": "assistant",
                                 "content": [{"type": "output_text", "text": said}]}]},
    }  # fmt: skip


async def test_reverify_without_a_verifier_serves_the_working_roots_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = tmp_path / "environments" / "shouty" / "env.py"
    env_file.parent.mkdir(parents=True)
    env_file.write_text(PLUGIN)
    rows = tmp_path / "rollouts.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in (_row(0, "YES0"), _row(1, "yes1"))))
    out = tmp_path / "out.jsonl"
    monkeypatch.delenv("ROLLMESH_VERIFIER_ADDR", raising=False)
    monkeypatch.chdir(tmp_path)  # the working directory is the first artifact root
    code, _, err = await run_cli("reverify", str(rows), "-e", "shouty", "-o", str(out))
    assert code == 0, err
    assert "starting a verifier in this process" in err
    assert [json.loads(line)["reward"] for line in out.read_text().splitlines()] == [1.0, 0.0]
