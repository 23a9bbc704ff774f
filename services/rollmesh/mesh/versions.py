"""`VersionSpan`: which policy version produced which generated ids (partial rollouts).

A weight update in CONTINUE mode stops a running generation, loads the new weights and lets the
generation go on from the ids it already produced: its output then holds ids of two (or more)
policy versions. The gateway's `GenerateResult.versions` (offsets in the output ids) and the
scheduler's `TurnSpan.versions` (offsets in the token record) say which; both are empty when one
version produced every id. The gateway and the scheduler share this type and its conversions.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import Protocol


class _SpanLike(Protocol):
    start: int
    end: int
    policy_version: str


@dataclass(frozen=True)
class VersionSpan:
    """[start, end) of ids `policy_version` produced, in the ids that hold them."""

    start: int
    end: int
    policy_version: str

    def shifted(self, offset: int) -> VersionSpan:
        return VersionSpan(self.start + offset, self.end + offset, self.policy_version)

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "policy_version": self.policy_version}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VersionSpan:
        return cls(int(data["start"]), int(data["end"]), str(data["policy_version"]))


def spans_from(items: Iterable[_SpanLike]) -> tuple[VersionSpan, ...]:
    """Spans from their proto messages (or anything with the same three attributes)."""
    return tuple(VersionSpan(int(s.start), int(s.end), str(s.policy_version)) for s in items)


def spans_of_starts(starts: Sequence[tuple[str, int]], end: int) -> tuple[VersionSpan, ...]:
    """The spans of output ids [0, end) from where each version started producing: `starts` is
    (version, first id offset) in order. Empty when one version produced them all."""
    kept = [
        (v, at)
        for i, (v, at) in enumerate(starts)
        if at < end and (i + 1 == len(starts) or starts[i + 1][1] > at)
    ]
    if len(kept) < 2:
        return ()
    ends = [at for _, at in kept[1:]] + [end]
    return tuple(VersionSpan(at, stop, v) for (v, at), stop in zip(kept, ends, strict=True))
