"""Shared fakes for tests and benchmarks: gRPC servicers for the ModelGateway and the
EnvironmentVerifier with scripted, instant (or delayed) answers and injectable failures, plus
in-memory sinks. Anyone may import them.

    gw = FakeGateway(latency_s=0.0)                 # answers "What is A + B?" correctly
    gw.faults.fail("Generate", grpc.StatusCode.UNAVAILABLE, times=3)
    server = await start_server([gw.binding(), FakeVerifier().binding()])

Tokens are one id per character (ord % 50_000); a session keeps the ids of its earlier turns,
so each turn's prompt extends the previous one, as the real gateway does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import AsyncIterator
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import TypeVar

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2
from google.rpc import error_details_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.errors import to_status
from rollmesh.mesh.multiplex import Item
from rollmesh.mesh.multiplex import run_multiplexed_batches
from rollmesh.mesh.server import ServiceBinding
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.sinks.base import MetricsOf
from rollmesh.scheduler.sinks.base import Sink
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import gateway_pb2_grpc
from rollmesh_client.v1 import verifier_pb2
from rollmesh_client.v1 import verifier_pb2_grpc

Json = dict[str, Any]
R = TypeVar("R")
ARITH_RE = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")


def encode(text: str) -> list[int]:
    return [ord(c) % 50_000 for c in text]


def solve(text: str) -> str:
    """The right answer to 'What is A + B?' (or A - B, A * B); '' when there is no expression."""
    m = ARITH_RE.search(text)
    if not m:
        return ""
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


# ---- fault injection ---------------------------------------------------------------------------


@dataclass
class Fault:
    code: grpc.StatusCode
    times: int  # -1 = until cleared
    message: str = "injected fault"
    retry_after_s: float | None = None
    delay_s: float = 0.0  # sleep before failing (or before answering when code is OK)


class Faults:
    """Per-method injected failures: `fail("Verify", UNAVAILABLE, times=2)`, `delay("Verify", 5.0)`."""

    def __init__(self) -> None:
        self._by_method: dict[str, Fault] = {}
        self.calls: dict[str, int] = {}
        self.failed: dict[str, int] = {}

    def fail(
        self,
        method: str,
        code: grpc.StatusCode,
        *,
        times: int = 1,
        message: str = "injected fault",
        retry_after_s: float | None = None,
    ) -> None:
        self._by_method[method] = Fault(code, times, message, retry_after_s)

    def delay(self, method: str, seconds: float, *, times: int = -1) -> None:
        self._by_method[method] = Fault(grpc.StatusCode.OK, times, delay_s=seconds)

    def clear(self, method: str | None = None) -> None:
        if method is None:
            self._by_method.clear()
        else:
            self._by_method.pop(method, None)

    async def check(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        status = await self.injected(method)
        if status is not None:
            await context.abort_with_status(rpc_status.to_status(status))

    async def injected(self, method: str) -> status_pb2.Status | None:
        """Count the call, apply an injected delay; the injected error's Status, if any."""
        self.calls[method] = self.calls.get(method, 0) + 1
        fault = self._by_method.get(method)
        if fault is None or fault.times == 0:
            return None
        if fault.times > 0:
            fault.times -= 1
        if fault.delay_s:
            await asyncio.sleep(fault.delay_s)
        if fault.code == grpc.StatusCode.OK:
            return None
        self.failed[method] = self.failed.get(method, 0) + 1
        status = status_pb2.Status(code=fault.code.value[0], message=fault.message)
        info = error_details_pb2.ErrorInfo(reason=fault.code.name, domain="rollmesh.dev")
        status.details.add().Pack(info)
        if fault.retry_after_s is not None:
            d = duration_pb2.Duration()
            d.FromNanoseconds(int(fault.retry_after_s * 1e9))
            status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=d))
        return status


def _status(code: int, reason: str, message: str) -> status_pb2.Status:
    status = status_pb2.Status(code=code, message=message)
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason=reason, domain="rollmesh.dev"))
    return status


async def _abort(context: grpc.aio.ServicerContext[Any, Any], code: int, reason: str, message: str) -> None:
    await context.abort_with_status(rpc_status.to_status(_status(code, reason, message)))


