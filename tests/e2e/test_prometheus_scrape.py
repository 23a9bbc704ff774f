"""A real Prometheus server (Debian's `prometheus` package) scrapes `rollmesh up --metrics` every
second while a job runs, and is asked over its HTTP API what it saw: the scheduler's rollouts done
equal the job's count, every service answered gRPC calls by method, the shipped rules
(deploy/prometheus/rollmesh.rules.yml) load and record, and no label of any rollmesh series has
unbounded values (checked on the full series list)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import rollmesh_up
from tests.procs import ROLLMESH

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="Debian's prometheus server is not installed (apt-get install prometheus; .ci/run installs it)",
)

SERVICES = {
    "registry": "rollmesh.v1.ArtifactRegistry",
    "verifier": "rollmesh.v1.EnvironmentVerifier",
    "gateway": "rollmesh.v1.ModelGateway",
    "scheduler": "rollmesh.v1.RolloutScheduler",
}
# The call each service answered for the job (the CLI's listing, its submission, the job's
# generations and verifications): all four seen is every service seen answering.
JOB_CALLS = {
    "registry": "ListArtifacts",
    "verifier": "VerifyBatch",
    "gateway": "GenerateMany",
    "scheduler": "SubmitJob",
}
# Labels that would grow with the work done, never allowed on a rollmesh series.
UNBOUNDED_NAMES = {"job_id", "key", "rollout", "rollout_key", "session_id", "request_id", "task_index"}
MAX_VALUES_PER_LABEL = 40  # the largest bounded set here: histogram buckets (21) and methods per service


def _listening_port(pid: int) -> int | None:
    """The TCP port `pid` listens on (Prometheus binds port 0 and does not say which it got)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # state LISTEN, owned by pid
            return int(fields[1].rpartition(":")[2], 16)
    return None


def _get(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]


