"""`row_text(rollout, timing)`: a rollout's JSONL row as text, the characters the JSONL sink's
encoder (json's, `ensure_ascii=False`, separators `,` `:`) writes for `rollout.to_row()`, written
without building the row.

`to_row` builds ~60 dicts, lists and keys per row (the Responses object alone is 8 dicts) that the
encoder then walks, encoding every key again: half the row's cost. Here the row's fixed text (its
keys in `to_row`'s order, the Responses object's constant fields: `responses_items.response_object`)
is written once, and only the rollout's values are encoded, each as json encodes it: a str by
`encode_basestring` (what the encoder calls), an int and a finite float by their repr (what the
encoder writes), a bool as true/false, any other value (the task, the messages, the token record ...)
by the encoder itself. That holds for the values `to_row` is written for; a rollout with any other
(a task that is no plain dict or has a field of the row's own, a NaN or int reward, an int subclass,
a str that is not one) is encoded from `to_row()`: the same characters, the encoder's own way.
tests/unit/test_row_text.py holds the two equal: a change to `to_row` or `response_object` is a
change here.
"""

from __future__ import annotations

import json.encoder
import math

from rollmesh.mesh import responses_items
from rollmesh.scheduler.json_encode import encoder
from rollmesh.scheduler.records import ADDED_FIELDS
from rollmesh.scheduler.records import Json
from rollmesh.scheduler.records import Rollout

#: The JSONL sink's encoder (sinks/jsonl.py): what `row_text` writes the same characters as.
ENCODE = encoder(ensure_ascii=False, separators=(",", ":"))
_STR = json.encoder.encode_basestring  # a str as the encoder writes it (ensure_ascii=False)
_BOOL = {True: "true", False: "false"}


def row_text(r: Rollout, timing: Json | None) -> str:
    """`ENCODE(r.to_row())`; `timing`: `r.timing.to_json()` (None when `r.timing` is None), which the
    caller also keeps (the sink's summary reads it)."""
    task, k = r.task, r.key
    ti, ri, job, p, c = k.task_index, k.rollout_index, r.job_id, r.prompt_tokens, r.completion_tokens
    reward, latency, masked = r.reward, r.latency_s, r.masked
    if not (
        type(task) is dict
        and ADDED_FIELDS.isdisjoint(task)
        and type(ti) is int
        and type(ri) is int
        and type(p) is int
        and type(c) is int
        and type(r.attempts) is int
        and type(r.seed) is int
        and type(job) is str
        and type(r.model) is str
        and type(r.finish_reason) is str
        and type(r.extracted_answer) is str
        and type(r.policy_version) is str
        and type(masked) is bool
        and (timing is None) is (r.timing is None)
        and type(reward) is float
        and type(latency) is float
        and math.isfinite(reward)
        and math.isfinite(latency)
    ):
        return ENCODE(r.to_row())
    # What to_row computes before the encoder writes anything (so a value that fails, fails first).
    output = responses_items.items_from_chat(r.messages)
    status, incomplete = responses_items.response_status(r.finish_reason)
    tokens = r.tokens.to_json()
    head = ENCODE(task)
    return (
        f"{head[:-1]}{',' if len(head) > 2 else ''}"
        f'"task_index":{ti},"rollout_index":{ri},"_ng_task_index":{ti},"_ng_rollout_index":{ri},'
        f'"job_id":{_STR(job)},'
        f'"response":{{"id":{_STR(f"resp_{job}_{ti}_{ri}")},"object":"response","created_at":0.0,'
        f'"model":{_STR(r.model)},"status":{_STR(status)},"error":null,'
        f'"incomplete_details":{"null" if incomplete is None else ENCODE(incomplete)},'
        f'"instructions":null,"metadata":{{}},"output":{ENCODE(output)},"parallel_tool_calls":true,'
        f'"tool_choice":"auto","tools":[],"usage":{{"input_tokens":{p},'
        f'"input_tokens_details":{{"cached_tokens":0,"cache_write_tokens":0}},"output_tokens":{c},'
        f'"output_tokens_details":{{"reasoning_tokens":0}},"total_tokens":{p + c}}}}},'
        f'"chat_messages":{ENCODE(r.messages)},"finish_reason":{_STR(r.finish_reason)},'
        f'"reward":{reward!r},"reward_components":{ENCODE(r.reward_components)},'
        f'"extracted_answer":{_STR(r.extracted_answer)},"verify_details":{ENCODE(r.verify_details)},'
        f'"tokens":{ENCODE(tokens)},'
        f'"usage":{{"prompt_tokens":{p},"completion_tokens":{c},"total_tokens":{p + c}}},'
        f'"attempts":{r.attempts},"latency_s":{latency!r},"policy_version":{_STR(r.policy_version)},'
        f'"seed":{r.seed},"mask_sample":{_BOOL[masked]}'
        f"{_optional('env_steps', r.env_steps)}"
        f"{_optional('timing', timing)}"
        f"{_optional('agent_program', r.agent_program)}}}"
    )


def _optional(name: str, value: object) -> str:
    """A field `to_row` writes only when it is not empty (`timing`: not None; its dict never is)."""
    return f',"{name}":{ENCODE(value)}' if value else ""
