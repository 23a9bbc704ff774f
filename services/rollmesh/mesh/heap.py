"""The garbage collector of a serving process: the start-up heap leaves its sight, and young
collections run rarely.

`freeze_startup_heap()`: one full collection, then `gc.freeze()` moves every object still alive
(imported modules, torch/transformers/Ray state, tokenizers, protos: ~460k objects in the embedded
mesh) to the permanent generation. Later collections then scan only what requests allocate. Without
it each full (generation 2) collection rescans the whole start-up heap: measured in the embedded
mesh running the short-answers job, 1.0 s of 6.4 s CPU for 3,200 rollouts went to 2 such
collections (0.06 s after freezing). Ray Serve does the same in its replicas
(RAY_SERVE_FREEZE_GC_ON_STARTUP). Frozen objects are never freed, so call it once, after start-up
and before the request path runs: a cycle built at start-up and dropped later stays in memory.
Returns the number of objects frozen.

`raise_gc_threshold()`: a young collection every 50,000 net allocations instead of CPython's 700
(`SERVING_GC_THRESHOLD`), so the objects of the thousands of calls in flight are not scanned,
promoted and scanned again many times a second. Cyclic garbage is still collected, only later: the
memory it holds meanwhile is bounded by the threshold. Measured on the HTTP model path at 512
rollouts in flight (bench/http_model_path.py, service processes): with CPython's settings the
collector took ~30% of the scheduler's CPU and ~14% of the gateway's, ~3% with this threshold.
`mesh.aio.run_server` sets it in every service process, and the embedded mesh (launch/embedded.py)
in the process it serves from.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


SERVING_GC_THRESHOLD = (50_000, 50, 100)


def raise_gc_threshold() -> None:
    gc.set_threshold(*SERVING_GC_THRESHOLD)
