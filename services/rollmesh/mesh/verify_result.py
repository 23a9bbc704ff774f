"""`VerifyResult`: the outcome of verifying one response (`VerifyResult` in verifier.proto), one type
on both sides of the wire: an environment's `verify` returns it (re-exported by `rollmesh.verifier`
for plugins), and the scheduler's agent loop gets it back from its `EnvPort`."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from dataclasses import field
from typing import Any


@dataclass
class VerifyResult:
    """The outcome of verifying one response."""

    reward: float
    components: dict[str, float] = field(default_factory=dict)
    extracted_answer: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    # The environment could not judge the response (NeMo Gym's `mask_sample`: a judge that failed,
    # a sandbox that broke): `reward` is no measurement. The rollout is recorded with it, left out
    # of reward metrics and flagged to trainers, never counted as a 0. `details` says why.
    masked: bool = False

    def not_finite(self) -> str | None:
        """What in it is not a finite number (`reward = nan`), else None. Both sides refuse such a
        result: a NaN would poison every mean and pass@k it enters, an inf or a string means nothing."""
        if _finite_float(self.reward) and all(map(_finite_float, self.components.values())):
            return None  # (every verdict, once per rollout: no names built)
        values = {"reward": self.reward, **{f"components[{k!r}]": v for k, v in self.components.items()}}
        for what, value in values.items():
            if not isinstance(value, numbers.Real) or not math.isfinite(value):
                return f"{what} = {value!r:.80}"
        return None


def _finite_float(value: object) -> bool:
    return type(value) is float and math.isfinite(value)
