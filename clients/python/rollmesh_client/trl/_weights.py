"""The trainer's weights to every replica of the served model: save (or stream) a checkpoint and
`UpdateWeights`, labelled with the trainer's step as the policy version."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from rollmesh_client._client import Client
from rollmesh_client._gateway import InFlight


@dataclass
class WeightPush:
    """One UpdateWeights: the version it labelled, how long saving and the call took."""

    version: int
    checkpoint: str
    save_s: float
    update_s: float
    paused_s: float
    retried: int


@dataclass
class WeightPusher:
    """Saves `model` (a transformers PreTrainedModel; its tokenizer too, so the gateway checks the
    vocabulary) under `directory/step-NNNNNN` and asks the gateway to serve it. `upload`: stream the
    files in the call (a gateway that shares no filesystem with the trainer). The last `keep`
    checkpoints stay on disk: the served one must, since a replica Serve starts later loads it."""

    directory: Path
    model_name: str = ""
    in_flight: InFlight = "finish"
    upload: bool = False
    keep: int = 2
    pushes: list[WeightPush] = field(default_factory=list)

    @property
    def version(self) -> int | None:
        return self.pushes[-1].version if self.pushes else None

    def save(self, model: Any, tokenizer: Any, version: int) -> tuple[Path, float]:
        """Blocking: write the checkpoint (call it off the event loop)."""
        t0 = time.monotonic()
        out = self.directory / f"step-{version:06d}"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        model.save_pretrained(str(out), safe_serialization=True)
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(str(out))
        return out, time.monotonic() - t0

    async def push(self, client: Client, checkpoint: Path, version: int, save_s: float) -> WeightPush:
        t0 = time.monotonic()
        options: dict[str, Any] = {
            "model": self.model_name,
            "policy_version": str(version),
            "in_flight": self.in_flight,
        }
        if self.upload:
            resp = await client.gateway.update_weights_from_folder(checkpoint, **options)
        else:
            resp = await client.gateway.update_weights(checkpoint, **options)
        if resp.policy_version != str(version):  # the label later turns carry: the trainer's step
            raise RuntimeError(
                f"the gateway serves policy version {resp.policy_version!r} after loading {checkpoint}, "
                f"not {version}"
            )
        push = WeightPush(
            version=version,
            checkpoint=str(checkpoint),
            save_s=save_s,
            update_s=time.monotonic() - t0,
            paused_s=float(resp.paused_s),
            retried=int(resp.retried_requests),
        )
        self.pushes.append(push)
        self._prune()
        return push

    def _prune(self) -> None:
        kept = {Path(p.checkpoint) for p in self.pushes[-self.keep :]}
        for old in self.pushes[: -self.keep]:
            path = Path(old.checkpoint)
            if path not in kept and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
