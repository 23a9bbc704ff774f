"""A deterministic in-process backend for tests, benchmarks and the scheduler's tests.

    from rollmesh.gateway.backends.fake import FakeBackend, FakeTokenizer

    backend = FakeBackend("fake")                          # echoes the last user message
    backend = FakeBackend("fake", script=lambda prompt, req: '<tool_call>{"name": "add", '
                          '"arguments": {"a": 1}}</tool_call>')
    backend = FakeBackend("fake", script=lambda prompt, req: FakeTokenizer.char_ids("12"))

A script is any callable `(prompt_text, request) -> str | Sequence[int]`: `prompt_text` is the
decoded prompt (chat template included), `request` the `EngineRequest`. Returning text makes the
engine emit its canonical encoding; returning ids emits exactly those ids (e.g. a non-canonical
tokenization, which token-exact multi-turn must keep). The engine appends `<|end|>` (eos) unless
the ids already end with it, then applies `max_tokens` ("length") and stop strings ("stop").

`FakeTokenizer` is char-level with a few multi-character tokens ("12", "the", "ing", " is") and
the tiny-arith special tokens, so text has more than one tokenization. Its chat template is the
tiny-arith template written in Python.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import zlib
from collections import deque
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollmesh.gateway.backends.base import EngineChunk
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.base import ModelBackend
from rollmesh.gateway.backends.base import ModelCard
from rollmesh.gateway.backends.base import ReplicaStatus
from rollmesh.gateway.errors import BackendUnavailable
from rollmesh.gateway.errors import WeightLoadFailed

Script = Callable[[str, EngineRequest], "str | Sequence[int]"]
# Called per replica on a weight load: (replica_id, checkpoint); raising fails that replica's load.
WeightLoadHook = Callable[[str, Path], None]

SPECIALS = (
    "<|pad|>",
    "<|bos|>",
    "<|end|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<tool_call>",
    "</tool_call>",
)
MERGES = ("12", "the", "ing", " is")
CHAR_BASE = 64  # a character c has id CHAR_BASE + ord(c)


class FakeTokenizer:
    """Greedy longest-match over specials and merges, else one id per character."""

    eos_token = "<|end|>"
    bos_token = "<|bos|>"

    def __init__(self) -> None:
        self._pieces = {p: i for i, p in enumerate((*SPECIALS, *MERGES))}
        self._by_id = {i: p for p, i in self._pieces.items()}
        self._special_ids = set(range(len(SPECIALS)))
        self._first = {p[0] for p in self._pieces}
        self._longest = max(len(p) for p in self._pieces)
        self.eos_token_id = self._pieces[self.eos_token]

    @staticmethod
    def char_ids(text: str) -> list[int]:
        """One id per character: a valid but usually non-canonical tokenization of `text`."""
        return [CHAR_BASE + ord(c) for c in text]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        del add_special_tokens
        ids: list[int] = []
        i, n = 0, len(text)
        while i < n:  # the longest piece starting at i, else the character
            k = min(self._longest, n - i) if text[i] in self._first else 1
            while k > 1 and text[i : i + k] not in self._pieces:
                k -= 1
            ids.append(self._pieces[text[i : i + k]] if k > 1 else CHAR_BASE + ord(text[i]))
            i += k
        return ids

    def __len__(self) -> int:
        return CHAR_BASE + sys.maxunicode + 1

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out: list[str] = []
        for t in token_ids:
            if t >= CHAR_BASE:
                out.append(chr(t - CHAR_BASE))
            elif not (skip_special_tokens and t in self._special_ids):
                out.append(self._by_id.get(t, ""))
        return "".join(out)

    def apply_chat_template(
        self,
        conversation: Sequence[dict[str, Any]],
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
    ) -> Any:
        parts = [self.bos_token]
        msgs = list(conversation)
        first_is_system = bool(msgs) and msgs[0].get("role") == "system"
        if tools:
            parts.append("<|system|>\n")
            if first_is_system:
                parts.append(str(msgs[0].get("content") or "") + "\n\n")
            parts.append("You can call these tools:\n")
            parts.extend(json.dumps(t.get("function", t)) + "\n" for t in tools)
            parts.append('To call a tool, write <tool_call>{"name": ..., "arguments": {...}}</tool_call>.')
            parts.append("<|end|>\n")
        for i, m in enumerate(msgs):
            role, content = m.get("role"), str(m.get("content") or "")
            if role in ("user", "tool") or (role == "system" and not (tools and i == 0)):
                parts.append(f"<|{role}|>\n{content}<|end|>\n")
            elif role == "assistant":
                parts.append(f"<|assistant|>\n{content}")
                for call in m.get("tool_calls") or ():
                    fn = call.get("function", call)
                    parts.append(
                        f'<tool_call>{{"name": {json.dumps(fn["name"])}, "arguments": {fn["arguments"]}}}'
                        "</tool_call>"
                    )
                parts.append("<|end|>\n")
        if add_generation_prompt:
            parts.append("<|assistant|>\n")
        text = "".join(parts)
        return self.encode(text) if tokenize else text


def echo_last_user(prompt_text: str, request: EngineRequest) -> str:
    """The default script: repeat the last user message (or "ok")."""
    del request
    start = prompt_text.rfind("<|user|>\n")
    if start < 0:
        return "ok"
    body = prompt_text[start + len("<|user|>\n") :]
    return body.split("<|end|>", 1)[0]


class FakeBackend(ModelBackend):
    """Scripted engine with `num_replicas` pretend replicas, configurable latency (`token_latency_s`
    between tokens, `first_token_latency_s` before the first: ROLLMESH_FAKE_LATENCY_S), and hooks tests
    use: `requests` (last 1000 EngineRequests), `aborted` (request ids passed to abort),
    `down` (generate raises BackendUnavailable), `wait_running(request_id)`, `wait_aborted(request_id)`.

    Weight updates: with `weights_dir` (the checkpoint folder the fake pretends to serve) the backend
    takes UpdateWeights; `loaded_weights` maps each replica to the folder it serves now, `weight_loads`
    counts loads, and `weight_load_hook` may raise to fail one replica's load (then every replica
    goes back to the previous folder, as the real backend does). After a load each replica reports
    the folder's name as its `weights_id` and the load's policy version, as Ray Serve replicas do."""

    def __init__(
        self,
        name: str = "fake",
        *,
        script: Script | None = None,
        num_replicas: int = 1,
        max_model_len: int = 4096,
        token_latency_s: float = 0.0,
        first_token_latency_s: float = 0.0,
        weights_dir: Path | None = None,
        weight_load_hook: WeightLoadHook | None = None,
    ) -> None:
        self._card = ModelCard(name=name, backend="fake", max_model_len=max_model_len)
        self._tokenizer = FakeTokenizer()
        self.script: Script = script or echo_last_user
        self.replica_ids = [f"{name}-replica-{i}" for i in range(max(1, num_replicas))]
        self.token_latency_s = token_latency_s
        self.first_token_latency_s = first_token_latency_s
        self.down = False
        self.retry_after_s = 1.0
        self.requests: deque[EngineRequest] = deque(maxlen=1000)
        self.aborted: list[str] = []
        self.started = False
        self._rr = itertools.count()
        self._running: dict[str, asyncio.Event] = {}
        self._in_flight = dict.fromkeys(self.replica_ids, 0)
        self._changed = asyncio.Event()
        self._weights_dir = weights_dir
        self.weight_load_hook = weight_load_hook
        self.loaded_weights: dict[str, Path] = dict.fromkeys(self.replica_ids, weights_dir or Path())
        self.weight_loads = 0
        self._served_version = ""

    @property
    def card(self) -> ModelCard:
        return self._card

    @property
    def tokenizer(self) -> FakeTokenizer:
        return self._tokenizer

    async def start(self) -> None:
        self.started = True

    async def shutdown(self) -> None:
        for ev in self._running.values():
            ev.set()
        self.started = False

    def pick_replica(self, session_id: str) -> str:
        if session_id:
            return self.replica_ids[zlib.crc32(session_id.encode()) % len(self.replica_ids)]
        return self.replica_ids[next(self._rr) % len(self.replica_ids)]

    async def wait_running(self, request_id: str, *, timeout_s: float = 10.0) -> None:
        """Wait until `request_id` is generating (an event, not a sleep)."""
        await self._wait_until(lambda: request_id in self._running, timeout_s)

    async def wait_aborted(self, request_id: str, *, timeout_s: float = 10.0) -> None:
        """Wait until `abort(request_id)` has been called."""
        await self._wait_until(lambda: request_id in self.aborted, timeout_s)

    async def _wait_until(self, done: Callable[[], bool], timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while not done():
                self._changed.clear()
                await self._changed.wait()

    def _output_ids(self, request: EngineRequest) -> tuple[list[int], str]:
        prompt_text = self._tokenizer.decode(request.prompt_token_ids)
        scripted = self.script(prompt_text, request)
        ids = self._tokenizer.encode(scripted) if isinstance(scripted, str) else list(scripted)
        if not ids or ids[-1] != self._tokenizer.eos_token_id:
            ids.append(self._tokenizer.eos_token_id)
        finish = "stop"
        if len(ids) > request.sampling.max_tokens:
            ids, finish = ids[: request.sampling.max_tokens], "length"
        return ids, finish

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        if self.down:
            raise BackendUnavailable(f"{self._card.name} is down", retry_after_s=self.retry_after_s)
        self.requests.append(request)
        replica = self.pick_replica(request.session_id)
        ids, finish = self._output_ids(request)
        abort = asyncio.Event()
        self._running[request.request_id] = abort
        self._in_flight[replica] += 1
        self._changed.set()
        text_so_far = ""
        try:
            if self.first_token_latency_s > 0:  # a slow model: one timer per request, abortable
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(abort.wait(), self.first_token_latency_s)
            for i, tid in enumerate(ids):
                # Between tokens: the first token's wait is first_token_latency_s (above), so a
                # test can hold a stream open after its first delta.
                if i > 0 and self.token_latency_s > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(abort.wait(), self.token_latency_s)
                if abort.is_set():
                    yield EngineChunk(finish_reason="abort", replica_id=replica)
                    return
                text = "" if tid == self._tokenizer.eos_token_id else self._tokenizer.decode([tid])
                text_so_far += text
                # As vLLM: the id that completes a stop string is output, and the request ends.
                stopped = any(s in text_so_far for s in request.sampling.stop)
                last = i == len(ids) - 1 or stopped
                yield EngineChunk(
                    token_ids=(tid,),
                    logprobs=(-0.01 - (tid % 7) / 10,) if request.sampling.logprobs else (),
                    text=text,
                    finish_reason=("stop" if stopped else finish) if last else None,
                    replica_id=replica,
                )
                if stopped:
                    return
        finally:
            self._running.pop(request.request_id, None)
            self._in_flight[replica] -= 1

    async def abort(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        self._changed.set()
        ev = self._running.get(request_id)
        if ev is None:
            return False
        ev.set()
        return True

    @property
    def weights_path(self) -> Path | None:
        return self._weights_dir

    async def load_weights(self, checkpoint: Path, *, policy_version: str = "") -> list[str]:
        if self._weights_dir is None:
            return await super().load_weights(checkpoint, policy_version=policy_version)
        if self._running:  # the gateway drains them first
            raise AssertionError(f"weights loaded while {len(self._running)} requests run")
        failures: dict[str, str] = {}
        for replica in self.replica_ids:
            try:
                if self.weight_load_hook is not None:
                    self.weight_load_hook(replica, checkpoint)
                self.loaded_weights[replica] = checkpoint
            except Exception as exc:
                failures[replica] = str(exc) or type(exc).__name__
        self.weight_loads += 1
        if failures:
            self.loaded_weights = dict.fromkeys(self.replica_ids, self._weights_dir)
            listed = "; ".join(f"{r}: {e}" for r, e in failures.items())
            raise WeightLoadFailed(
                f"{len(failures)} of {len(self.replica_ids)} replicas failed to load {checkpoint}: {listed}"
                f"; every replica serves {self._weights_dir} again",
                metadata={"replica_errors": listed},
            )
        self._weights_dir = checkpoint
        self._served_version = policy_version
        return list(self.replica_ids)

    async def replicas(self) -> list[ReplicaStatus]:
        return [
            ReplicaStatus(
                replica_id=r,
                healthy=not self.down,
                in_flight=self._in_flight[r],
                weights_id=self.loaded_weights[r].name if self.weight_loads else "",
                policy_version=self._served_version,
            )
            for r in self.replica_ids
        ]
