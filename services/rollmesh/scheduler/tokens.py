"""Token records of multi-turn rollouts, built from the gateway's ids (never by re-tokenizing), and
their validator.

The agent loop fills one `Turn` per model turn from the gateway's `GenerateResponse`
(`prompt_token_ids`, `output_token_ids`, `logprobs`, `policy_version`, `replica_id`) and the
scheduler calls `build_token_record(turns)`. The record is:

    token_ids = turn-1 prompt ids, turn-1 generated ids, the ids turn 2's prompt adds (tool
                results, the chat template's glue), turn-2 generated ids, ...
    loss_mask = 1 on generated ids, 0 elsewhere
    logprobs  = the policy's logprob of each generated id, 0.0 elsewhere (and where a turn brought
                none: the record's `logprobs_recorded` is then False, e.g. the job did not ask)
    turns     = one TurnSpan per turn: [prompt_start, output_start) are the ids that turn's prompt
                added, [output_start, output_end) the ids the policy generated; `versions`, when a
                CONTINUE weight update split the turn (partial rollouts), which policy version
                generated which of those ids (the gateway's spans, moved to record offsets)

Each turn's prompt must start with every id so far (the gateway keeps the ids it generated, so a
re-rendered template never changes them); if it does not, the record would train on tokens the
policy never saw, so `build_token_record` raises `TokenRecordMismatch` (the rollout fails with
error class TOKEN_RECORD_MISMATCH).

Segments: an external agent program (program.py) may rewrite its history (compact it, run a
sub-agent): such a turn (`Turn.new_segment`) starts the next segment, whose first prompt addition is
the turn's whole prompt, and later turns must extend that segment's ids. The record stays one array
(spans contiguous, the mask 1 on generated ids only); `TurnSpan.segment` numbers each turn's segment
(0, 1, ...), and a trainer reads each segment as a sequence of its own. The built-in loop never
starts one. So it does when the job asked for logprobs and a turn came back
with generated ids but none (zeros would pass for the policy's logprobs), and when some turns carry
ids and others none. A model server that returns no ids at all (an OpenAI URL that is not vLLM)
gives an empty record (no ids, no turns): the row still has its messages and reward, and says it
has no tokens, rather than spans of zero length or ids re-tokenized from the text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any
from typing import Protocol

from rollmesh.mesh import untrusted_json
from rollmesh.scheduler.drivers.agent_loop import Turn
from rollmesh.scheduler.errors import TokenRecordMismatch
from rollmesh.scheduler.records import SEGMENT_KEY
from rollmesh.scheduler.records import Json
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.records import TurnSpan


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


def build_token_record(turns: Sequence[Turn], *, logprobs_wanted: bool = False) -> TokenRecord:
    """The token record of a rollout from its turns, in order (see the module doc). With
    `logprobs_wanted` (the job's `sampling.logprobs`) every generated id must have its logprob."""
    without_ids = [i + 1 for i, t in enumerate(turns) if not t.prompt_token_ids]
    if without_ids and len(without_ids) == len(turns):
        return TokenRecord()  # the model server returned no token ids: no record, not an empty one
    if without_ids:
        raise TokenRecordMismatch(
            f"turn {without_ids[0]} came back without token ids while other turns of the rollout have them",
            metadata={"turn": str(without_ids[0])},
        )
    ids: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    spans: list[TurnSpan] = []
    segment, segment_start = 0, 0
    for i, turn in enumerate(turns):
        prompt = list(turn.prompt_token_ids)
        if getattr(turn, "new_segment", False) and i > 0:
            segment, segment_start = segment + 1, len(ids)
        seen = ids[segment_start:]  # the ids of this segment so far
        n = len(seen)
        if len(prompt) < n or prompt[:n] != seen:
            at = _first_difference(prompt, ids)
            raise TokenRecordMismatch(
                f"turn {i + 1}'s prompt ({len(prompt)} ids) does not start with the {n} ids of the "
                f"turns before it: first difference at position {at}",
                metadata={"turn": str(i + 1), "position": str(at)},
            )
        added = prompt[n:]
        prompt_start = len(ids)
        ids.extend(added)
        mask.extend([0] * len(added))
        lps.extend([0.0] * len(added))
        out = list(turn.output_token_ids)
        if logprobs_wanted and out and not turn.logprobs:
            raise TokenRecordMismatch(
                f"the job asked for logprobs but turn {i + 1} came back with {len(out)} generated ids "
                "and no logprobs",
                metadata={"turn": str(i + 1)},
            )
        if turn.logprobs and len(turn.logprobs) != len(out):
            raise TokenRecordMismatch(
                f"turn {i + 1} has {len(out)} output ids but {len(turn.logprobs)} logprobs",
                metadata={"turn": str(i + 1)},
            )
        output_start = len(ids)
        ids.extend(out)
        mask.extend([1] * len(out))
        lps.extend([float(x) for x in turn.logprobs] if turn.logprobs else [0.0] * len(out))
        versions = getattr(turn, "versions", ())  # (most turns: none, and no generator built)
        spans.append(
            TurnSpan(
                prompt_start=prompt_start,
                output_start=output_start,
                output_end=len(ids),
                policy_version=turn.policy_version,
                replica_id=turn.replica_id,
                segment=segment,
                versions=tuple([v.shifted(output_start) for v in versions]) if versions else (),
            )
        )
    recorded = all(t.logprobs for t in turns if t.output_token_ids)
    return TokenRecord(token_ids=ids, loss_mask=mask, logprobs=lps, turns=spans, logprobs_recorded=recorded)


def validate_token_record(
    record: TokenRecord,
    *,
    messages: Sequence[Json] | None = None,
    tokenizer: Decoder | None = None,
    completion_tokens: int | None = None,
) -> list[str]:
    """Why `record` is not a faithful token record; an empty list when it is.

    Checks: the three arrays have one length; spans are contiguous, in order and in range; the
    loss mask is 1 exactly on the generated spans; logprobs are 0 off them, and finite and <= 0 on
    them (a logit or a NaN is no logprob); `completion_tokens` (when given and > 0) equals the
    generated count. With `messages` and a `tokenizer`: one assistant message per turn, and decoding
    each generated span gives that message's content (for a message with tool calls, the content,
    each tool's name and every string in its arguments must appear in the decoded text, since the
    parser moved the call out of the content; a trailing stop string is tolerated after a turn that
    did not end with the tokenizer's eos, which is the only way it can be there)."""
    reasons: list[str] = []
    n = len(record.token_ids)
    if len(record.loss_mask) != n or len(record.logprobs) != n:
        reasons.append(
            f"length mismatch: {n} token_ids, {len(record.loss_mask)} loss_mask, "
            f"{len(record.logprobs)} logprobs"
        )
        return reasons
    bad = [i for i, m in enumerate(record.loss_mask) if m not in (0, 1)]
    if bad:
        reasons.append(f"loss_mask has values other than 0/1 (first at position {bad[0]})")
    expected = [0] * n
    prev_end = 0
    for t, span in enumerate(record.turns, start=1):
        if span.prompt_start != prev_end:
            reasons.append(f"turn {t}: prompt_start {span.prompt_start} != previous turn's end {prev_end}")
        bounds = (span.prompt_start, span.output_start, span.output_end)
        if not all(type(b) is int for b in bounds):  # a stored row's; compared below, a TypeError
            reasons.append(f"turn {t}: span {list(bounds)!r:.80} is not three integers")
            return reasons
        if not (span.prompt_start <= span.output_start <= span.output_end <= n):
            reasons.append(
                f"turn {t}: span [{span.prompt_start}, {span.output_start}, {span.output_end}) "
                f"out of order or past the {n} ids"
            )
            return reasons
        for i in range(span.output_start, span.output_end):
            expected[i] = 1
        prev_end = span.output_end
        reasons.extend(_check_versions(t, span))
        before = record.turns[t - 2].segment if t > 1 else 0
        if type(span.segment) is not int or span.segment not in (before, before + 1):
            reasons.append(f"turn {t}: segment {span.segment!r:.20} does not follow segment {before}")
    if record.turns and prev_end != n:
        reasons.append(f"{n - prev_end} ids after the last turn's output (position {prev_end} onwards)")
    for t, span in enumerate(record.turns, start=1):
        got = record.loss_mask[span.output_start : span.output_end]
        if any(m != 1 for m in got):
            off = span.output_start + next(i for i, m in enumerate(got) if m != 1)
            reasons.append(f"turn {t}: generated id at position {off} is masked out (loss_mask 0)")
    stray = [i for i in range(n) if record.loss_mask[i] == 1 and expected[i] == 0]
    if stray:
        reasons.append(
            f"loss_mask is 1 on {len(stray)} ids outside the generated spans (first at position {stray[0]})"
        )
    stray_lp = [i for i in range(n) if expected[i] == 0 and record.logprobs[i] != 0.0]
    if stray_lp:
        reasons.append(f"logprobs are non-zero on {len(stray_lp)} non-generated ids (first at {stray_lp[0]})")
    impossible = [i for i in range(n) if expected[i] and not -math.inf < record.logprobs[i] <= 0.0]
    if impossible:
        at = impossible[0]
        reasons.append(
            f"logprobs of {len(impossible)} generated ids are not log-probabilities (> 0, infinite or NaN; "
            f"first at {at}: {record.logprobs[at]})"
        )
    generated = sum(expected)
    if completion_tokens and completion_tokens != generated:
        reasons.append(f"usage says {completion_tokens} completion tokens but the spans hold {generated}")
    if messages is not None and tokenizer is not None:
        reasons.extend(_check_text(record, messages, tokenizer))
    return reasons


def _check_versions(t: int, span: TurnSpan) -> list[str]:
    """A turn's version spans (partial rollouts): none, or consecutive non-empty spans from its
    output_start to its output_end, the first of them the turn's `policy_version`."""
    if not span.versions:
        return []
    at = span.output_start
    for v in span.versions:
        if v.start != at or v.end <= v.start:
            return [f"turn {t}: version span [{v.start}, {v.end}) does not follow on at {at}"]
        at = v.end
    if at != span.output_end:
        return [f"turn {t}: version spans end at {at}, its output at {span.output_end}"]
    if span.versions[0].policy_version != span.policy_version:
        first = span.versions[0].policy_version
        return [f"turn {t}: policy_version {span.policy_version!r} is not its first span's {first!r}"]
    return []


def validate_rollout(rollout: Rollout, *, tokenizer: Decoder | None = None) -> list[str]:
    """`validate_token_record` of a stored rollout, against its messages and usage."""
    if not rollout.tokens.token_ids and not rollout.tokens.turns:
        return ["no token record (token_ids empty: the model server returned no token ids)"]
    return validate_token_record(
        rollout.tokens,
        messages=rollout.messages,
        tokenizer=tokenizer,
        completion_tokens=rollout.completion_tokens,
    )


def _check_text(record: TokenRecord, messages: Sequence[Json], tokenizer: Decoder) -> list[str]:
    """Each turn's generated ids against its assistant message. One segment: the messages' assistant
    messages are the turns', one each. Several (an external program's row: each later segment's
    messages open with one marked `SEGMENT_KEY`): a segment's turns are the last assistant messages
    of its part of the messages (what comes before them is history the program wrote itself)."""
    parts: list[list[Json]] = [[]]
    for m in messages:
        if m.get(SEGMENT_KEY) and parts[-1]:
            parts.append([])
        parts[-1].append(m)
    segments = max((s.segment for s in record.turns), default=0) + 1
    if len(parts) != segments:
        return [f"{segments} token record segments but the messages hold {len(parts)}"]
    reasons: list[str] = []
    for k, part in enumerate(parts):
        spans = [s for s in record.turns if s.segment == k]
        assistant = [m for m in part if m.get("role") == "assistant"]
        where = "" if segments == 1 else f"segment {k}: "
        if len(assistant) != len(spans) and (segments == 1 or len(assistant) < len(spans)):
            return [f"{where}{len(spans)} turns but {len(assistant)} assistant messages"]
        first = record.turns.index(spans[0]) + 1 if spans else 1
        for t, (span, msg) in enumerate(
            zip(spans, assistant[len(assistant) - len(spans) :], strict=True), first
        ):
            reasons.extend(_check_turn(t, record, span, msg, tokenizer))
    return reasons


def _check_turn(t: int, record: TokenRecord, span: TurnSpan, msg: Json, tokenizer: Decoder) -> list[str]:
    reasons: list[str] = []
    generated = record.token_ids[span.output_start : span.output_end]
    decoded = tokenizer.decode(generated, skip_special_tokens=True).strip()
    ended_on_eos = bool(generated) and generated[-1] == getattr(tokenizer, "eos_token_id", None)
    content = str(msg.get("content") or "").strip()
    calls = _tool_call_parts(msg)
    if calls:
        missing = [c for c in calls if c not in decoded and json.dumps(c)[1:-1] not in decoded]
        if content and content not in decoded:
            reasons.append(
                f"turn {t}: decoded ids {_show(decoded)} do not contain the content {_show(content)}"
            )
        if missing:
            reasons.append(f"turn {t}: decoded ids {_show(decoded)} do not mention tool call(s) {missing}")
    elif decoded != content and (ended_on_eos or not decoded.startswith(content)):
        # Only a turn cut by a stop string may decode to more than its content (the stop string).
        at = _first_difference(list(decoded), list(content))
        reasons.append(
            f"turn {t}: decoded ids {_show(decoded)} differ from the assistant content {_show(content)} "
            f"at character {at}"
        )
    return reasons


def _tool_call_parts(msg: Json) -> list[str]:
    """What the text of the message's tool calls must hold: each call's name and every string in
    its arguments (the tool ran with them)."""
    parts: list[str] = []
    for call in msg.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        fn: Any = call.get("function")
        fn = fn if isinstance(fn, dict) else call
        if fn.get("name"):
            parts.append(str(fn["name"]))
        args = fn.get("arguments")
        try:
            parts.extend(_strings(untrusted_json.loads(args) if isinstance(args, str) else args))
        except (ValueError, RecursionError):  # a stored row's arguments: anything
            continue
    return parts


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) and value else []


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _show(text: str, limit: int = 60) -> str:
    return json.dumps(text if len(text) <= limit else text[:limit] + "...")
