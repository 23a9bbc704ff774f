"""The OpenAI wire protocol, both ways, as plain dicts (no web framework here): request bodies to the
gateway's `GenerateInput`, `GenerateResult` to chat completions and Responses objects, and errors to
OpenAI's `{"error": {"message", "type", "param", "code"}}` (`code` = the ErrorInfo reason).

Extensions for RL agents that only speak HTTP:
- `X-Session-Id` header (or the `user` / `session_id` field) names a gateway session: token-exact
  multi-turn. `X-Request-Id` sets the request id (for Abort).
- Responses carry `prompt_token_ids` (top level) and `token_ids` (per choice) as vLLM's
  `return_token_ids` does, plus `rollmesh: {replica_id, policy_version, reused_prefix_tokens, ...}`
  (`versions` too when a CONTINUE weight update split the output).

Finish reasons are OpenAI's: one OpenAI has no word for (the gateway's "unknown": the upstream
named none, it may be cut; "abort": an Abort or a weight update cut it; vLLM's "error",
"repetition") is chat `finish_reason` null and a Responses object `status: "incomplete"` with
`incomplete_details.reason` null (`rollmesh.finish_reason` has the gateway's word).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from rollmesh.gateway import errors
from rollmesh.gateway.backends.base import SamplingInput
from rollmesh.gateway.errors import bad_request
from rollmesh.gateway.types import GenerateInput
from rollmesh.gateway.types import GenerateResult
from rollmesh.gateway.types import ModelStatus
from rollmesh.mesh import responses_items
from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolSpec
from rollmesh.mesh.chat import content_text
from rollmesh.mesh.errors import RollmeshError


def error_json(exc: RollmeshError) -> dict[str, Any]:
    return {
        "error": {
            "message": exc.message,
            "type": errors.openai_type(exc),
            "param": exc.metadata.get("field"),
            "code": exc.reason,
        }
    }


def error_headers(exc: RollmeshError) -> dict[str, str]:
    return {} if exc.retry_after_s is None else {"Retry-After": str(max(1, round(exc.retry_after_s)))}


# -- OpenAI JSON -> domain ---------------------------------------------------------------------


def _text(content: Any, where: str) -> str:
    try:
        return content_text(content, strict=True)
    except ValueError as exc:
        raise bad_request(f"{where}: {exc}", where) from None


def chat_message(m: Any, i: int) -> Message:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise bad_request(f"messages[{i}] must be an object with a role", f"messages[{i}]")
    try:
        return Message.from_openai(m, strict=True)
    except ValueError as exc:
        raise bad_request(f"messages[{i}].content: {exc}", f"messages[{i}].content") from None


def _tools(raw: Any) -> tuple[ToolSpec, ...]:
    out = []
    for i, t in enumerate(raw or ()):
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not fn.get("name"):
            raise bad_request(f"tools[{i}] must be a function tool with a name", f"tools[{i}]")
        params = fn.get("parameters")
        out.append(
            ToolSpec(
                name=str(fn["name"]),
                description=str(fn.get("description") or ""),
                parameters_json=json.dumps(params) if params is not None else "",
            )
        )
    return tuple(out)


def _sampling(body: dict[str, Any], max_key: tuple[str, ...]) -> SamplingInput:
    def num(key: str) -> float | None:
        v = body.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise errors.InvalidSampling(f"{key} must be a number", metadata={"field": key})
        return float(v)

    def integer(key: str, value: Any) -> int | None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise errors.InvalidSampling(f"{key} must be an integer", metadata={"field": key})
        return value

    max_tokens = integer(max_key[0], next((body[k] for k in max_key if body.get(k) is not None), None))
    # A `stop` that is not text was a 500 (TypeError); a `seed` or `top_k` of another type was dropped.
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, list | tuple) or not all(isinstance(x, str) for x in stop):
        raise errors.InvalidSampling("stop must be a string or a list of strings", metadata={"field": "stop"})
    return SamplingInput(
        temperature=num("temperature"),
        top_p=num("top_p"),
        top_k=integer("top_k", body.get("top_k")),
        max_tokens=max_tokens,
        stop=tuple(stop),
        seed=integer("seed", body.get("seed")),
        logprobs=bool(body.get("logprobs")),
        ignore_eos=bool(body.get("ignore_eos")),  # vLLM's extension of the OpenAI API
    )


def _input(
    headers: Mapping[str, str], body: dict[str, Any], messages: tuple[Message, ...], max_key: tuple[str, ...]
) -> GenerateInput:
    """What both routes share: model, tools, sampling, the session and the request id."""
    return GenerateInput(
        model=str(body.get("model") or ""),
        messages=messages,
        tools=_tools(body.get("tools")),
        sampling=_sampling(body, max_key),
        session_id=headers.get("x-session-id") or str(body.get("session_id") or body.get("user") or ""),
        request_id=headers.get("x-request-id", ""),
    )


# Chat parameters the gateway does not implement, with the values that mean "off" (what clients send
# by default). Any other value is refused by name: ignoring it would answer something the client did
# not ask for (JSON mode, penalties, alternatives) as if it had been honoured.
_UNIMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "top_logprobs": (None, 0),
    "response_format": (None, {"type": "text"}),
    "tool_choice": (None, "auto", "none"),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
}


# The Responses API's counterparts (`text.format` is checked on its own: it is nested).
_RESPONSES_UNIMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "tool_choice": (None, "auto", "none"),
    "top_logprobs": (None, 0),
}


# Fields of one JSON type: another value was taken for its truthiness ("stream": "false" streamed) or
# was a 500 ("stream_options": [1]).
_TYPED: dict[str, tuple[type, str]] = {
    "stream": (bool, "a boolean"),
    "logprobs": (bool, "a boolean"),
    "ignore_eos": (bool, "a boolean"),
    "stream_options": (dict, "an object"),
    "tools": (list, "a list"),
}


def _check_types(body: dict[str, Any]) -> None:
    for name, (kind, said) in _TYPED.items():
        value = body.get(name)
        if value is not None and not isinstance(value, kind):
            raise bad_request(f"{name} must be {said}, not {json.dumps(value)[:60]}", name)


def _refuse_unimplemented(body: dict[str, Any], table: dict[str, tuple[Any, ...]] = _UNIMPLEMENTED) -> None:
    for name, off in table.items():
        value = body.get(name)
        if all(value != o or isinstance(value, bool) for o in off):
            raise bad_request(f"{name}={json.dumps(value)} is not supported by this gateway", name)


def chat_input(headers: Mapping[str, str], body: dict[str, Any]) -> GenerateInput:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("messages must be a non-empty list", "messages")
    if (body.get("n") or 1) != 1:
        raise bad_request("n > 1 is not supported; send n requests", "n")
    _check_types(body)
    _refuse_unimplemented(body)
    messages = tuple(chat_message(m, i) for i, m in enumerate(msgs))
    return _input(headers, body, messages, ("max_completion_tokens", "max_tokens"))


def responses_input(headers: Mapping[str, str], body: dict[str, Any]) -> GenerateInput:
    if body.get("previous_response_id"):
        raise bad_request(
            "previous_response_id is not supported; send the whole input with an X-Session-Id header",
            "previous_response_id",
        )
    _check_types(body)
    _refuse_unimplemented(body, _RESPONSES_UNIMPLEMENTED)
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise bad_request(f"text.format={json.dumps(fmt)} is not supported by this gateway", "text.format")
    try:
        msgs = responses_items.messages_from_input(body.get("input"), body.get("instructions"))
    except responses_items.NotResponsesItem as exc:
        raise bad_request(f"input{exc}", f"input{exc.where}") from None
    except ValueError:
        raise bad_request("input must be a string or a list of items", "input") from None
    if not msgs:
        raise bad_request("input is empty", "input")
    return _input(headers, body, tuple(msgs), ("max_output_tokens",))


# -- domain -> OpenAI JSON ---------------------------------------------------------------------


def calls_json(r: GenerateResult) -> list[dict[str, Any]]:
    return [c.to_openai() for c in r.message.tool_calls]


def extension(r: GenerateResult, session_id: str) -> dict[str, Any]:
    out = {
        "replica_id": r.replica_id,
        "policy_version": r.policy_version,
        "reused_prefix_tokens": r.reused_prefix_tokens,
        "request_id": r.request_id,
        "session_id": session_id,
        "finish_reason": r.finish_reason,
    }
    if r.versions:  # a CONTINUE weight update split the output: which version made which ids
        out["versions"] = [v.to_json() for v in r.versions]
    return out


CHAT_FINISHES = frozenset({"stop", "length", "tool_calls", "content_filter"})  # OpenAI's own words


def chat_finish(reason: str) -> str | None:
    """A chat choice's finish_reason: the gateway's when OpenAI has it, else null."""
    return reason if reason in CHAT_FINISHES else None


def logprobs_json(token_ids: Sequence[int], logprobs: Sequence[float]) -> dict[str, Any] | None:
    """A choice's `logprobs` (a whole completion's, or a stream chunk's), tokens named by id as
    vLLM's `return_tokens_as_token_ids` does; None when none were asked for."""
    if not logprobs:
        return None
    return {
        "content": [
            {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(token_ids, logprobs, strict=False)
        ]
    }


def usage_json(r: GenerateResult) -> dict[str, int]:
    u = r.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


def completion_object(
    cid: str,
    model: str,
    choices: list[dict[str, Any]],
    *,
    created: int = 0,
    chunk: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """OpenAI's `chat.completion` object (with `chunk`, a `chat.completion.chunk`: a stream's
    chunks share one `created`) around `choices`; `extra` adds top-level keys (usage ...)."""
    return {
        "id": cid,
        "object": "chat.completion.chunk" if chunk else "chat.completion",
        "created": created or int(time.time()),
        "model": model,
        "choices": choices,
        **extra,
    }


def chat_completion(r: GenerateResult, session_id: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": r.message.content or None}
    if r.message.tool_calls:
        message["tool_calls"] = calls_json(r)
    elif message["content"] is None:
        message["content"] = ""
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": chat_finish(r.finish_reason),
        "logprobs": logprobs_json(r.output_token_ids, r.logprobs),
        "token_ids": list(r.output_token_ids),
    }
    return completion_object(
        f"chatcmpl-{r.request_id}",
        r.model,
        [choice],
        usage=usage_json(r),
        prompt_token_ids=list(r.prompt_token_ids),
        rollmesh=extension(r, session_id),
    )


def response_shell(rid: str, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """A Responses object in progress with no output yet: the fields that echo the request."""
    return {
        "id": rid,
        "object": "response",
        "created_at": time.time(),
        "model": model,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
    }


def response_object(r: GenerateResult, body: dict[str, Any], session_id: str) -> dict[str, Any]:
    output = responses_items.assistant_items(r.message, r.request_id)
    status, incomplete = responses_items.response_status(r.finish_reason)
    return {
        **response_shell(f"resp_{r.request_id}", r.model, body),
        "status": status,
        "incomplete_details": incomplete,
        "output": output,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "usage": {
            "input_tokens": r.usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": r.reused_prefix_tokens},
            "output_tokens": r.usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": r.usage.total_tokens,
        },
        "prompt_token_ids": list(r.prompt_token_ids),
        "output_token_ids": list(r.output_token_ids),
        "rollmesh": extension(r, session_id),
    }


def model_json(m: ModelStatus) -> dict[str, Any]:
    return {
        "id": m.name,
        "object": "model",
        "created": 0,
        "owned_by": "rollmesh",
        "max_model_len": m.max_model_len,
        "rollmesh": {
            "backend": m.backend,
            "policy_version": m.policy_version,
            "paused": m.paused,
            "is_default": m.is_default,
            "replicas": [r.__dict__ for r in m.replicas],
        },
    }