async def _answer_many(
    items: AsyncIterator[Item[R]],
) -> AsyncIterator[tuple[str, R | status_pb2.Status]]:
    """A fake's multiplexed stream (VerifyBatch, GenerateMany): the product's
    `run_multiplexed_batches`, with work that returns its answer or an injected error's Status (it
    never raises)."""
    async for batch in run_multiplexed_batches(items, limit=65_536, what="fake"):
        for item_id, out in batch:
            yield item_id, (to_status(out) if isinstance(out, RollmeshError) else out)


async def _unimplemented(context: Any) -> None:
    await _abort(context, code_pb2.UNIMPLEMENTED, "UNIMPLEMENTED", "not implemented by this fake")


# ---- gateway -----------------------------------------------------------------------------------

# A script gets (request, turn index within the session) and returns the assistant message as a dict:
# {"content": str, "tool_calls": [{"name": str, "arguments": dict}]}.
Script = Callable[[gateway_pb2.GenerateRequest, int], Json]


def arithmetic_script(req: gateway_pb2.GenerateRequest, turn: int) -> Json:
    last_user = next((m.content for m in reversed(req.messages) if m.role == "user"), "")
    return {"content": solve(last_user)}


def counter_tool_script(req: gateway_pb2.GenerateRequest, turn: int) -> Json:
    """session_state-like flow: increment twice (by the two numbers asked), then read and answer."""
    last_user = next((m.content for m in reversed(req.messages) if m.role == "user"), "")
    nums = [int(x) for x in re.findall(r"-?\d+", last_user)][:2] or [1, 1]
    if turn < len(nums):
        return {"content": "", "tool_calls": [{"name": "increment", "arguments": {"by": nums[turn]}}]}
    if turn == len(nums):
        return {"content": "", "tool_calls": [{"name": "get_count", "arguments": {}}]}
    tool_out = next((m.content for m in reversed(req.messages) if m.role == "tool"), "")
    return {"content": tool_out}


