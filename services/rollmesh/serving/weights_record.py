"""Which weights the replicas of one Serve application must serve: a record in Ray's GCS key-value store.

Contract (the record is what makes a replica Serve starts later, after a crash, a failed health check
or a scale-up, serve the CURRENT weights, not the deployment's original `model_path`):
  - Key `weights/<app_name>` in namespace `rollmesh`, value a JSON `WeightsRecord`: `current` (the
    weights every replica serves) and, while an update runs, `pending` (the weights being loaded).
    Each is a `WeightsRef`: a unique `weights_id` per load, the checkpoint folder, the policy version.
  - The backend writes the initial record (the deployment's `model_path`, id `INITIAL_WEIGHTS_ID`)
    before it deploys, so a record left behind by an earlier application of that name never applies;
    it writes `pending` before loading a checkpoint into the live replicas, then `current` = the new
    weights once every replica loaded them, or the previous record when it rolled back; it deletes
    the record with the application.
  - A replica starting (`ReplicaWeights.startup`) waits, bounded, while an update is pending, then
    loads `current` before its constructor returns, so Serve sends it no traffic before that.
  - A replica's health check (`ReplicaWeights.check`) fails while it serves weights that are neither
    `current` nor `pending`: Serve then replaces it, and the replacement loads `current`.
  - Every chunk a replica streams names its `weights_id`; the backend refuses a response from a
    replica whose weights are not the record's `current` (serving/backend.py), so a replica never
    serves other weights silently, even in the moment before its health check fails.
The record lives in the GCS of the Ray cluster: every node of a joined cluster reads the same one,
and it goes away with a local Ray. Reads and writes block (a GCS round trip): async code calls them
through `asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import replace

from rollmesh.mesh.logging import get_logger
from rollmesh.serving.errors import WeightsDrift

log = get_logger(__name__)

INITIAL_WEIGHTS_ID = "initial"
_NAMESPACE = "rollmesh"
_PENDING_POLL_S = 0.5


@dataclass(frozen=True)
class WeightsRef:
    weights_id: str
    weights_path: str
    policy_version: str = ""


@dataclass(frozen=True)
class WeightsRecord:
    current: WeightsRef
    pending: WeightsRef | None = None

    @classmethod
    def initial(cls, model_path: str) -> WeightsRecord:
        return cls(WeightsRef(INITIAL_WEIGHTS_ID, model_path))

    def accepts(self, weights_id: str) -> bool:
        """True when a replica serving `weights_id` is where this record says it may be."""
        return weights_id == self.current.weights_id or (
            self.pending is not None and weights_id == self.pending.weights_id
        )

    def with_pending(self, ref: WeightsRef) -> WeightsRecord:
        return replace(self, pending=ref)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str | bytes) -> WeightsRecord:
        data = json.loads(raw)
        pending = data.get("pending")
        return cls(WeightsRef(**data["current"]), WeightsRef(**pending) if pending else None)


def _key(app_name: str) -> str:
    return f"weights/{app_name}"


def read_record(app_name: str) -> WeightsRecord | None:
    """The record of `app_name` (None when there is none). Blocking; needs a connected Ray."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(_key(app_name), namespace=_NAMESPACE)
    return WeightsRecord.from_json(raw) if raw else None


def write_record(app_name: str, record: WeightsRecord) -> None:
    """Replace the record of `app_name`. Blocking; needs a connected Ray."""
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(_key(app_name), record.to_json(), overwrite=True, namespace=_NAMESPACE)
    log.info(
        "weights_record_written",
        app=app_name,
        current=record.current.weights_id,
        pending=record.pending.weights_id if record.pending else "",
    )


def delete_record(app_name: str) -> None:
    from ray.experimental.internal_kv import _internal_kv_del

    _internal_kv_del(_key(app_name), namespace=_NAMESPACE)


class ReplicaWeights:
    """The replica side of the record: what this replica serves, and the start-up and health rules.
    `load` is the replica's own loader: `await load(ref)` puts `ref`'s weights into its engine."""

    def __init__(self, app_name: str, model_path: str, load: Callable[[WeightsRef], Awaitable[None]]) -> None:
        self.app_name = app_name
        self.serving = WeightsRef(INITIAL_WEIGHTS_ID, model_path)
        self._load = load

    async def startup(self, *, pending_timeout_s: float) -> None:
        """Before the replica takes traffic: load the record's `current` weights unless it already
        serves them, after waiting (at most `pending_timeout_s`) for a pending update to settle."""
        deadline = time.monotonic() + pending_timeout_s
        record = await asyncio.to_thread(read_record, self.app_name)
        while record is not None and record.pending is not None and time.monotonic() < deadline:
            await asyncio.sleep(_PENDING_POLL_S)
            record = await asyncio.to_thread(read_record, self.app_name)
        if record is None or record.current.weights_id == self.serving.weights_id:
            return
        await self.loaded(record.current)
        log.info(
            "replica_started_on_current_weights",
            app=self.app_name,
            weights_id=record.current.weights_id,
            weights_path=record.current.weights_path,
            policy_version=record.current.policy_version,
        )

    async def loaded(self, ref: WeightsRef) -> None:
        """Load `ref` with the replica's loader, then serve it."""
        await self._load(ref)
        self.serving = ref

    async def check(self) -> None:
        """Raise `WeightsDrift` when the record allows neither these weights nor a pending update.
        A record that cannot be read (a GCS hiccup) fails nothing: the engine itself is fine, and
        the backend's per-response check still guards every answer."""
        try:
            record = await asyncio.to_thread(read_record, self.app_name)
        except Exception as exc:
            log.warning("weights_record_unreadable", app=self.app_name, error=repr(exc)[:300])
            return
        if record is not None and not record.accepts(self.serving.weights_id):
            raise WeightsDrift(
                f"this replica serves weights {self.serving.weights_id} ({self.serving.weights_path}); "
                f"the application serves {record.current.weights_id} ({record.current.weights_path})"
            )
