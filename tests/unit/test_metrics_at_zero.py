"""Series an operator's queries and alerts need before anything happened: the scheduler's gauges
read 0 for every job state and every service a job can wait on (they vanished), its failure
counters exist at 0 for the known classes, sinks and acknowledgements; a live counter family is a
counter (`_total`); the latency buckets resolve sub-millisecond calls."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client import CollectorRegistry
from prometheus_client import Histogram

from rollmesh.mesh.metrics import LATENCY_BUCKETS
from rollmesh.mesh.metrics import LiveCollector
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.scheduler import telemetry as scheduler_telemetry
from rollmesh.scheduler.telemetry import JobNow
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier import telemetry as verifier_telemetry
from rollmesh.verifier.service import VerifierService
from rollmesh_client.v1 import scheduler_pb2


def by_name(jobs: list[JobNow]) -> dict[tuple[str, str], float]:
    return {
        (name, next(iter(labels.values()), "")): value
        for name, labels, value in scheduler_telemetry.samples(jobs)
    }


def test_with_no_job_every_scheduler_gauge_reads_zero() -> None:
    now = by_name([])
    states = {k.removeprefix("JOB_STATE_") for k in scheduler_pb2.JobState.keys()} - {"UNSPECIFIED"}
    assert {s for (n, s) in now if n == "rollmesh_scheduler_jobs"} == states
    assert {s for (n, s) in now if n == "rollmesh_scheduler_jobs_waiting"} == {"gateway", "verifier", "sink"}
    assert set(now.values()) == {0.0}
    assert now[("rollmesh_scheduler_rollouts_in_flight", "")] == 0.0
    assert now[("rollmesh_scheduler_concurrency_limit", "")] == 0.0


def test_jobs_add_up_and_the_waiting_label_is_service() -> None:
    jobs = [
        JobNow("RUNNING", True, in_flight=3, limit=8, waiting_on=("verifier", "sink")),
        JobNow("RUNNING", True, in_flight=2, limit=4, waiting_on=("verifier",)),
        JobNow("SUCCEEDED"),
    ]
    now = by_name(jobs)
    assert now[("rollmesh_scheduler_jobs", "RUNNING")] == 2
    assert now[("rollmesh_scheduler_jobs", "SUCCEEDED")] == 1
    assert now[("rollmesh_scheduler_jobs", "FAILED")] == 0
    assert now[("rollmesh_scheduler_rollouts_in_flight", "")] == 5
    assert now[("rollmesh_scheduler_concurrency_limit", "")] == 12
    assert now[("rollmesh_scheduler_jobs_waiting", "verifier")] == 2
    assert now[("rollmesh_scheduler_jobs_waiting", "sink")] == 1
    assert now[("rollmesh_scheduler_jobs_waiting", "gateway")] == 0
    labels = {k for _, labelled, _ in scheduler_telemetry.samples(jobs) for k in labelled}
    assert "on" not in labels  # a PromQL keyword


def test_failure_counters_exist_before_the_first_failure() -> None:
    def exists(name: str, **labels: str) -> bool:
        return REGISTRY.get_sample_value(name, labels) is not None

    for error_class in ("INTERNAL", "DEADLINE_EXCEEDED", "GATEWAY_UNRESPONSIVE", "ROLLOUT_TOO_LARGE"):
        assert exists("rollmesh_scheduler_rollouts_failed_total", error_class=error_class)
    assert exists("rollmesh_scheduler_rollouts_done_total", outcome="failed")
    for sink in ("jsonl", "grpc"):
        assert exists("rollmesh_scheduler_sink_writes_total", sink=sink, row="failure")
        assert exists("rollmesh_scheduler_sink_write_seconds_count", sink=sink)
    assert exists("rollmesh_scheduler_sink_acks_total", result="stale")
    assert exists("rollmesh_scheduler_groups_refilled_total", result="short")
    for result in ("ok", "timeout", "crashed", "unavailable"):
        assert exists("rollmesh_verifier_sandbox_runs_total", result=result)


def test_a_live_counter_family_is_exported_as_a_counter() -> None:
    now = verifier_telemetry.VerifierNow(
        sessions_open=0,
        loaded=(
            verifier_telemetry.EnvironmentNow(
                "e", up=True, server_restarts=2, calls_waiting=0, calls_running=0
            ),
        ),
        broken=(),
    )

    class Source:
        def state(self) -> verifier_telemetry.VerifierNow:
            return now

    collector = LiveCollector(
        verifier_telemetry.samples,
        verifier_telemetry._LIVE_DOCS,
        counters=frozenset({"rollmesh_verifier_environment_server_restarts"}),
        registry=CollectorRegistry(),
    )
    source = Source()
    collector.watch(source.state)
    families = {f.name: f for f in collector.collect()}
    restarts = families["rollmesh_verifier_environment_server_restarts"]
    assert restarts.type == "counter"
    assert [(s.name, s.value) for s in restarts.samples] == [
        ("rollmesh_verifier_environment_server_restarts_total", 2.0)
    ]
    assert families["rollmesh_verifier_environment_up"].type == "gauge"


def test_sub_millisecond_calls_land_in_their_own_buckets() -> None:
    registry = CollectorRegistry()
    h = Histogram("probe_seconds", "a probe", buckets=LATENCY_BUCKETS, registry=registry)
    for seconds in (0.00008, 0.0002, 0.0004, 0.0004):
        h.observe(seconds)
    bucket = {
        b: registry.get_sample_value("probe_seconds_bucket", {"le": b})
        for b in ("0.0001", "0.00025", "0.0005", "0.001")
    }
    assert bucket == {"0.0001": 1.0, "0.00025": 2.0, "0.0005": 4.0, "0.001": 4.0}


async def test_each_environment_counts_its_verifies_and_tool_calls_from_zero(tmp_path: Path) -> None:
    """Once the verifier has started an environment, its verify and tool-call counters (the common
    outcomes) and its verify-time histogram exist at 0: a rule's rate() or ratio over them reads 0,
    not an absent series, before the first call."""
    name = f"zero_{uuid.uuid4().hex[:8]}"  # a name no other test of this process counted under
    folder = tmp_path / "environments" / name
    shutil.copytree(BUILTIN_ROOT / "environments" / "session_state", folder)
    roots = RootsConfig(tmp_path, (), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    for outcome in verifier_telemetry.VERIFY_OUTCOMES:
        assert (
            REGISTRY.get_sample_value(
                "rollmesh_verifier_verifies_total", {"environment": name, "outcome": outcome}
            )
            is None
        )
    await svc.start()
    try:
        for outcome in verifier_telemetry.VERIFY_OUTCOMES:
            labels = {"environment": name, "outcome": outcome}
            assert REGISTRY.get_sample_value("rollmesh_verifier_verifies_total", labels) == 0.0, outcome
        for outcome in verifier_telemetry.TOOL_OUTCOMES:
            labels = {"environment": name, "outcome": outcome}
            assert REGISTRY.get_sample_value("rollmesh_verifier_tool_calls_total", labels) == 0.0, outcome
        count = REGISTRY.get_sample_value("rollmesh_verifier_verify_seconds_count", {"environment": name})
        assert count == 0.0
    finally:
        await svc.aclose()
