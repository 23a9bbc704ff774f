"""Rollout health checks: deterministic findings about a rollout's conversation, kept apart from its
reward (a rollout can score 1 and still be one a trainer should not learn from, or 0 for a reason
that is not the model's answer). Pure functions; no I/O.

Findings (each names the first turn it was seen in, counting assistant turns from 1):

- `empty_turn`: an assistant turn with no tool call whose content is empty or only whitespace.
- `cut_at_max_tokens`: the rollout ended on a turn cut by its token limit (finish reason `length`).
- `unanswered_tool_call`: a tool call no later tool message answers (by `tool_call_id`).
- `repeated_output`: a turn whose text ends in one piece repeated (at least 4 times, and over at
  least 40 characters: "the answer is 4. the answer is 4. ..."), or 3 identical assistant turns
  in a row.
- `unparsed_tool_call`: tool-call markup left in a turn's text (`<tool_call>`, `<function=`,
  `[TOOL_CALLS]`, `<|python_tag|>`, a `{"name": ..., "arguments": ...}` object): the model meant to
  call a tool and nobody parsed it.
- `near_context_limit`: a turn whose prompt and output reached 90% of the context length. Checked
  only when the context length is known (`context_length`); else it is listed under `not_checked`
  with the reason, never counted as a pass.

`HealthReport` sums findings over rollouts (a count, the share of the rollouts checked, and the keys
with each finding: all of them in `keys_of`, the first `KEYS_SHOWN` in its JSON, metrics.json's
`health`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from rollmesh.scheduler.records import Rollout

Json = dict[str, Any]

FINDINGS = (
    "empty_turn",
    "cut_at_max_tokens",
    "unanswered_tool_call",
    "repeated_output",
    "unparsed_tool_call",
    "near_context_limit",
)
NEAR_CONTEXT_SHARE = 0.9
MIN_REPEATS, MIN_REPEATED_CHARS, MAX_PERIOD = 4, 40, 200
SAME_TURNS_IN_A_ROW = 3
KEYS_SHOWN = 100
NO_CONTEXT_LENGTH = "the model's context length is not known (rollmesh health --context-length N)"

_TOOL_MARKUP = re.compile(
    r"<tool_call>|</tool_call>|<function=|\[TOOL_CALLS\]|<\|python_tag\|>"
    r"|\{\s*\"name\"\s*:\s*\"[^\"]+\"\s*,\s*\"(?:arguments|parameters)\"\s*:"
)


_NO_CALLS = repr([])  # a turn's shape without tool calls (repr(calls) when it has some)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def repeats(text: str) -> bool:
    """`text` ends in one non-blank piece repeated MIN_REPEATS times or more, over MIN_REPEATED_CHARS
    characters or more."""
    n = len(text)
    for period in range(1, min(MAX_PERIOD, n // MIN_REPEATS) + 1):
        if text[n - 1 - period] != text[n - 1]:  # (cheap: most periods end here)
            continue
        times = max(MIN_REPEATS, math.ceil(MIN_REPEATED_CHARS / period))
        if period * times > n:
            break
        unit = text[-period:]
        if unit.strip() and text.endswith(unit * times):
            return True
    return False


def findings(
    messages: Sequence[Json],
    finish_reason: str,
    turn_ends: Sequence[int] = (),
    *,
    context_length: int | None = None,
) -> dict[str, int]:
    """Each finding of one rollout and the first assistant turn (from 1) it was seen in.
    `messages`: the rollout's output (assistant turns, tool results, environment messages);
    `turn_ends`: each turn's prompt + output length in tokens (the token record's `output_end`)."""
    found: dict[str, int] = {}
    answered: set[str] | None = None  # the tool results' call ids, gathered at the first tool call
    turn, same, previous = 0, 0, None
    for m in messages:
        if m.get("role") != "assistant":
            continue
        turn += 1
        text = _text(m.get("content"))
        calls = m.get("tool_calls") or []
        if calls:
            if answered is None:
                answered = {str(r.get("tool_call_id", "")) for r in messages if r.get("role") == "tool"}
            if any(str(c.get("id", "")) not in answered for c in calls if isinstance(c, dict)):
                found.setdefault("unanswered_tool_call", turn)
        elif not text.strip():
            found.setdefault("empty_turn", turn)
        if _TOOL_MARKUP.search(text):
            found.setdefault("unparsed_tool_call", turn)
        shape = (text, repr(calls) if calls else _NO_CALLS)
        same = same + 1 if shape == previous and (text.strip() or calls) else 1
        previous = shape
        if repeats(text) or same >= SAME_TURNS_IN_A_ROW:
            found.setdefault("repeated_output", turn)
    if finish_reason == "length":
        found["cut_at_max_tokens"] = max(turn, 1)
    if context_length:
        for i, end in enumerate(turn_ends, start=1):
            if end >= NEAR_CONTEXT_SHARE * context_length:
                found["near_context_limit"] = i
                break
    # Most rollouts have no finding or one: already in FINDINGS' order.
    return found if len(found) < 2 else dict(sorted(found.items(), key=lambda kv: FINDINGS.index(kv[0])))


def of_row(row: Mapping[str, Any], *, context_length: int | None = None) -> dict[str, int]:
    """`findings` of a rollouts.jsonl row (rollmesh's, an older one's or NeMo Gym's: records.py
    reads the turns and the finish reason of each)."""
    r = Rollout.from_row(dict(row))
    ends = [t.output_end for t in r.tokens.turns]
    return findings(r.messages, r.finish_reason, ends, context_length=context_length)


@dataclass
class HealthReport:
    """Findings summed over rollouts, by finding, with the keys ("task_index:rollout_index")."""

    checked: int = 0
    context_length: int | None = None
    keys_of: dict[str, list[str]] = field(default_factory=lambda: {name: [] for name in FINDINGS})

    def add(self, key: str, found: Mapping[str, int]) -> None:
        self.checked += 1
        for name in found:
            self.keys_of[name].append(key)

    @property
    def not_checked(self) -> dict[str, str]:
        return {} if self.context_length else {"near_context_limit": NO_CONTEXT_LENGTH}

    def counts(self) -> dict[str, int]:
        return {name: len(keys) for name, keys in self.keys_of.items() if name not in self.not_checked}

    def to_json(self) -> Json:
        """metrics.json's `health`: counts, shares of the rollouts checked, the first KEYS_SHOWN keys
        of each finding (sorted by key), what was not checked and why."""
        counts = self.counts()
        return {
            "checked": self.checked,
            "findings": counts,
            "share": {k: round(v / self.checked, 6) if self.checked else 0.0 for k, v in counts.items()},
            "keys": {k: sorted(self.keys_of[k], key=_key_order)[:KEYS_SHOWN] for k, v in counts.items() if v},
            "not_checked": self.not_checked,
        }


def _key_order(key: str) -> tuple[int, ...]:
    return tuple(int(p) for p in key.split(":") if p.isdigit())


def report(
    items: Iterable[tuple[str, Mapping[str, int]]], *, context_length: int | None = None
) -> HealthReport:
    r = HealthReport(context_length=context_length)
    for key, found in items:
        r.add(key, found)
    return r
