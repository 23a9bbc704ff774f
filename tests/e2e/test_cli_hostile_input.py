"""`rollmesh run` on hostile input, end to end (embedded mesh, fake model): every refusal is one
`error:` line on stderr with the usage exit code (2) and no traceback; a row whose answer cannot be
judged (no usable expected_answer) fails that rollout with class BAD_TASK (exit 3) instead of
recording a reward of 0; unicode rows run as any other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollmesh.registry.roots import BUILTIN_ROOT
from tests.procs import run_cli

_BUILTIN_ARITHMETIC = BUILTIN_ROOT / "environments" / "arithmetic" / "env.py"

GOOD = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 2 + 3?"}]},
    "expected_answer": "5",
}


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


async def _run_input(tmp_path: Path, path: str, *extra: str) -> tuple[int, str, str]:
    """`rollmesh run --input PATH --environment arithmetic` on the embedded mesh's fake model."""
    runs = str(tmp_path / "runs")
    return await run_cli(
        "run", "--input", path, "--environment", "arithmetic", "--backend", "fake", "-o", runs, *extra
    )


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _line(row: object) -> bytes:
    return (json.dumps(row) + "\n").encode()


@pytest.mark.parametrize(
    ("name", "data", "needle"),
    [
        ("not_json", _line(GOOD) + b"not json\n", ":2: not valid JSON"),
        ("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x92\xff", ":1: not UTF-8"),
        ("a_list", b"[1, 2]\n", "must be a JSON object"),
        ("no_input", _line({"expected_answer": "5"}), "responses_create_params"),
        ("empty", b"", "no rows"),
        # json.loads refuses these with ValueError / RecursionError, not JSONDecodeError (were INTERNAL)
        ("huge_number", _line(GOOD) + b'{"n": ' + b"1" * 5000 + b"}\n", ":2: not valid JSON (a number"),
        ("too_deep", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", ":1: not valid JSON (nested"),
    ],
)
async def test_a_malformed_dataset_is_one_line_exit_2(
    tmp_path: Path, name: str, data: bytes, needle: str
) -> None:
    code, out, err = await _run_input(tmp_path, _write(tmp_path / f"{name}.jsonl", data))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert len(errors) == 1 and needle in errors[0] and "MALFORMED_DATASET_ROW" in errors[0], err
    assert "Traceback" not in err and out == ""


async def test_unknown_names_are_one_line_exit_2_before_the_mesh_starts(tmp_path: Path) -> None:
    """A misspelt benchmark, environment, dataset or backend is named (with what there is) before any
    service starts, and leaves no empty services log behind."""
    runs = tmp_path / "runs"
    for args, needle in [
        (("--benchmark", "no-such-benchmark"), "known: arithmetic"),
        (
            ("--input", _write(tmp_path / "d.jsonl", _line(GOOD)), "--environment", "no-such-env"),
            "no environment named 'no-such-env'; known: arithmetic",
        ),
        (("--benchmark", "arithmetic", "--environment", "arithmeticc"), "arithmeticc"),
        (("--dataset", "no-such-dataset", "--environment", "arithmetic"), "no-such-dataset"),
        (("--benchmark", "arithmetic", "--backend", "fakee"), "backend 'fakee' is not one of"),
    ]:
        backend = () if "--backend" in args else ("--backend", "fake")
        code, _, err = await run_cli("run", *args, *backend, "-o", str(runs))
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and needle in errors[0], err
        assert "Traceback" not in err
        assert "mesh ready" not in err and "starting" not in err, err
        assert "Ray, Serve and vLLM output" not in err, err
    assert not runs.exists() or not any(runs.glob("rollmesh-run-*.log")), list(runs.iterdir())


async def test_a_row_that_cannot_be_judged_fails_its_rollout_not_scored_zero(tmp_path: Path) -> None:
    no_answer = {"responses_create_params": {"input": [{"role": "user", "content": "What is 1 + 1?"}]}}
    unicode = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "What is 2 + 2? ２＋２ 🎉 \u202e"}]
        },
        "expected_answer": "4",
    }
    path = _write(tmp_path / "d.jsonl", _line(GOOD) + _line(no_answer) + _line(unicode))
    code, out, err = await _run_input(tmp_path, path, "--json")
    assert code == 3, err
    result = json.loads(out)
    assert result["state"] == "COMPLETED_WITH_FAILURES"
    assert [(f["error_class"], f["count"]) for f in result["failure_summary"]] == [("BAD_TASK", 1)]
    rows = _rows(Path(result["paths"]["rollouts.jsonl"]))
    assert sorted(int(str(r["task_index"])) for r in rows) == [0, 2]  # no row for the task nobody can judge
    assert "Traceback" not in err


async def test_a_plugin_colliding_with_a_builtin_is_one_line_exit_2(tmp_path: Path) -> None:
    """An environment defined in two roots is unusable (ARTIFACT_COLLISION): the submit says so as
    a precondition (exit 2), not as "cannot reach the verifier" (UNAVAILABLE, exit 1)."""
    plugin = tmp_path / "root" / "environments" / "arithmetic"
    plugin.mkdir(parents=True)
    (plugin / "env.py").write_bytes(_BUILTIN_ARITHMETIC.read_bytes())
    code, _, err = await run_cli(
        "run", "--benchmark", "arithmetic", "--backend", "fake", "--limit", "2", "-n", "1",
        "-o", str(tmp_path / "runs"), env={"ROLLMESH_EXTRA_ROOTS": str(tmp_path / "root")},
    )  # fmt: skip
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert "FAILED_PRECONDITION" in errors[0] and "defined in 2 places" in errors[0], err
    assert "UNAVAILABLE" not in errors[0] and "Traceback" not in err