class FakeGateway(gateway_pb2_grpc.ModelGatewayServicer):
    """A ModelGateway with scripted answers, optional latency and injectable faults."""

    def __init__(
        self, *, script: Script = arithmetic_script, latency_s: float = 0.0, policy_version: str = "v0"
    ):
        self.script = script
        self.latency_s = latency_s
        self.policy_version = policy_version
        self.faults = Faults()
        self.sessions: dict[str, tuple[list[int], int, int]] = {}  # id -> (kept ids, messages sent, turns)
        self.in_flight = 0
        self.peak_in_flight = 0
        self.generated = 0

    def binding(self) -> ServiceBinding:
        return ServiceBinding.of(self)

    async def Generate(
        self, request: gateway_pb2.GenerateRequest, context: Any
    ) -> gateway_pb2.GenerateResponse:
        out = await self._answer(request)
        if isinstance(out, status_pb2.Status):
            await context.abort_with_status(rpc_status.to_status(out))
            raise AssertionError("unreachable")
        return out

    async def GenerateMany(  # type: ignore[override]
        self, request_iterator: AsyncIterator[gateway_pb2.GenerateManyRequest], context: Any
    ) -> AsyncIterator[gateway_pb2.GenerateManyResponse]:
        async def items() -> AsyncIterator[Item[gateway_pb2.GenerateResponse | status_pb2.Status]]:
            async for req in request_iterator:
                is_request = req.WhichOneof("item") == "request"
                yield Item(req.id, functools.partial(self._answer, req.request) if is_request else None)

        async for item_id, out in _answer_many(items()):
            if isinstance(out, status_pb2.Status):
                yield gateway_pb2.GenerateManyResponse(id=item_id, error=out)
            else:
                yield gateway_pb2.GenerateManyResponse(id=item_id, response=out)

    async def _answer(
        self, request: gateway_pb2.GenerateRequest
    ) -> gateway_pb2.GenerateResponse | status_pb2.Status:
        """The scripted answer, or the Status of an injected fault or a bad request."""
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            status = await self.faults.injected("Generate")
            if status is not None:
                return status
            if request.sampling.HasField("max_tokens") and request.sampling.max_tokens <= 0:
                return _status(code_pb2.INVALID_ARGUMENT, "INVALID_SAMPLING", "max_tokens must be > 0")
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            kept, sent, turn = self.sessions.get(request.session_id, ([], 0, 0))
            new_text = "".join(f"<{m.role}>{m.content}" for m in request.messages[sent:])
            prompt = [*kept, *encode(new_text)]
            answer = self.script(request, turn)
            msg = common_pb2.ChatMessage(role="assistant", content=str(answer.get("content", "")))
            for i, call in enumerate(answer.get("tool_calls", [])):
                msg.tool_calls.add(
                    id=f"call_{turn}_{i}", name=call["name"], arguments_json=json.dumps(call["arguments"])
                )
            out_text = msg.content + "".join(f"[{c.name}{c.arguments_json}]" for c in msg.tool_calls)
            output = encode(out_text) or [0]
            if request.session_id:
                self.sessions[request.session_id] = ([*prompt, *output], len(request.messages) + 1, turn + 1)
            self.generated += 1
            return gateway_pb2.GenerateResponse(
                message=msg,
                prompt_token_ids=prompt,
                output_token_ids=output,
                logprobs=[-0.5] * len(output) if request.sampling.logprobs else [],
                finish_reason="tool_calls" if msg.tool_calls else "stop",
                usage=common_pb2.Usage(
                    prompt_tokens=len(prompt),
                    completion_tokens=len(output),
                    total_tokens=len(prompt) + len(output),
                ),
                replica_id="fake-0",
                policy_version=self.policy_version,
                model=request.model or "fake",
                request_id=request.request_id,
                reused_prefix_tokens=len(kept),
            )
        finally:
            self.in_flight -= 1

    async def CloseSession(
        self, request: gateway_pb2.CloseGatewaySessionRequest, context: Any
    ) -> gateway_pb2.CloseGatewaySessionResponse:
        await self.faults.check("CloseSession", context)
        return gateway_pb2.CloseGatewaySessionResponse(
            closed=self.sessions.pop(request.session_id, None) is not None
        )

    # Not used by the scheduler: UNIMPLEMENTED (defined so the servicer is concrete for mypy).
    async def GenerateStream(  # type: ignore[override]
        self, request: Any, context: Any
    ) -> Any:
        await _unimplemented(context)

    async def ListModels(self, request: Any, context: Any) -> Any:
        await _unimplemented(context)

    async def Abort(self, request: Any, context: Any) -> Any:
        await _unimplemented(context)

    async def SetPolicyVersion(self, request: Any, context: Any) -> Any:
        await _unimplemented(context)

    async def PauseGeneration(self, request: Any, context: Any) -> Any:
        await _unimplemented(context)

    async def ResumeGeneration(self, request: Any, context: Any) -> Any:
        await _unimplemented(context)

    async def RegisterRoute(self, request: Any, context: Any) -> Any:
        await _unimplemented(context)

    async def UpdateWeights(self, request: Any, context: Any) -> Any:
        await _unimplemented(context)

    async def UploadWeights(self, request_iterator: Any, context: Any) -> Any:
        await _unimplemented(context)

    async def OpenCapture(self, request: Any, context: Any) -> Any:
        await _unimplemented(context)

    async def CloseCapture(self, request: Any, context: Any) -> Any:
        await _unimplemented(context)


# ---- verifier ----------------------------------------------------------------------------------

COUNTER_TOOLS = [
    common_pb2.ToolSpec(
        name="increment",
        description="Add `by` to the session's counter.",
        parameters_json=json.dumps(
            {"type": "object", "properties": {"by": {"type": "integer"}}, "required": ["by"]}
        ),
    ),
    common_pb2.ToolSpec(
        name="get_count", description="The counter's value.", parameters_json=json.dumps({"type": "object"})
    ),
]
ENVIRONMENTS: dict[str, list[common_pb2.ToolSpec]] = {"arithmetic": [], "session_state": COUNTER_TOOLS}


