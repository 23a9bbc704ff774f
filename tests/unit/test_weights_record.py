"""serving/weights_record.py without Ray: the record's rules (which weights a replica may serve, what
a starting replica loads, when its health check fails), with the GCS read replaced by a dict."""

from __future__ import annotations

import asyncio

import pytest

from rollmesh.serving import weights_record
from rollmesh.serving.errors import WeightsDrift
from rollmesh.serving.weights_record import INITIAL_WEIGHTS_ID
from rollmesh.serving.weights_record import ReplicaWeights
from rollmesh.serving.weights_record import WeightsRecord
from rollmesh.serving.weights_record import WeightsRef

APP = "app-1"
NEW = WeightsRef("w2", "/ckpt/step-2", "2")


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> dict[str, WeightsRecord]:
    records: dict[str, WeightsRecord] = {}
    monkeypatch.setattr(weights_record, "read_record", records.get)
    return records


class Loads:
    def __init__(self) -> None:
        self.refs: list[WeightsRef] = []

    async def __call__(self, ref: WeightsRef) -> None:
        self.refs.append(ref)


def test_record_round_trips_through_json() -> None:
    record = WeightsRecord.initial("/models/tiny").with_pending(NEW)
    assert WeightsRecord.from_json(record.to_json()) == record
    assert WeightsRecord.from_json(WeightsRecord(NEW).to_json()).pending is None


def test_a_record_accepts_current_and_pending_weights_only() -> None:
    record = WeightsRecord.initial("/models/tiny")
    assert record.accepts(INITIAL_WEIGHTS_ID) and not record.accepts("w2")
    updating = record.with_pending(NEW)
    assert updating.accepts(INITIAL_WEIGHTS_ID) and updating.accepts("w2") and not updating.accepts("w3")


async def test_a_replica_starting_after_an_update_loads_the_current_weights(
    store: dict[str, WeightsRecord],
) -> None:
    store[APP] = WeightsRecord(NEW)
    loads = Loads()
    replica = ReplicaWeights(APP, "/models/tiny", loads)
    await replica.startup(pending_timeout_s=5)
    assert loads.refs == [NEW] and replica.serving == NEW
    await replica.check()


async def test_a_replica_of_a_fresh_application_loads_nothing(store: dict[str, WeightsRecord]) -> None:
    loads = Loads()
    replica = ReplicaWeights(APP, "/models/tiny", loads)
    await replica.startup(pending_timeout_s=5)  # no record at all
    store[APP] = WeightsRecord.initial("/models/tiny")
    await replica.startup(pending_timeout_s=5)
    assert loads.refs == [] and replica.serving.weights_id == INITIAL_WEIGHTS_ID


async def test_a_starting_replica_waits_for_a_pending_update_to_settle(
    store: dict[str, WeightsRecord],
) -> None:
    store[APP] = WeightsRecord.initial("/models/tiny").with_pending(NEW)
    loads = Loads()
    replica = ReplicaWeights(APP, "/models/tiny", loads)
    starting = asyncio.create_task(replica.startup(pending_timeout_s=60))
    await asyncio.sleep(0.2)
    assert not starting.done() and loads.refs == []
    store[APP] = WeightsRecord(NEW)  # the update committed
    await asyncio.wait_for(starting, 30)
    assert loads.refs == [NEW]


async def test_health_fails_for_weights_the_application_no_longer_serves(
    store: dict[str, WeightsRecord],
) -> None:
    store[APP] = WeightsRecord.initial("/models/tiny")
    replica = ReplicaWeights(APP, "/models/tiny", Loads())
    await replica.check()
    store[APP] = store[APP].with_pending(NEW)  # an update is loading: both are fine meanwhile
    await replica.check()
    await replica.loaded(NEW)
    await replica.check()
    store[APP] = WeightsRecord.initial("/models/tiny")  # rolled back, but this replica kept NEW
    with pytest.raises(WeightsDrift, match="serves weights w2"):
        await replica.check()


async def test_an_unreadable_record_fails_no_health_check(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(app_name: str) -> WeightsRecord | None:
        raise ConnectionError("GCS unreachable")

    monkeypatch.setattr(weights_record, "read_record", unreachable)
    await ReplicaWeights(APP, "/models/tiny", Loads()).check()
