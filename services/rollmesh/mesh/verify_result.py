"""`VerifyResult`: the outcome of verifying one response (`VerifyResult` in verifier.proto), one type
on both sides of the wire: an environment's `verify` returns it (re-exported by `rollmesh.verifier`
for plugins), and the scheduler's agent loop gets it back from its `EnvPort`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class VerifyResult:
    """The outcome of verifying one response."""

    reward: float
    components: dict[str, float] = field(default_factory=dict)
    extracted_answer: str = ""
    details: dict[str, Any] = field(default_factory=dict)
