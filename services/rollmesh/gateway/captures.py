"""Captures: the per-rollout OpenAI URL an external agent program talks to (pure domain, no HTTP).

The scheduler opens a capture for one rollout (`OpenCapture`) and hands its URL and token to the
program. Each call through the URL (`/capture/<key>/v1/chat/completions`, `/v1/responses`; the key is
random, not the capture's id) is the
caller's request with the capture's settings applied (`Capture.apply`):

- the model is the capture's, whatever the call names (a harness that hard-codes a model name
  still runs on the policy); the name it asked for is recorded with the call (`requested_model`),
  so the row says what was asked and what answered;
- the session is the capture's: calls whose conversation extends the previous call's (prompt +
  answer) keep its token ids exactly (gateway/sessions.py); one that rewrites history starts fresh;
- sampling the call does not set comes from the capture's defaults; the capture's `seed` and
  `logprobs`, when set, are always used (a seed per rollout, logprobs for training);
- request ids are `<session_id>/<n>`, n counting the capture's calls: what the built-in loop uses,
  so both drivers produce the same ids (and the same tool-call ids) for the same conversation.

Every answered call is recorded (`CapturedCall`: the conversation and tools as read, the gateway's
result); a refused or failed call is counted, never recorded. `close` returns the record and
forgets the capture, so its URL answers 404 (CAPTURE_NOT_FOUND) afterwards. The token is the
capture's own, compared in constant time; the mesh's API key is never handed to a program.
"""

from __future__ import annotations

import dataclasses
import hmac
import secrets
from dataclasses import dataclass
from dataclasses import field

from rollmesh.gateway import errors
from rollmesh.gateway.backends.base import SamplingInput
from rollmesh.gateway.types import GenerateInput
from rollmesh.gateway.types import GenerateResult

DEFAULT_MAX_CALLS = 256
PATH_PREFIX = "/capture"
MAX_OPEN = 100_000


@dataclass(frozen=True)
class CapturedCall:
    api: str  # "chat.completions" or "responses"
    input: GenerateInput
    result: GenerateResult
    requested_model: str = ""  # the call's own `model` (`input.model` is the capture's)


@dataclass
class Capture:
    capture_id: str
    token: str
    key: str = field(default_factory=lambda: secrets.token_urlsafe(12))  # its URL's path segment
    model: str = ""
    sampling: SamplingInput = field(default_factory=SamplingInput)
    session_id: str = ""
    max_calls: int = DEFAULT_MAX_CALLS
    calls: list[CapturedCall] = field(default_factory=list)
    started: int = 0  # calls given a request id (answered, running or failed)
    refused: int = 0

    @property
    def path(self) -> str:
        return f"{PATH_PREFIX}/{self.key}/v1"

    def apply(self, inp: GenerateInput) -> GenerateInput:
        """The call as the gateway runs it: the capture's model, session, sampling defaults and a
        request id of its own (see the module doc). Raises CaptureCallsExhausted past `max_calls`."""
        if self.started >= self.max_calls:
            self.refused += 1
            raise errors.CaptureCallsExhausted(
                f"capture {self.capture_id!r} answered its {self.max_calls} calls",
                metadata={"capture_id": self.capture_id},
            )
        n = self.started
        self.started += 1
        own, base = inp.sampling, self.sampling
        sampling = dataclasses.replace(
            own,
            temperature=base.temperature if own.temperature is None else own.temperature,
            top_p=base.top_p if own.top_p is None else own.top_p,
            top_k=base.top_k if own.top_k is None else own.top_k,
            max_tokens=base.max_tokens if own.max_tokens is None else own.max_tokens,
            stop=own.stop or base.stop,
            seed=own.seed if base.seed is None else base.seed,
            logprobs=own.logprobs or base.logprobs,
        )
        return dataclasses.replace(
            inp,
            model=self.model,
            sampling=sampling,
            session_id=self.session_id,
            request_id=f"{self.session_id or self.capture_id}/{n}",
        )

    def record(
        self, api: str, inp: GenerateInput, result: GenerateResult, *, requested_model: str = ""
    ) -> None:
        self.calls.append(CapturedCall(api, inp, result, requested_model))


class CaptureStore:
    """Open captures by id (each removed by `close`; at most MAX_OPEN at once). One event loop."""

    def __init__(self, *, max_open: int = MAX_OPEN) -> None:
        self._open: dict[str, Capture] = {}
        self._by_key: dict[str, Capture] = {}
        self.max_open = max_open
        #: The facade's root URL (http://host:port), set when the HTTP facade starts; "" without one.
        self.http_root = ""

    def __len__(self) -> int:
        return len(self._open)

    def open(
        self,
        capture_id: str,
        *,
        model: str = "",
        sampling: SamplingInput | None = None,
        session_id: str = "",
        max_calls: int = 0,
    ) -> Capture:
        if not self.http_root:
            raise errors.CaptureUnavailable(
                "this gateway serves no OpenAI HTTP facade (ROLLMESH_GATEWAY_HTTP_PORT < 0), so a capture "
                "has no URL; start the gateway with its facade to run external agent programs"
            )
        if not capture_id or any(c in capture_id for c in "?#") or capture_id != capture_id.strip():
            raise errors.bad_request(
                f"capture_id {capture_id!r} is empty or not usable in a URL", "capture_id"
            )
        if capture_id in self._open:
            raise errors.CaptureExists(
                f"capture {capture_id!r} is already open", metadata={"capture_id": capture_id}
            )
        if len(self._open) >= self.max_open:
            raise errors.CaptureCallsExhausted(
                f"{len(self._open)} captures are open; the limit is {self.max_open}"
            )
        capture = Capture(
            capture_id=capture_id,
            token=secrets.token_urlsafe(24),
            model=model,
            sampling=sampling or SamplingInput(),
            session_id=session_id,
            max_calls=max_calls if max_calls > 0 else DEFAULT_MAX_CALLS,
        )
        self._open[capture_id] = capture
        self._by_key[capture.key] = capture
        return capture

    def base_url(self, capture: Capture) -> str:
        return f"{self.http_root}{capture.path}"

    def get(self, key: str, token: str) -> Capture:
        """The open capture whose URL has `key` (`Capture.path`) if `token` is its bearer token."""
        capture = self._by_key.get(key)
        if capture is None:
            raise errors.CaptureNotFound(
                "no open capture at this URL (its rollout is over, or it never existed)"
            )
        if not hmac.compare_digest(token.encode(), capture.token.encode()):
            raise errors.CaptureTokenWrong("missing or wrong bearer token for this capture")
        return capture

    def close(self, capture_id: str) -> Capture:
        capture = self._open.pop(capture_id, None)
        if capture is None:
            raise errors.CaptureNotFound(
                f"no open capture {capture_id!r}", metadata={"capture_id": capture_id}
            )
        del self._by_key[capture.key]
        return capture
