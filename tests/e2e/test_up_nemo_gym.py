"""`rollmesh up` with a managed NeMo Gym environment in its working directory's root, an API key on
every service: the verifier starts NeMo Gym's own example_session_state_mgmt server (the NeMo Gym
0.4.0 virtualenv) and lists it like any environment (`rollmesh status`, `rollmesh envs show` with
the server's tool routes), a job of the server's example rows runs through it, and the server stops
with the mesh."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from tests.e2e.conftest import managed_counter
from tests.e2e.conftest import rollmesh_up
from tests.procs import run_cli

KEY = "up-bridge-key"


async def test_up_serves_a_managed_nemo_gym_server_and_stops_it(
    tmp_path: Path, nemo_gym_python: Path, nemo_gym_servers: Path
) -> None:
    rows = managed_counter(tmp_path, nemo_gym_python, nemo_gym_servers)
    logs = tmp_path / "sidecars"
    env = {"ROLLMESH_API_KEY": KEY, "ROLLMESH_SIDECAR_LOG_DIR": str(logs)}
    with rollmesh_up(tmp_path, env) as addrs:
        cli_env = {**env, **{f"ROLLMESH_{k.upper()}_ADDR": v for k, v in addrs.items() if isinstance(v, str)}}
        code, out, err = await run_cli("status", "--json", env=cli_env)
        assert code == 0, err
        verifier = next(r for r in json.loads(out) if r["service"] == "verifier")
        assert verifier["health"] == "SERVING" and "broken" not in verifier["detail"], verifier
        code, out, err = await run_cli("envs", "list", "--json", env=cli_env)
        assert code == 0, err
        (listed,) = [e for e in json.loads(out)["environments"] if e["name"] == "ng_counter"]
        assert listed["sandbox"] == ("uid+mount+pid" if os.geteuid() == 0 else "limits")  # what held
        code, out, err = await run_cli("envs", "show", "ng_counter", "--json", env=cli_env)
        assert code == 0, err
        assert {t["name"] for t in json.loads(out)["tools"]} == {"increment_counter", "get_counter_value"}
        args = ["jobs", "submit", "-e", "ng_counter", "-d", str(rows), "--max-steps", "4", "--wait", "--json"]
        code, out, err = await run_cli(*args, env=cli_env, timeout_s=300)
        assert code == 0, err
        job = json.loads(out)
        assert job["state"] == "JOB_STATE_SUCCEEDED" and job["progress"]["succeeded"] == 5, job
        done = [json.loads(ln) for ln in (Path(job["output_path"]) / "rollouts.jsonl").open()]
        # up's fake model echoes the prompt and calls no tool: the server's verify finds the counter
        # still at its initial count, never the expected one
        assert len(done) == 5 and all(r["reward"] == 0.0 for r in done)
        (addr_file,) = logs.glob("*.addr")
        host, _, port = addr_file.read_text().strip().rpartition(":")
        with socket.create_connection((host, int(port)), timeout=5):
            pass  # the managed server is up while the mesh is
    with socket.socket() as probe:  # up stopped: so did the server it started
        assert probe.connect_ex((host, int(port))) != 0
