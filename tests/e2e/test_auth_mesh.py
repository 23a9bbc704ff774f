"""With `ROLLMESH_API_KEY` set, as an operator runs it: `rollmesh up` (separate processes) and the
embedded `rollmesh run` both finish a whole job with no failed rollout; `rollmesh status` and
grpcurl with `-H 'authorization: Bearer ...'` work, and grpcurl without the header is refused
(except `list`, served by reflection)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import rollmesh_up
from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block
from tests.e2e.readme_blocks import run_block
from tests.procs import ROLLMESH
from tests.procs import grpcurl
from tests.procs import run_cli

KEY = "e2e-s3cret"
BEARER = f"authorization: Bearer {KEY}"


@pytest.fixture(scope="module")
def keyed_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with rollmesh_up(tmp_path_factory.mktemp("up-auth"), {"ROLLMESH_API_KEY": KEY}) as addresses:
        yield addresses


def _env(addrs: dict[str, str], key: str | None) -> dict[str, str]:
    env = {f"ROLLMESH_{k.upper()}_ADDR": v for k, v in addrs.items()}
    env["ROLLMESH_API_KEY"] = key or ""
    return env


async def test_a_whole_job_through_rollmesh_up_with_a_key(keyed_mesh: dict[str, str]) -> None:
    args = ("jobs", "submit", "--benchmark", "arithmetic", "--limit", "4", "--num-repeats", "2")
    code, out, err = await run_cli(*args, "--wait", "--json", env=_env(keyed_mesh, KEY))
    assert code == 0, err
    job = json.loads(out)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job
    assert int(job["progress"]["succeeded"]) == 8 and int(job["progress"].get("failed", 0)) == 0, job

    code, out, err = await run_cli("status", "--json", env=_env(keyed_mesh, KEY))
    assert code == 0, err
    assert {r["health"] for r in json.loads(out)} == {"SERVING"}

    code, _, err = await run_cli(*args, env=_env(keyed_mesh, "wrong"))
    assert code != 0 and "UNAUTHENTICATED" in err.upper()


def test_grpcurl_with_the_bearer_header(keyed_mesh: dict[str, str]) -> None:
    verifier, gateway = keyed_mesh["verifier"], keyed_mesh["gateway"]
    listed = grpcurl("-plaintext", verifier, "list")  # reflection: no key needed
    assert listed.returncode == 0 and "rollmesh.v1.EnvironmentVerifier" in listed.stdout.split()

    method = "rollmesh.v1.EnvironmentVerifier/ListEnvironments"
    ok = grpcurl("-plaintext", "-H", BEARER, "-d", "{}", verifier, method)
    assert ok.returncode == 0, ok.stderr
    assert "arithmetic" in {e["name"] for e in json.loads(ok.stdout)["environments"]}
    denied = grpcurl("-plaintext", "-d", "{}", verifier, method)
    assert denied.returncode != 0 and "Unauthenticated" in denied.stderr

    item = {"id": "a", "request": {"messages": [{"role": "user", "content": "What is 2 + 3?"}]}}
    many = "rollmesh.v1.ModelGateway/GenerateMany"
    streamed = grpcurl("-plaintext", "-H", BEARER, "-d", json.dumps(item), gateway, many)
    assert streamed.returncode == 0, streamed.stderr
    answer = json.loads(streamed.stdout)
    assert answer["id"] == "a" and answer["response"]["output_token_ids"]
    denied = grpcurl("-plaintext", "-d", json.dumps(item), gateway, many)
    assert denied.returncode != 0 and "Unauthenticated" in denied.stderr


def test_the_readme_keyed_grpcurl_block_runs_as_written(keyed_mesh: dict[str, str], tmp_path: Path) -> None:
    script = bash_block("With `ROLLMESH_API_KEY` set on the servers", DOCS / "grpcurl.md")
    assert "$ROLLMESH_API_KEY" in script
    done = run_block(script, keyed_mesh, tmp_path, env={"ROLLMESH_API_KEY": KEY})
    assert done.returncode == 0, done.stderr[-4000:]
    assert '"name": "arithmetic"' in done.stdout and '"id": "a"' in done.stdout
    without = run_block(script, keyed_mesh, tmp_path, env={"ROLLMESH_API_KEY": "wrong"})
    assert without.returncode != 0 and "Unauthenticated" in without.stderr


def test_embedded_run_with_a_key(tmp_path: Path) -> None:
    args = [str(ROLLMESH), "run", "--benchmark", "arithmetic", "--backend", "fake", "--limit", "5", "--json"]
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "ROLLMESH_API_KEY": KEY},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["state"] == "SUCCEEDED", result
    rows = Path(result["paths"]["rollouts.jsonl"]).read_text().splitlines()
    failures = Path(result["paths"]["failures.jsonl"])
    assert len(rows) == 5 * 8  # the benchmark's default repeats
    assert not failures.exists() or not failures.read_text().strip()
