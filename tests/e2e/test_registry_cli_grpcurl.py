"""The registry as users meet it: `rollmesh serve registry` in a subprocess, the CLI, real grpcurl."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import ROLLMESH
from tests.procs import ServerProc
from tests.procs import grpcurl
from tests.procs import run_cli
from tests.procs import spawn_server


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProc, Path]]:
    base = tmp_path_factory.mktemp("roots")
    extra = base / "extra"
    (extra / "datasets").mkdir(parents=True)
    (extra / "datasets" / "mine.jsonl").write_text('{"expected_answer": "1"}\n')
    # `probe` is in the working directory and in the extra root: a collision.
    for root in (base, extra):
        (root / "environments" / "probe").mkdir(parents=True)
        (root / "environments" / "probe" / "env.py").write_text("# shadow\n")
    env = {"ROLLMESH_EXTRA_ROOTS": str(extra)}
    with spawn_server([str(ROLLMESH), "serve", "registry", "--port", "0"], env=env, cwd=base) as server:
        yield server, extra


def test_grpcurl_list_and_describe(registry: tuple[ServerProc, Path]) -> None:
    server, _ = registry
    listed = grpcurl("-plaintext", server.address, "list")
    assert listed.returncode == 0, listed.stderr
    services = listed.stdout.split()
    assert "rollmesh.v1.ArtifactRegistry" in services and "grpc.health.v1.Health" in services
    described = grpcurl("-plaintext", server.address, "describe", "rollmesh.v1.ArtifactRegistry")
    assert described.returncode == 0, described.stderr
    assert "rpc ResolveArtifact ( .rollmesh.v1.ResolveArtifactRequest )" in described.stdout
    # A method by its full name (protobuf's pool alone does not find methods: "Symbol not found").
    method = grpcurl("-plaintext", server.address, "describe", "rollmesh.v1.ArtifactRegistry.ResolveArtifact")
    assert method.returncode == 0, method.stderr
    assert "rollmesh.v1.ArtifactRegistry.ResolveArtifact is a method:" in method.stdout
    assert "rpc ResolveArtifact ( .rollmesh.v1.ResolveArtifactRequest )" in method.stdout
    missing = grpcurl("-plaintext", server.address, "describe", "rollmesh.v1.ArtifactRegistry.NoSuchRpc")
    assert missing.returncode != 0 and "Symbol not found" in missing.stderr


def test_grpcurl_resolve_returns_json(registry: tuple[ServerProc, Path]) -> None:
    server, extra = registry
    body = json.dumps({"kind": "ARTIFACT_KIND_DATASET", "name": "mine"})
    res = grpcurl("-plaintext", "-d", body, server.address, "rollmesh.v1.ArtifactRegistry/ResolveArtifact")
    assert res.returncode == 0, res.stderr
    artifact = json.loads(res.stdout)["artifact"]
    assert artifact["path"] == str((extra / "datasets" / "mine.jsonl").resolve())
    assert len(artifact["sha256"]) == 64


def test_grpcurl_collision_shows_error_details(registry: tuple[ServerProc, Path]) -> None:
    server, extra = registry
    body = json.dumps({"kind": "ARTIFACT_KIND_ENVIRONMENT", "name": "probe"})
    res = grpcurl(
        "-plaintext",
        "-format-error",
        "-d",
        body,
        server.address,
        "rollmesh.v1.ArtifactRegistry/ResolveArtifact",
    )
    assert res.returncode != 0
    error = json.loads(res.stderr)  # -format-error prints the status as JSON on stderr
    assert error["code"] == 9
    info = error["details"][0]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert info["reason"] == "ARTIFACT_COLLISION"
    assert str((extra / "environments" / "probe").resolve()) in info["metadata"].values()


async def test_cli_artifacts_list_resolve_and_user_errors(registry: tuple[ServerProc, Path]) -> None:
    server, _ = registry
    env = {"ROLLMESH_REGISTRY_ADDR": server.address}
    code, out, err = await run_cli("artifacts", "list", "--kind", "dataset", "--json", env=env)
    assert code == 0, err
    assert "mine" in [a["name"] for a in json.loads(out)]
    code, out, _ = await run_cli("artifacts", "resolve", "dataset", "mine", "--json", env=env)
    assert code == 0 and json.loads(out)["name"] == "mine"
    code, out, err = await run_cli("artifacts", "resolve", "dataset", "../x", env=env)
    assert code == 2 and "Traceback" not in err and "path separator" in err
    code, _, err = await run_cli("artifacts", "resolve", "environment", "probe", env=env)
    assert code == 2 and "ARTIFACT_COLLISION" in err
    code, _, err = await run_cli("artifacts", "list", "--kind", "weights", env=env)
    assert code == 2 and "unknown artifact kind" in err
    code, _, err = await run_cli(
        "artifacts", "list", env={"ROLLMESH_REGISTRY_ADDR": "127.0.0.1:1"}, timeout_s=90
    )
    assert code == 1 and "UNAVAILABLE" in err and "Traceback" not in err