class FakeVerifier(verifier_pb2_grpc.EnvironmentVerifierServicer):
    """`arithmetic` (reward 1 when the last assistant content equals expected_answer) and
    `session_state` (a per-session counter with increment/get_count tools)."""

    def __init__(self) -> None:
        self.faults = Faults()
        self.sessions: dict[str, Json] = {}
        self.seeded = 0
        self.closed = 0

    def binding(self) -> ServiceBinding:
        return ServiceBinding.of(self)

    async def GetEnvironment(
        self, request: verifier_pb2.GetEnvironmentRequest, context: Any
    ) -> verifier_pb2.Environment:
        await self.faults.check("GetEnvironment", context)
        if request.name not in ENVIRONMENTS:
            await _abort(
                context, code_pb2.NOT_FOUND, "ENVIRONMENT_NOT_FOUND", f"no environment {request.name!r}"
            )
        return verifier_pb2.Environment(name=request.name, tools=ENVIRONMENTS[request.name])

    async def SeedSession(
        self, request: verifier_pb2.SeedSessionRequest, context: Any
    ) -> verifier_pb2.SeedSessionResponse:
        await self.faults.check("SeedSession", context)
        if request.environment not in ENVIRONMENTS:
            await _abort(
                context,
                code_pb2.NOT_FOUND,
                "ENVIRONMENT_NOT_FOUND",
                f"no environment {request.environment!r}",
            )
        if request.session_id in self.sessions:
            await _abort(
                context, code_pb2.ALREADY_EXISTS, "SESSION_EXISTS", f"session {request.session_id} is open"
            )
        self.sessions[request.session_id] = {"env": request.environment, "count": 0}
        self.seeded += 1
        return verifier_pb2.SeedSessionResponse(
            session_id=request.session_id, tools=ENVIRONMENTS[request.environment], ttl_seconds=600
        )

    async def CallTool(
        self, request: verifier_pb2.CallToolRequest, context: Any
    ) -> verifier_pb2.CallToolResponse:
        await self.faults.check("CallTool", context)
        state = self.sessions.get(request.session_id)
        if state is None:
            await _abort(context, code_pb2.NOT_FOUND, "SESSION_NOT_FOUND", f"no session {request.session_id}")
            raise AssertionError("unreachable")
        args = json.loads(request.call.arguments_json or "{}")
        if request.call.name == "increment":
            state["count"] += int(args.get("by", 1))
            out = json.dumps({"count": state["count"]})
        elif request.call.name == "get_count":
            out = str(state["count"])
        else:
            await _abort(context, code_pb2.NOT_FOUND, "TOOL_NOT_FOUND", f"no tool {request.call.name!r}")
            raise AssertionError("unreachable")
        return verifier_pb2.CallToolResponse(tool_call_id=request.call.id, output=out)

    async def Step(self, request: verifier_pb2.StepRequest, context: Any) -> verifier_pb2.StepResponse:
        await self.faults.check("Step", context)
        await _abort(
            context,
            code_pb2.FAILED_PRECONDITION,
            "ENVIRONMENT_TAKES_NO_TURNS",
            "no environment here takes turns",
        )
        raise AssertionError("unreachable")

    async def Verify(self, request: verifier_pb2.VerifyRequest, context: Any) -> verifier_pb2.VerifyResponse:
        await self.faults.check("Verify", context)
        return verifier_pb2.VerifyResponse(result=self._verdict(request))

    @staticmethod
    def _verdict(request: verifier_pb2.VerifyRequest) -> verifier_pb2.VerifyResult:
        task = json.loads(request.task_json)
        answer = next((m.content for m in reversed(request.response.messages) if m.role == "assistant"), "")
        expected = str(task.get("expected_answer", ""))
        extracted = answer.strip()
        reward = 1.0 if extracted == expected else 0.0
        return verifier_pb2.VerifyResult(
            reward=reward,
            components={"correct": reward},
            extracted_answer=extracted,
            details_json=json.dumps({"expected": expected}),
        )

    async def VerifyGroup(
        self, request: verifier_pb2.VerifyGroupRequest, context: Any
    ) -> verifier_pb2.VerifyGroupResponse:
        """No environment here scores groups (as the verifier answers for such an environment)."""
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"{request.environment!r} does not score groups"
        )
        raise AssertionError("unreachable")

    async def CloseSession(
        self, request: verifier_pb2.CloseSessionRequest, context: Any
    ) -> verifier_pb2.CloseSessionResponse:
        await self.faults.check("CloseSession", context)
        if self.sessions.pop(request.session_id, None) is None:
            await _abort(context, code_pb2.NOT_FOUND, "SESSION_NOT_FOUND", f"no session {request.session_id}")
        self.closed += 1
        return verifier_pb2.CloseSessionResponse()

    async def ListEnvironments(self, request: Any, context: Any) -> Any:
        await _unimplemented(context)

    async def VerifyBatch(  # type: ignore[override]
        self, request_iterator: AsyncIterator[verifier_pb2.VerifyBatchRequest], context: Any
    ) -> AsyncIterator[verifier_pb2.VerifyBatchResponse]:
        """Items verified concurrently, answered in completion order; a fault injected on "Verify"
        applies to each item (its error comes back as that item's Status, the stream goes on)."""

        async def items() -> AsyncIterator[Item[verifier_pb2.VerifyResult | status_pb2.Status]]:
            async for req in request_iterator:
                yield Item(req.id, functools.partial(self._verify_item, req.request))

        async for item_id, out in _answer_many(items()):
            if isinstance(out, status_pb2.Status):
                yield verifier_pb2.VerifyBatchResponse(id=item_id, error=out)
            else:
                yield verifier_pb2.VerifyBatchResponse(id=item_id, result=out)

    async def _verify_item(
        self, request: verifier_pb2.VerifyRequest
    ) -> verifier_pb2.VerifyResult | status_pb2.Status:
        status = await self.faults.injected("Verify")
        return status if status is not None else self._verdict(request)


