"""`rollmesh run`'s embedded gateway reads the ROLLMESH_GATEWAY_* variables as `serve gateway` does,
its own flags winning: it ignored them all (ROLLMESH_GATEWAY_API_KEY_ENV aside) and said nothing. The
two no gateway inside this process can use are named in a warning line each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.procs import run_cli

ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 2 + 3?"}]},
    "expected_answer": "5",
}


def _the_row(path: str) -> dict[str, Any]:
    (line,) = Path(path).read_text().splitlines()
    row: dict[str, Any] = json.loads(line)
    return row


async def test_the_embedded_gateway_reads_the_gateway_variables(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROW) + "\n")
    env = {
        "ROLLMESH_GATEWAY_MODEL_NAME": "mine",
        "ROLLMESH_GATEWAY_DEFAULT_MAX_TOKENS": "3",  # the row sets no max_tokens
        "ROLLMESH_GATEWAY_ADDR": "127.0.0.1:1",
        "ROLLMESH_OPENAI_HTTP_PORT": "8123",
    }

    async def run(*flags: str, **more: str) -> dict[str, Any]:
        argv = ("run", "--input", str(rows), "--environment", "arithmetic", "-o", str(tmp_path), "--json")
        code, out, err = await run_cli(*argv, *flags, env={**env, **more}, timeout_s=300)
        assert code == 0, err
        for var in ("ROLLMESH_GATEWAY_ADDR", "ROLLMESH_OPENAI_HTTP_PORT"):
            assert f"warning: {var} is ignored" in err, err
        return _the_row(json.loads(out)["paths"]["rollouts.jsonl"])

    row = await run("--backend", "fake")
    assert (
        row["chat_messages"] == [{"role": "assistant", "content": "Wha"}] and row["finish_reason"] == "length"
    )
    assert row["response"]["output"][0]["content"][0]["text"] == "Wha"
    assert row["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert row["tokens"]["turns"][0]["replica_id"] == "mine-replica-0"
    row = await run(ROLLMESH_GATEWAY_BACKEND="fake")  # it was Ray Serve + vLLM
    assert row["usage"] == {"prompt_tokens": 19, "completion_tokens": 3, "total_tokens": 22}
    # The flag wins over a variable (an openai backend with no URL could not start).
    row = await run("--backend", "fake", ROLLMESH_GATEWAY_BACKEND="openai")
    assert row["usage"] == {"prompt_tokens": 19, "completion_tokens": 3, "total_tokens": 22}


async def test_run_reads_the_replica_count_from_rollmesh_replicas(tmp_path: Path) -> None:
    """ROLLMESH_REPLICAS is read as `rollmesh up` and `serve gateway` read it (`--replicas` winning):
    `run` ignored it and served one replica. A bad value is refused before Ray starts."""
    argv = ("run", "--benchmark", "arithmetic", "--limit", "1", "-n", "1", "-o", str(tmp_path))
    code, _, err = await run_cli(*argv, env={"ROLLMESH_REPLICAS": "0"}, timeout_s=300)
    assert code == 2 and "ROLLMESH_REPLICAS=0 must be >= 1" in err, err
    code, _, err = await run_cli(*argv, "--replicas", "0", env={"ROLLMESH_REPLICAS": "2"}, timeout_s=300)
    assert code == 2 and "--replicas must be >= 1, got 0" in err, err
