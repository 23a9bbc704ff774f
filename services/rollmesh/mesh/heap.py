"""The start-up heap leaves the garbage collector's sight once a process serves.

`freeze_startup_heap()`: one full collection, then `gc.freeze()` moves every object still alive
(imported modules, torch/transformers/Ray state, tokenizers, protos: ~460k objects in the embedded
mesh) to the permanent generation. Later collections then scan only what requests allocate. Without
it each full (generation 2) collection rescans the whole start-up heap: measured in the embedded
mesh running the short-answers job, 1.0 s of 6.4 s CPU for 3,200 rollouts went to 2 such
collections (0.06 s after freezing). Ray Serve does the same in its replicas
(RAY_SERVE_FREEZE_GC_ON_STARTUP). Frozen objects are never freed, so call it once, after start-up
and before the request path runs: a cycle built at start-up and dropped later stays in memory.
Returns the number of objects frozen.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