# ---- sinks -------------------------------------------------------------------------------------


class MemorySink(Sink):
    """Keeps everything in lists; `existing` pretends earlier runs wrote those keys."""

    def __init__(self, existing: set[RolloutKey] | None = None) -> None:
        self.existing = set(existing or ())
        self.rollouts: list[Rollout] = []
        self.failures: list[RolloutFailure] = []
        self.closed_state: str | None = None
        self.metrics: dict[str, Any] | None = None

    async def open(self, job_id: str, *, total: int, spec: dict[str, Any]) -> set[RolloutKey]:
        return set(self.existing)

    async def write(self, rollout: Rollout) -> None:
        keys = {r.key for r in self.rollouts} | self.existing
        if rollout.key in keys:
            raise AssertionError(f"key {rollout.key} written twice")
        self.rollouts.append(rollout)

    async def write_failure(self, failure: RolloutFailure) -> None:
        self.failures.append(failure)

    async def close(self, *, state: str, metrics: MetricsOf | None) -> None:
        self.closed_state = state
        self.metrics = metrics() if metrics is not None else None


class SlowSink(MemorySink):
    """Acknowledges `rate` rollouts per second with at most `window` unacknowledged: `write` returns
    once there is room, which is the backpressure. `keep=False` counts acknowledged rollouts in
    `acked` and lets them go, like a trainer that consumes them (memory benchmarks)."""

    def __init__(self, rate: float, window: int, *, keep: bool = True) -> None:
        super().__init__()
        self.rate = rate
        self.window = window
        self.keep = keep
        self.acked = 0
        self._unacked: asyncio.Queue[Rollout] = asyncio.Queue(maxsize=window)
        self.peak_unacked = 0
        self._acker: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        return self._unacked.qsize()

    async def open(self, job_id: str, *, total: int, spec: dict[str, Any]) -> set[RolloutKey]:
        self._acker = asyncio.create_task(self._ack())
        return set()

    async def _ack(self) -> None:
        while True:
            r = await self._unacked.get()
            await asyncio.sleep(1.0 / self.rate)
            self.acked += 1
            if self.keep:
                self.rollouts.append(r)
            self._unacked.task_done()

    async def write(self, rollout: Rollout) -> None:
        await self._unacked.put(rollout)
        self.peak_unacked = max(self.peak_unacked, self._unacked.qsize())

    async def close(self, *, state: str, metrics: MetricsOf | None) -> None:
        if self._acker is not None:
            if state == "SUCCEEDED":
                await self._unacked.join()
            self._acker.cancel()
            await asyncio.gather(self._acker, return_exceptions=True)
        await super().close(state=state, metrics=metrics)


@dataclass
class Rows:
    """Helper to write a small JSONL dataset for tests."""

    rows: list[Json] = field(default_factory=list)

    @classmethod
    def arithmetic(cls, n: int) -> Rows:
        return cls(
            [
                {
                    "responses_create_params": {
                        "input": [{"role": "user", "content": f"What is {i} + {i + 1}?"}]
                    },
                    "expected_answer": str(2 * i + 1),
                    "task_id": f"arith-{i:04d}",
                }
                for i in range(n)
            ]
        )

    def write(self, path: Any) -> Any:
        with open(path, "w") as f:
            for r in self.rows:
                f.write(json.dumps(r) + "\n")
        return path