def _ready(base: str) -> bool:
    """Prometheus answers /-/ready with 200 once its storage is open; before that it listens but
    answers 503 (its queries too)."""
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=30) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError as exc:
        if exc.code == 503:
            return False
        raise


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = _get(base, "/api/v1/query", query=promql)["result"]
    return result


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """`rollmesh up --metrics` and a Prometheus scraping its four endpoints every second; yields
    (Prometheus's base URL, up's addresses)."""
    assert PROMETHEUS is not None
    with rollmesh_up(tmp_path, args=["--metrics"]) as up:
        targets = [f'"{up["metrics"][s]}"' for s in SERVICES]
        config = tmp_path / "prometheus.yml"
        rules = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rollmesh.rules.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{json.dumps(str(rules))}]\n"
            "scrape_configs:\n"
            f"  - job_name: rollmesh\n    static_configs: [{{targets: [{', '.join(targets)}]}}]\n"
        )
        log = tmp_path / "prometheus.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    "--web.listen-address=127.0.0.1:0",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 60
            base = ""
            while not base:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, f"prometheus did not listen:\n{log.read_text()}"
                port = _listening_port(proc.pid)
                if port:
                    base = f"http://127.0.0.1:{port}"
                else:
                    time.sleep(0.2)
            while not _ready(base):  # listening is not ready: a query then is a 503
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, f"prometheus not ready:\n{log.read_text()}"
                time.sleep(0.2)
            while len(_query(base, 'up{job="rollmesh"} == 1')) < len(SERVICES):  # every target scraped
                assert time.monotonic() < deadline, f"targets not up:\n{log.read_text()}"
                time.sleep(0.5)
            yield base, up
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _cli(*args: str, up: dict[str, Any]) -> str:
    env = {**os.environ, **{f"ROLLMESH_{s.upper()}_ADDR": up[s] for s in SERVICES}}
    done = subprocess.run([str(ROLLMESH), *args], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _targets(base: str) -> str:
    """Each target's health and last scrape error, as Prometheus reports them (for a failure's message)."""
    active = _get(base, "/api/v1/targets")["activeTargets"]
    return ", ".join(f"{t['scrapeUrl']} {t['health']} {t['lastError']!r}" for t in active)


def _calls_missing(base: str, total: int) -> str | None:
    """What the latest scrapes do not yet show of the job's calls (None once they show it all): each
    service's JOB_CALLS method handled, SubmitJob once, and the verifier served `total` verify items."""
    by_method = _query(base, "sum by (grpc_service, grpc_method) (grpc_server_handled_total)")
    calls: dict[str, dict[str, float]] = defaultdict(dict)
    for r in by_method:
        calls[r["metric"]["grpc_service"]][r["metric"]["grpc_method"]] = float(r["value"][1])
    for service, method in JOB_CALLS.items():
        if calls[SERVICES[service]].get(method, 0) < 1:
            return f"no {SERVICES[service]}/{method} handled yet: {dict(calls)}"
    assert calls[SERVICES["scheduler"]]["SubmitJob"] == 1, dict(calls)
    items = _query(base, 'sum by (item) (rollmesh_stream_items_total{code="OK"})')
    verified = {r["metric"]["item"]: float(r["value"][1]) for r in items}.get("verify", 0.0)
    assert verified <= total, (verified, total)
    return None if verified == total else f"{verified} verify items of {total}"


def test_prometheus_sees_the_job_and_every_service(prometheus: tuple[str, dict[str, Any]]) -> None:
    base, up = prometheus
    _cli("artifacts", "list", "--kind", "dataset", "--json", up=up)
    out = _cli(
        "jobs", "submit", "--benchmark", "arithmetic", "--limit", "25", "--num-repeats", "4", "--wait",
        "--json", up=up,
    )  # fmt: skip
    job = json.loads(out)
    assert job["state"] == "JOB_STATE_SUCCEEDED"
    total = int(job["progress"]["total"])

    # Each target is scraped on its own clock, and a scrape that misses its 1 s timeout (a service
    # busy on a loaded machine) marks that target's series stale until the next one succeeds: so
    # every figure is awaited until the scrapes after the job's end show it, never read once.
    deadline = time.monotonic() + 60
    done = 0.0
    while done != total:  # the last scrape after the job's end
        assert done < total, f"Prometheus saw {done} rollouts done of {total}"
        assert time.monotonic() < deadline, (
            f"Prometheus saw {done} rollouts done of {total}; {_targets(base)}"
        )
        time.sleep(0.5)
        result = _query(base, 'sum(rollmesh_scheduler_rollouts_done_total{job="rollmesh"})')
        done = float(result[0]["value"][1]) if result else 0.0
    failed = _query(base, 'sum(rollmesh_scheduler_rollouts_done_total{outcome="failed"})')
    assert not failed or float(failed[0]["value"][1]) == 0

    while (missing := _calls_missing(base, total)) is not None:
        assert time.monotonic() < deadline, f"{missing}; {_targets(base)}"
        time.sleep(0.5)

    # The shipped rules load and evaluate: every rule healthy, the rollout rate recorded, the
    # scheduler's verify calls timed, and no alert about the environment or the services firing.
    groups = _get(base, "/api/v1/rules")["groups"]
    assert {g["name"] for g in groups} == {"rollmesh-recording", "rollmesh-alerts"}
    assert all(r["health"] == "ok" for g in groups for r in g["rules"]), groups
    deadline = time.monotonic() + 60
    while not _query(base, 'rollmesh:rollouts_done:rate1m{outcome="succeeded"} > 0'):
        assert time.monotonic() < deadline, "rollmesh:rollouts_done:rate1m never recorded"
        time.sleep(0.5)
    verify_p95 = _query(base, 'rollmesh:scheduler_call_seconds:p95_5m{service="verifier", method="Verify"}')
    assert verify_p95 and 0 < float(verify_p95[0]["value"][1]) < 60, verify_p95
    firing = _query(base, 'ALERTS{alertname=~"RollmeshEnvironmentDown|RollmeshServiceUnreachable"}')
    assert not firing, firing

    series = _get(base, "/api/v1/series", **{"match[]": '{job="rollmesh"}'})
    values: dict[str, set[str]] = defaultdict(set)
    for labels in series:
        for name, value in labels.items():
            if name not in ("__name__", "job"):
                values[name].add(value)
    assert not UNBOUNDED_NAMES & set(values), sorted(values)
    too_many = {name: len(v) for name, v in values.items() if len(v) > MAX_VALUES_PER_LABEL}
    assert not too_many, too_many
    assert not any(job["job_id"] in v for vs in values.values() for v in vs)
    assert len(values["instance"]) == len(SERVICES)