# ---- in-process ports (unit tests: no server) ----------------------------------------------------


class LocalModel:
    """ModelPort without gRPC: same answers and session token bookkeeping as FakeGateway.

    `errors` is a list of exceptions raised by the next generate calls, in order."""

    def __init__(
        self, script: Script = arithmetic_script, *, latency_s: float = 0.0, capacity: int = 0
    ) -> None:
        self._gw = FakeGateway(script=script)
        self.latency_s = latency_s
        self.capacity = capacity  # what engine_capacity reports
        self.errors: list[BaseException] = []
        self.closed: list[str] = []
        self.calls: list[Any] = []
        self.in_flight = 0
        self.peak_in_flight = 0

    async def generate(self, call: Any) -> Any:
        from rollmesh.scheduler.remote import generate_request
        from rollmesh.scheduler.remote import turn_of

        self.calls.append(call)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            if self.errors:
                raise self.errors.pop(0)
            resp = await self._gw.Generate(generate_request(call), None)
            return turn_of(resp)
        finally:
            self.in_flight -= 1

    async def close_session(self, session_id: str) -> None:
        self.closed.append(session_id)
        self._gw.sessions.pop(session_id, None)

    async def engine_capacity(self, model: str) -> int:
        return self.capacity

    @property
    def open_sessions(self) -> int:
        return len(self._gw.sessions)


class LocalEnv:
    """EnvPort without gRPC: `arithmetic` and `session_state` like FakeVerifier.

    `verify_errors` are raised by the next verify calls, in order."""

    def __init__(self) -> None:
        self.sessions: dict[str, Json] = {}
        self.verify_errors: list[BaseException] = []
        self.tool_calls: list[Json] = []
        self.closed: list[str] = []

    async def environment_tools(self, environment: str) -> list[Json]:
        from rollmesh.mesh.errors import NotFound

        if environment not in ENVIRONMENTS:
            raise NotFound(f"no environment {environment!r}")
        return [self._tool(t) for t in ENVIRONMENTS[environment]]

    async def describe_environment(self, environment: str) -> Any:
        from rollmesh.scheduler.drivers.agent_loop import EnvDescription

        return EnvDescription(tools=await self.environment_tools(environment), stateless=False)

    @staticmethod
    def _tool(t: common_pb2.ToolSpec) -> Json:
        return {"name": t.name, "description": t.description, "parameters": json.loads(t.parameters_json)}

    async def seed_session(self, environment: str, task: Json, session_id: str) -> Any:
        from rollmesh.scheduler.drivers.agent_loop import SessionOpened

        tools = await self.environment_tools(environment)
        assert session_id not in self.sessions, f"session {session_id} seeded twice"
        self.sessions[session_id] = {"count": 0}
        return SessionOpened(tools=tools)

    async def step(self, session_id: str, messages: list[Json]) -> Any:
        from rollmesh.mesh.errors import FailedPrecondition

        raise FailedPrecondition("no environment here takes turns")

    async def call_tool(self, session_id: str, call: Json) -> Any:
        from rollmesh.scheduler.drivers.agent_loop import ToolResult

        self.tool_calls.append(call)
        state = self.sessions[session_id]
        fn = call["function"]
        args = json.loads(fn["arguments"] or "{}")
        if fn["name"] == "increment":
            state["count"] += int(args.get("by", 1))
            return ToolResult(json.dumps({"count": state["count"]}))
        return ToolResult(str(state["count"]))

    async def verify(self, environment: str, task: Json, messages: list[Json], session_id: str) -> Any:
        from rollmesh.mesh.verify_result import VerifyResult

        if self.verify_errors:
            raise self.verify_errors.pop(0)
        answer = next((m["content"] for m in reversed(messages) if m["role"] == "assistant"), "")
        ok = answer.strip() == str(task.get("expected_answer", ""))
        return VerifyResult(reward=1.0 if ok else 0.0, extracted_answer=answer.strip())

    async def close_session(self, session_id: str) -> None:
        self.closed.append(session_id)
        self.sessions.pop(session_id, None)
