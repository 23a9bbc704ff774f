"""One run of a job: pull keys, run each rollout under the concurrency bound, write it to the sink.

Backpressure end to end: the producer takes the next key only when the limiter has room; a rollout
holds its slot until the sink accepted it, so a slow sink slows dispatch and nothing queues without
bound (no gather over all rollouts, no unbounded queue). Each key is written once: either a Rollout or,
after every retry, a RolloutFailure. A sink that cannot store a row stops the run at once (FAILED,
with the sink's reason). A gateway or verifier that stays unreachable (no call getting through)
(or hangs: answers none of the calls waiting on it, nor a health check; watchdog.py) for
`retry.unavailable_budget_s` stops the run (FAILED); shorter outages (a restart, a stall) cost no
rollouts: their rollouts wait and carry on (retry.py, `Outages`).

Group scoring (an environment whose `scores_groups`: a reward that depends on the other rollouts of
the task): a task's `num_repeats` rollouts are dispatched together, each runs its loop without
verifying and is held (its verifier session open) without its slot until the last is done; that one
verifies them together (`EnvPort.verify_group`, retried as a rollout is) and writes their rows in one
sink call (`Sink.write_group`: one batch of the JSONL sink, so a crash stores all of a group or none).
No row is ever written without its group's verdict. A rollout that failed fails its group: it with its
class, the others with GroupMemberFailed (never counted toward fail fast); a resumed job runs the
whole group again. A group found partly stored on resume (a torn write, a row too large for the sink)
fails its missing keys (GroupPartlyStored) instead of scoring them against another group.

A run that dispatched every key ends in the state `outcome.final_state` gives it (SUCCEEDED only
when its permanent failures are within the job's bound); the same non-retryable error class on
`retry.fail_fast_after` rollouts in a row stops it at once (FAILED, naming that class).
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import time
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from functools import partial
from typing import Any
from typing import TypeVar
from typing import cast

from rollmesh.mesh import tracing
from rollmesh.mesh.aio import TaskSet
from rollmesh.mesh.confine import UidLeases
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.scheduler import telemetry
from rollmesh.scheduler.concurrency import HostCpu
from rollmesh.scheduler.concurrency import Limiter
from rollmesh.scheduler.deadline import AdaptiveDeadline
from rollmesh.scheduler.drivers.agent_loop import AgentOutcome
from rollmesh.scheduler.drivers.agent_loop import AgentSettings
from rollmesh.scheduler.drivers.agent_loop import EnvDescription
from rollmesh.scheduler.drivers.agent_loop import EnvPort
from rollmesh.scheduler.drivers.agent_loop import EnvStep
from rollmesh.scheduler.drivers.agent_loop import GenerateCall
from rollmesh.scheduler.drivers.agent_loop import GroupMember
from rollmesh.scheduler.drivers.agent_loop import Json
from rollmesh.scheduler.drivers.agent_loop import ModelPort
from rollmesh.scheduler.drivers.agent_loop import Responsive
from rollmesh.scheduler.drivers.agent_loop import SessionOpened
from rollmesh.scheduler.drivers.agent_loop import ToolResult
from rollmesh.scheduler.drivers.agent_loop import Turn
from rollmesh.scheduler.drivers.agent_loop import close_sessions
from rollmesh.scheduler.drivers.agent_loop import run_agent
from rollmesh.scheduler.drivers.hosts import program_host
from rollmesh.scheduler.drivers.oracle import run_oracle
from rollmesh.scheduler.drivers.program import CaptureOpened
from rollmesh.scheduler.drivers.program import CaptureRecord
from rollmesh.scheduler.drivers.program import ProgramModel
from rollmesh.scheduler.drivers.program import ProgramSpec
from rollmesh.scheduler.drivers.program import run_program
from rollmesh.scheduler.drivers.tool_endpoint import ToolEndpoint
from rollmesh.scheduler.errors import ErrorClass
from rollmesh.scheduler.errors import GatewayUnresponsive
from rollmesh.scheduler.errors import GroupMemberFailed
from rollmesh.scheduler.errors import GroupPartlyStored
from rollmesh.scheduler.errors import GroupReplaced
from rollmesh.scheduler.errors import ModelCallDeadline
from rollmesh.scheduler.errors import ReplacementsExhausted
from rollmesh.scheduler.errors import RolloutFailed
from rollmesh.scheduler.errors import RolloutTooLarge
from rollmesh.scheduler.errors import TokenRecordMismatch
from rollmesh.scheduler.metrics import Scored
from rollmesh.scheduler.metrics import measured_reward
from rollmesh.scheduler.outcome import FailFast
from rollmesh.scheduler.outcome import FailureTally
from rollmesh.scheduler.outcome import final_state
from rollmesh.scheduler.plan import Plan
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.refill import Group
from rollmesh.scheduler.refill import Refill
from rollmesh.scheduler.retry import Backoff
from rollmesh.scheduler.retry import Outages
from rollmesh.scheduler.retry import with_retry
from rollmesh.scheduler.sinks.base import Sink
from rollmesh.scheduler.timing import CURRENT as CURRENT_TIMING
from rollmesh.scheduler.timing import Reservoir
from rollmesh.scheduler.timing import RolloutTiming
from rollmesh.scheduler.timing import current as current_timing
from rollmesh.scheduler.tokens import build_token_record
from rollmesh.scheduler.tokens import validate_rollout
from rollmesh.scheduler.watchdog import GATEWAY
from rollmesh.scheduler.watchdog import VERIFIER
from rollmesh.scheduler.watchdog import Probe
from rollmesh.scheduler.watchdog import Watchdog

log = get_logger("rollmesh.scheduler.engine")
T = TypeVar("T")

AUTO_START, AUTO_MAX = 16, 1024
# Automatic concurrency starts at this many times the engines' batch capacity: a rollout spends part
# of its life outside the engine (the micro-batch linger, the gateway, the verifier, the sink), so
# filling every batch slot takes more rollouts in flight than slots; vLLM queues the rest at no cost
# (short answers, 1 replica of 256 slots: 378 rollouts/s starting at 256, 693/s at 512, one run).
CAPACITY_HEADROOM = 2
# An external agent program's share of an attempt's `rollout_timeout_s` (the rest: closing, verify).
PROGRAM_SHARE_OF_ATTEMPT = 0.9
# Automatic concurrency of a job of agent programs: they run on this host, so its cores bound them
# (concurrency.py HostCpu); it starts at this many per core and grows while the cores have room.
PROGRAM_START_PER_CORE = 2
# Token records checked by default: one rollout in VALIDATE_EVERY (all with JobSpec.validate_all).
VALIDATE_EVERY = 16

TokenBuilder = Callable[[list[Turn]], TokenRecord]


@dataclass
class Progress:
    total: int = 0
    done: int = 0
    succeeded: int = 0
    failed: int = 0
    in_flight: int = 0
    skipped_existing: int = 0
    reward_sum: float = 0.0  # over the measured succeeded rollouts (metrics.measured_reward)
    masked: int = 0  # succeeded rollouts whose verdict was masked: in no reward figure
    retries: int = 0
    completion_tokens: int = 0
    waiting_on: str = ""  # services unreachable, a stalled sink, right now (JobRun.progress_now)
    model_calls_cut: int = 0
    stale_dropped: int = 0  # written, then dropped by the trainer as stale: out of succeeded
    groups_replaced: int = 0  # failed groups replaced by fresh ones (JobSpec.replace_groups; refill.py)
    groups_short: int = 0  # failed groups that could not be replaced (the bound used up)
    replaced_rollouts: int = 0  # the rollouts of the replaced groups: written as failures, not `failed`
    started: float = 0.0
    ended: float | None = None

    @property
    def mean_reward(self) -> float:
        """Over the measured rollouts, as metrics.json's mean_reward (masked ones left out)."""
        measured = self.succeeded - self.masked
        return self.reward_sum / measured if measured > 0 else 0.0

    def add_reward(self, reward: float | None, sign: int = 1) -> None:
        """Count a succeeded rollout's `metrics.measured_reward` in (sign 1) or out (sign -1)."""
        if reward is None:
            self.masked += sign
        else:
            self.reward_sum += sign * reward

    def elapsed(self, now: float) -> float:
        return max((self.ended or now) - self.started, 1e-9) if self.started else 0.0

    def rates(self, now: float) -> tuple[float, float]:
        """(rollouts/s, generated tokens/s) over this run."""
        el = self.elapsed(now)
        return (self.done / el, self.completion_tokens / el) if el else (0.0, 0.0)


@dataclass
class RunResult:
    state: str  # SUCCEEDED, COMPLETED_WITH_FAILURES, FAILED or CANCELLED (outcome.FINAL_STATES)
    error: str = ""


@dataclass
class Hooks:
    """Callbacks the manager wires in; all optional."""

    on_rollout: Callable[[Rollout], None] | None = None
    on_failure: Callable[[RolloutFailure], None] | None = None
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    rand: Callable[[], float] = random.random
    clock: Callable[[], float] = time.monotonic
    token_builder: TokenBuilder | None = None


class _WatchedModel:
    """The model port as the job sees it: each call under the adaptive deadline (deadline.py) and the
    watchdog (the gateway reachable or not, cut when it hangs), each turn's latency fed to the
    adaptive limiter (when there is one)."""

    def __init__(
        self,
        inner: ModelPort,
        watchdog: Watchdog,
        deadline: AdaptiveDeadline,
        limiter: Limiter | None,
        clock: Callable[[], float],
    ) -> None:
        self._inner, self._watchdog, self._outages = inner, watchdog, watchdog.outages
        self._deadline, self._limiter, self._clock = deadline, limiter, clock
        self._in_flight = 0

    async def generate(self, call: GenerateCall) -> Turn:
        if not tracing.in_sampled_trace():  # (the common case: no span bookkeeping at all)
            return await self._generate(call)
        sampling = call.sampling
        attributes = {
            **tracing.rpc("rollmesh.v1.ModelGateway", "Generate"),
            **tracing.gen_ai_request(
                call.model,
                temperature=sampling.get("temperature"),
                top_p=sampling.get("top_p"),
                max_tokens=sampling.get("max_tokens"),
            ),
            "rollmesh.request_id": call.request_id,
        }
        with tracing.span("model_turn", attributes, kind="client"):
            try:
                turn = await self._generate(call)
            except BaseException as exc:
                tracing.annotate(**{"rpc.grpc.status_code": tracing.grpc_status_code(telemetry.code_of(exc))})
                raise
            tracing.annotate(
                **tracing.gen_ai_response(
                    input_tokens=turn.prompt_tokens,
                    output_tokens=turn.completion_tokens,
                    finish_reason=turn.finish_reason,
                ),
                **{
                    "rpc.grpc.status_code": 0,
                    "rollmesh.replica_id": turn.replica_id,
                    "rollmesh.policy_version": turn.policy_version,
                },
            )
            return turn

    async def _generate(self, call: GenerateCall) -> Turn:
        t0 = self._clock()
        self._in_flight += 1
        try:
            async with self._deadline.guard():
                turn = await self._watchdog.watch(GATEWAY, self._inner.generate(call))
        except GatewayUnresponsive:
            raise
        except ModelCallDeadline as exc:
            # The gateway hangs, not this call (errors.GatewayUnresponsive); alone, it may just be long.
            hung = self._in_flight > 1 or GATEWAY in self._outages.down
            if hung and not self._outages.answered_since(GATEWAY, t0):
                self._outages.failed(GATEWAY, since=t0)
                raise GatewayUnresponsive(
                    f"the gateway answered no call for {self._clock() - t0:.1f} s ({exc.message})"
                ) from exc
            raise
        finally:
            self._in_flight -= 1
        took = self._clock() - t0
        if self._limiter is not None:
            self._limiter.observe(took)
        if (timing := current_timing()) is not None:
            timing.model_s.append(took)
            if turn.first_token_s > 0:
                timing.first_token_s.append(turn.first_token_s)
        return turn

    async def close_session(self, session_id: str) -> None:  # best-effort cleanup: no evidence either way
        await self._inner.close_session(session_id)

    async def engine_capacity(self, model: str) -> int:
        return await self._inner.engine_capacity(model)

    async def open_capture(
        self, capture_id: str, *, model: str, sampling: Json, session_id: str
    ) -> CaptureOpened:
        port = cast(ProgramModel, self._inner)
        return await self._watchdog.watch(
            GATEWAY, port.open_capture(capture_id, model=model, sampling=sampling, session_id=session_id)
        )

    async def close_capture(self, capture_id: str) -> CaptureRecord:
        record = await self._watchdog.watch(
            GATEWAY, cast(ProgramModel, self._inner).close_capture(capture_id)
        )
        if (timing := current_timing()) is not None:
            timing.first_token_s.extend(
                c.turn.first_token_s for c in record.calls if c.turn.first_token_s > 0
            )
        return record


# Each verifier phase's span and the call it makes (rpc.method).
_SPANS = {
    "seed_s": ("seed_session", "SeedSession"),
    "tool_s": ("tool_call", "CallTool"),
    "env_step_s": ("env_step", "Step"),
    "verify_s": ("verify", "Verify"),
}


class _WatchedEnv:
    """The verifier port under the watchdog: reachable or not, cut when it hangs; each call's time in
    the rollout's phases (timing.py)."""

    def __init__(self, inner: EnvPort, watchdog: Watchdog, clock: Callable[[], float]) -> None:
        self._inner, self._watch, self._clock = inner, watchdog.watch, clock

    async def _timed(self, phase: str, call: Awaitable[T], attributes: Json | None = None) -> T:
        t0 = self._clock()
        if tracing.in_sampled_trace():
            name, method = _SPANS[phase]
            spanned = {**tracing.rpc("rollmesh.v1.EnvironmentVerifier", method), **(attributes or {})}
            with tracing.span(name, spanned, kind="client"):
                try:
                    result = await self._watch(VERIFIER, call)
                except BaseException as exc:
                    code = tracing.grpc_status_code(telemetry.code_of(exc))
                    tracing.annotate(**{"rpc.grpc.status_code": code})
                    raise
                tracing.annotate(**{"rpc.grpc.status_code": 0})
        else:
            result = await self._watch(VERIFIER, call)
        if (timing := current_timing()) is not None:
            timing.add(phase, self._clock() - t0)
        return result

    async def seed_session(self, environment: str, task: dict[str, Any], session_id: str) -> SessionOpened:
        return await self._timed("seed_s", self._inner.seed_session(environment, task, session_id))

    async def call_tool(self, session_id: str, call: Json) -> ToolResult:
        if not tracing.in_sampled_trace():
            return await self._timed("tool_s", self._inner.call_tool(session_id, call))
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": str(fn.get("name", "")) if isinstance(fn, dict) else "",
            "gen_ai.tool.call.id": str(call.get("id", "")),
        }
        return await self._timed("tool_s", self._inner.call_tool(session_id, call), attributes)

    async def step(self, session_id: str, messages: list[Json]) -> EnvStep:
        return await self._timed("env_step_s", self._inner.step(session_id, messages))

    async def verify(
        self, environment: str, task: Json, messages: list[Json], session_id: str
    ) -> VerifyResult:
        return await self._timed("verify_s", self._inner.verify(environment, task, messages, session_id))

    async def close_session(self, session_id: str) -> None:  # best-effort cleanup: no evidence either way
        await self._inner.close_session(session_id)

    async def verify_group(
        self, environment: str, task: Json, members: list[GroupMember]
    ) -> list[VerifyResult]:
        return await self._watch(VERIFIER, self._inner.verify_group(environment, task, members))

    async def describe_environment(self, environment: str) -> EnvDescription:
        return await self._watch(VERIFIER, self._inner.describe_environment(environment))


@dataclass
class _Member:
    """A rollout of a group, done and waiting for its group's verdict: built (its verdict pending),
    or failed (`error`); `env_session` is its verifier session, left open for the verdict."""

    key: RolloutKey
    attempts: int
    rollout: Rollout | None = None
    error: ErrorClass | None = None
    steps_reward: float = 0.0  # the environment's step rewards: the row's reward is these + the verdict's
    env_session: str = ""


@dataclass
class _Group:
    """The rollouts of one task of a group-scored environment, gathered until the last is done."""

    task_index: int
    size: int
    members: dict[int, _Member] = field(default_factory=dict)
    group: Group | None = None  # what refill.py made of it, when the job replaces failed groups


def _probe(port: object) -> Probe | None:
    return port.responsive if isinstance(port, Responsive) else None


class JobRun:
    """Runs the keys of a plan that the sink does not hold yet."""

    def __init__(
        self,
        job_id: str,
        plan: Plan,
        sink: Sink,
        *,
        model: ModelPort,
        env: EnvPort,
        hooks: Hooks | None = None,
        environment: EnvDescription | None = None,
        engine_capacity: int = 0,
    ) -> None:
        """`environment`: the environment's description, fetched once per job (None: assume it keeps
        per-session state, so every rollout opens a verifier session). `engine_capacity`: requests the
        model's engines run at once (0: unknown); automatic concurrency starts at CAPACITY_HEADROOM
        times that and never cuts below it (concurrency.py); a job of agent programs starts at
        PROGRAM_START_PER_CORE per core of this host and is bounded by its CPU instead."""
        self.job_id = job_id
        self.plan = plan
        self.sink = sink
        sink.on_unconsumed = self._unconsumed
        self.hooks = hooks or Hooks()
        self.policy = plan.spec.retry.with_defaults()
        conc = plan.spec.concurrency
        self.limiter = (
            Limiter(conc, max_limit=conc)
            if conc
            else Limiter(PROGRAM_START_PER_CORE * (os.cpu_count() or 1), adaptive=True, cpu=HostCpu())
            if plan.spec.agent_program
            else Limiter(
                CAPACITY_HEADROOM * engine_capacity or AUTO_START,
                adaptive=True,
                max_limit=AUTO_MAX,
                floor=engine_capacity,
            )
        )
        self.outages = Outages(self.policy.unavailable_budget_s, clock=self.hooks.clock)
        p = self.policy
        self.deadline = AdaptiveDeadline(
            multiplier=p.attempt_deadline_multiplier,
            floor_s=p.attempt_deadline_floor_s,
            ceiling_s=p.rollout_timeout_s,
            enabled=not p.fixed_attempt_deadline,
        )
        self.watchdog = Watchdog(
            self.outages, {GATEWAY: _probe(model), VERIFIER: _probe(env)}, silent_limit_s=p.rollout_timeout_s
        )
        self.model = _WatchedModel(
            model, self.watchdog, self.deadline, self.limiter if conc == 0 else None, self.hooks.clock
        )
        self.env: EnvPort = _WatchedEnv(env, self.watchdog, self.hooks.clock)
        self.backoff = Backoff(self.policy, rand=self.hooks.rand)
        self.settings = AgentSettings(
            environment=plan.spec.environment,
            model=plan.spec.model,
            max_steps=plan.max_steps,
            system_prompt=plan.spec.system_prompt,
            sampling=dict(plan.spec.sampling),
            stateless=environment is not None and environment.stateless,
            tool_calls_are_answer=environment is not None and environment.tool_calls_are_answer,
            group_verify=environment is not None and environment.scores_groups,
            public_fields=environment.public_fields if environment is not None else (),
        )
        # Group scoring: the tasks whose rollouts are gathered for their verdict (at most one per
        # rollout in flight, plus the one being dispatched: each holds a slot until its last is done).
        self._groups: dict[int, _Group] = {}
        # Keeping batches full (refill.py): every task is a group held until its last rollout is in;
        # a failed one is replaced. The producer runs what `_refills` brings (None: a group ended).
        self.refill: Refill | None = None
        self._replacing = bool(plan.spec.replace_groups)
        self._refills: asyncio.Queue[Group | None] = asyncio.Queue()
        self._open_groups = 0
        self._producing = False  # replacements (of stale groups too) run only while this is True
        self._stale_groups: set[tuple[int, int]] = set()
        if self._replacing:
            sink.on_stale = self._stale
        self.progress = Progress(total=plan.total)
        # An external agent program instead of the built-in loop (program.py), its tools on one endpoint.
        self.program = (
            ProgramSpec(
                argv=tuple(plan.spec.agent_program),
                env=dict(plan.spec.agent_program_env),
                timeout_s=self.policy.rollout_timeout_s * PROGRAM_SHARE_OF_ATTEMPT,
                after_s=self.policy.rollout_timeout_s * (1 - PROGRAM_SHARE_OF_ATTEMPT),
                # What holds the gold on this host: the program must not read it (program.py).
                hidden=tuple(
                    os.path.abspath(p)
                    for p in (str(plan.dataset_path), plan.spec.effective_output_dir)
                    if p not in ("", ".")
                ),
            )
            if plan.spec.agent_program
            else None
        )
        self.tool_endpoint = ToolEndpoint()
        self.program_uids = UidLeases()  # each program run's own uid (as root), leased host-wide
        # Where the job's program runs (drivers/hosts.py): a process per rollout, a warm interpreter
        # forking one per rollout, or one agent server.
        self.program_host = (
            program_host(plan.spec.agent_program_mode, self.program, self.program_uids)
            if self.program is not None
            else None
        )
        # What runs one attempt of a rollout: the built-in loop, or the job's program.
        self._drive = (
            run_agent
            if self.program is None
            else functools.partial(
                self._run_program, program=self.program, tools=self.tool_endpoint, host=self.program_host
            )
        )
        # What final metrics need of each rollout, kept only when the sink cannot be read back.
        self.scored: list[Scored] = []
        self.failures: list[RolloutFailure] = []
        self.tally = FailureTally()
        self._fail_fast = FailFast(self.policy.fail_fast_after)
        self._write_lock = asyncio.Lock()
        self._stop_reason: RunResult | None = None
        self._said_no_token_ids = False
        self._producer: asyncio.Task[None] | None = None
        self._tasks = TaskSet()
        wanted = bool(plan.spec.sampling.get("logprobs"))
        self._tokens = self.hooks.token_builder or partial(build_token_record, logprobs_wanted=wanted)
        self.keep_scored = True  # the manager turns this off when the sink keeps a file to read back
        sink.write_times = Reservoir()  # the run's sink write times (metrics.json's timing)
        self._sink_kind = telemetry.sink_kind(sink)
        self._sink_rows = telemetry.SINK_WRITES.labels(self._sink_kind, "rollout")
        self._sink_seconds = telemetry.SINK_WRITE_SECONDS.labels(self._sink_kind)

    @property
    def in_flight(self) -> int:
        return self.limiter.in_use

    def progress_now(self, *, finished: bool) -> Progress:
        """The progress with what is true at this moment: in flight, services waited on, calls cut."""
        p = self.progress
        p.in_flight = 0 if finished else self.in_flight
        p.waiting_on = (
            "" if finished else "; ".join(w for w in (self.outages.describe(), self.sink.waiting()) if w)
        )
        p.model_calls_cut = self.deadline.timeouts
        return p

    def refill_figures(self) -> dict[str, Any]:
        """metrics.json's figures of keeping batches full ({} when the job replaces no groups)."""
        r = self.refill
        if r is None:
            return {}
        return {
            "groups_replaced": r.replaced,
            "groups_short": r.short,
            "replacement_bound": r.bound,
            "replace_groups": r.mode,
        }

    def _stale(self, key: RolloutKey) -> None:
        """A trainer dropped a written rollout as stale: while the run still dispatches, its group is
        replaced (once per group) like a failed one. After the run's last group a stale drop stays
        one (counted in stale_dropped): the run does not wait for the trainer's verdicts."""
        if self.refill is None or not self._producing:
            return
        n = self.plan.num_repeats
        gen = key.rollout_index // n
        if (key.task_index, gen) in self._stale_groups:
            return
        self._stale_groups.add((key.task_index, gen))
        keys = tuple(RolloutKey(key.task_index, gen * n + r) for r in range(n))
        group = _Group(key.task_index, n, group=Group(key.task_index, gen, keys))
        fresh = self._replacement(group, reason="stale")
        if fresh is not None:
            self.progress.done -= n  # the fresh group's rows stand for these

    def _unconsumed(self, reward: float | None, stale: bool) -> None:
        p = self.progress
        p.succeeded -= 1
        p.add_reward(reward, -1)
        if stale:
            p.stale_dropped += 1
        else:
            p.done -= 1

    def stop(self, result: RunResult) -> None:
        """Stop dispatching and cancel rollouts in flight (what was written stays)."""
        if self._stop_reason is None:
            self._stop_reason = result
        if self._producer is not None:
            self._producer.cancel()

    async def open(self) -> set[RolloutKey]:
        existing = await self.sink.open(self.job_id, total=self.plan.total, spec=self.plan.spec.to_json())
        if self._replacing:
            self.refill = Refill(self.plan, existing)
            self.progress.skipped_existing = self.refill.skipped_rollouts
            return existing
        tasks = set(self.plan.task_indices)
        self.progress.skipped_existing = sum(
            1 for k in existing if k.task_index in tasks and 0 <= k.rollout_index < self.plan.num_repeats
        )
        return existing

    async def run(self, existing: set[RolloutKey]) -> RunResult:
        """Dispatch every missing key and wait for them all. Does not close the sink."""
        self.progress.started = self.hooks.clock()
        if self._stop_reason is not None:  # stopped before it started
            self.progress.ended = self.progress.started
            return self._stop_reason
        self._producer = asyncio.create_task(self._produce(existing), name=f"produce-{self.job_id}")
        watchdog = asyncio.create_task(self.watchdog.run(), name=f"watchdog-{self.job_id}")
        try:
            await self._producer
        except asyncio.CancelledError:
            if self._stop_reason is None:  # we were cancelled from outside (shutdown): propagate
                raise
        finally:
            watchdog.cancel()
            await asyncio.gather(watchdog, return_exceptions=True)
            await self.tool_endpoint.stop()
            if self.program_host is not None:
                await self.program_host.stop()
            self.progress.ended = self.hooks.clock()
            self.progress.in_flight = 0
        return self._stop_reason or self._outcome()

    def _outcome(self) -> RunResult:
        p, spec = self.progress, self.plan.spec
        state, error = final_state(
            total=self.plan.total,
            succeeded=p.succeeded + p.stale_dropped + p.skipped_existing,
            failed=p.failed,
            allowed_failures=spec.allowed_failures,
            allowed_fraction=spec.allowed_failure_fraction,
            tally=self.tally,
        )
        if self.refill is not None and self.refill.short:  # never a silent short batch
            why = f"{ReplacementsExhausted.reason}: {self.refill.why_short()}"
            if state == "SUCCEEDED":
                state, error = "COMPLETED_WITH_FAILURES", why
            elif state == "COMPLETED_WITH_FAILURES":
                error = f"{why}; {error}"
        return RunResult(state, error)

    async def _produce(self, existing: set[RolloutKey]) -> None:
        try:
            if self._replacing:
                await self._produce_refilled(existing)
            elif self.settings.group_verify:
                await self._produce_groups(existing)
            else:
                for key in self.plan.keys():
                    if key in existing:
                        continue
                    await self._dispatch(key)
            await self._tasks.join()
        finally:
            await self._tasks.aclose()
            await self._drop_groups()

    async def _dispatch(self, key: RolloutKey) -> None:
        waited = self.hooks.clock()
        await self.limiter.acquire()
        self._tasks.spawn(self._one(key, queued_s=self.hooks.clock() - waited))

    async def _produce_groups(self, existing: set[RolloutKey]) -> None:
        """Group scoring: each task's rollouts are one group, dispatched together. A task whose
        rollouts are all stored is done; one with some stored and some not fails the missing ones
        (GroupPartlyStored): the stored ones carry the verdict of a group the missing never joined."""
        n = self.plan.num_repeats
        for t in self.plan.task_indices:
            keys = [RolloutKey(t, r) for r in range(n)]
            missing = [k for k in keys if k not in existing]
            if not missing:
                continue
            if len(missing) < n:
                stored = ", ".join(k.as_str() for k in keys if k in existing)
                for key in missing:
                    message = (
                        f"rollout {key.as_str()}'s group is partly stored ({stored}, verified as a group "
                        "this rollout was not in): it is not run against another group"
                    )
                    await self._fail(key, ErrorClass(GroupPartlyStored.reason, False, None, message), 0)
                continue
            self._groups[t] = _Group(t, n)
            for key in keys:
                await self._dispatch(key)

    async def _produce_refilled(self, existing: set[RolloutKey]) -> None:
        """Keeping batches full: run the groups refill.py starts with, and each replacement a failed
        group asks for (before the next new group, so the groups in flight fill first), until no
        group is open and none is owed."""
        if self.refill is None:
            self.refill = Refill(self.plan, existing)
        self._producing = True
        try:
            await self._run_groups(self.refill.initial)
        finally:
            self._producing = False  # (no await since the loop's last check: a stale drop after it
            # finds the run done, and stays a stale drop)

    async def _run_groups(self, initial: list[Group]) -> None:
        for group in initial:
            while not self._refills.empty():
                await self._dispatch_group(self._refills.get_nowait())
            await self._dispatch_group(group)
        while self._open_groups > 0 or not self._refills.empty():
            await self._dispatch_group(await self._refills.get())

    async def _dispatch_group(self, group: Group | None) -> None:
        if group is None:
            return
        self._groups[group.task_index] = _Group(group.task_index, len(group.keys), group=group)
        self._open_groups += 1
        for key in group.keys:
            await self._dispatch(key)

    async def _drop_groups(self) -> None:
        """A stopped run's gathered groups are never verified (nothing of them is written; a resumed
        job runs them again): their open verifier sessions are closed, best effort."""
        groups, self._groups = list(self._groups.values()), {}
        sessions = [m.env_session for g in groups for m in g.members.values() if m.env_session]
        for session_id in sessions:
            await close_sessions(self.env, None, session_id)

    async def _one(self, key: RolloutKey, queued_s: float = 0.0) -> None:
        """One rollout, under its root span when tracing is on (mesh/tracing.py): the model turns,
        tool calls and verify are its children, and the services' spans theirs."""
        if not tracing.new_trace():  # tracing off, or this rollout left out by the sampler
            await self._rollout(key, queued_s)
            return
        attributes = {
            "rollmesh.job_id": self.job_id,
            "rollmesh.rollout_key": key.as_str(),
            "rollmesh.task_index": key.task_index,
            "rollmesh.rollout_index": key.rollout_index,
        }
        with tracing.trace("rollout", attributes):  # a trace of its own
            await self._rollout(key, queued_s)

    async def _rollout(self, key: RolloutKey, queued_s: float) -> None:
        timing = RolloutTiming(queued_s=queued_s)
        CURRENT_TIMING.set(timing)  # this task's: the watched ports record the phases into it
        try:
            t0 = self.hooks.clock()
            task = self.plan.rows[key.task_index]
            seed = self.plan.spec.starting_seed + key.rollout_index

            cuts = 0  # model calls of this rollout cut by the adaptive deadline: each doubles the next

            tried = 0  # attempts run before this one: their time and the backoff are `retried_s`

            async def traced_attempt() -> tuple[AgentOutcome, TokenRecord]:
                # Each attempt a span of its own under the rollout's, numbered from 1.
                with tracing.span("attempt", {"rollmesh.attempt": tried + 1}):
                    return await attempt()

            async def attempt() -> tuple[AgentOutcome, TokenRecord]:
                nonlocal cuts, tried
                if tried:  # a retry drops what the attempts before it recorded (the first finds none)
                    timing.new_attempt(retried_s=self.hooks.clock() - t0)
                tried += 1
                try:
                    with self.deadline.scaled(2.0**cuts):
                        if self.plan.spec.oracle:
                            out = await run_oracle(
                                job_id=self.job_id, key=key, task=task, settings=self.settings, env=self.env
                            )
                        else:
                            out = await self._drive(
                                job_id=self.job_id,
                                key=key,
                                task=task,
                                seed=seed,
                                settings=self.settings,
                                model=self.model,
                                env=self.env,
                            )
                except ModelCallDeadline:
                    cuts += 1
                    raise
                # A record that does not line up (TOKEN_RECORD_MISMATCH) fails the rollout, not the job.
                return out, self._tokens(out.turns)

            try:
                (outcome, tokens), attempts = await with_retry(
                    traced_attempt if tracing.in_sampled_trace() else attempt,
                    self.policy,
                    backoff=self.backoff,
                    sleep=self.hooks.sleep,
                    on_retry=self._on_retry,
                    outages=self.outages,
                )
                rollout = Rollout(
                    key=key,
                    job_id=self.job_id,
                    task=task,
                    messages=outcome.messages,
                    reward=outcome.reward,
                    reward_components=dict(outcome.verdict.components),
                    extracted_answer=outcome.verdict.extracted_answer,
                    verify_details=dict(outcome.verdict.details),
                    tokens=tokens,
                    prompt_tokens=outcome.prompt_tokens,
                    completion_tokens=outcome.completion_tokens,
                    attempts=attempts,
                    latency_s=round(self.hooks.clock() - t0, 6),
                    policy_version=outcome.turns[-1].policy_version if outcome.turns else "",
                    seed=seed,
                    finish_reason=outcome.finish_reason,
                    env_steps=[step.record() for step in outcome.steps] if outcome.steps else [],
                    masked=outcome.verdict.masked,
                    timing=timing,
                    model=self.plan.spec.model,
                    agent_program=outcome.program,
                )
                if outcome.turns and not tokens.token_ids and not self._said_no_token_ids:
                    self._said_no_token_ids = True
                    log.warning(
                        "rollouts_without_token_ids",
                        job_id=self.job_id,
                        reason="the model server returned no token ids: rows carry no token record "
                        "(rewards are fine for evaluation; a trainer cannot use them)",
                    )
            except RolloutFailed as failed:
                await self._settle_failure(key, failed.error, failed.attempts)
                return
            problems = self._check_tokens(rollout)
            if problems:
                message = "token record does not line up: " + "; ".join(problems)
                err = ErrorClass(TokenRecordMismatch.reason, False, None, message)
                await self._settle_failure(key, err, attempts, outcome.env_session)
                return
            if outcome.verdict_pending or self._replacing:
                steps = outcome.reward - outcome.verdict.reward
                member = _Member(key, attempts, rollout, steps_reward=steps, env_session=outcome.env_session)
                await self._join_group(member)
                return
            try:
                await self._write(rollout)
            except RolloutTooLarge as exc:  # over the gRPC message limit: this rollout fails, the job goes on
                await self._fail(key, ErrorClass(exc.reason, False, None, exc.message), attempts)
        except Exception as exc:  # the sink could not store a row (or a bug): stop the job, say why
            message = exc.message if isinstance(exc, RollmeshError) else f"{type(exc).__name__}: {exc}"
            if self._stop_reason is None:
                log.error("job_stopped_on_error", job_id=self.job_id, error=message)
            self.stop(RunResult("FAILED", message))
        finally:
            self.limiter.release()

    def _check_tokens(self, rollout: Rollout) -> list[str]:
        """Validate the token record of every rollout with `validate_all` (debug), else of a fixed
        sample (one key in VALIDATE_EVERY, chosen by key so a resumed job checks the same ones).
        Structural checks only (lengths, spans, mask, logprobs, usage): no tokenizer is needed."""
        k = rollout.key
        if not (self.plan.spec.validate_all or (k.task_index * 31 + k.rollout_index) % VALIDATE_EVERY == 0):
            return []
        if not rollout.tokens.token_ids:
            return []  # a backend that returns no token ids (an OpenAI URL) has no record to check
        return validate_rollout(rollout)

    async def _run_program(self, **kw: Any) -> AgentOutcome:
        """One attempt by the job's program (drivers/program.py). Its calls go through the gateway's
        facade, not this job's model port: the program's time is what automatic concurrency
        weighs (with the host's CPU, concurrency.py)."""
        out = await run_program(**kw)
        self.limiter.observe(float(out.program.get("seconds", 0.0)))
        return out

    def _on_retry(self, err: ErrorClass, attempt: int, delay: float) -> None:
        self.progress.retries += 1
        telemetry.RETRIES.inc()
        log.debug(
            "rollout_retry", job_id=self.job_id, error=err.name, attempt=attempt, delay_s=round(delay, 3)
        )

    async def _settle_failure(
        self, key: RolloutKey, err: ErrorClass, attempts: int, env_session: str = ""
    ) -> None:
        """A rollout failed: written at once, or (group scoring) with its group once that is done."""
        if self.settings.group_verify or self._replacing:
            await self._join_group(_Member(key, attempts, error=err, env_session=env_session))
        else:
            await self._fail(key, err, attempts)

    async def _join_group(self, member: _Member) -> None:
        """Add a done rollout to its group; the last one in verifies and writes the group (holding
        its slot, so a slow verifier or sink slows dispatch as for any rollout)."""
        group = self._groups[member.key.task_index]
        group.members[member.key.rollout_index] = member
        if len(group.members) < group.size:
            return
        del self._groups[group.task_index]
        if group.group is None:
            await self._finish_group(group)
            return
        try:
            await self._finish_group(group)
        finally:
            self._open_groups -= 1
            self._refills.put_nowait(None)  # wakes the producer, which may be waiting for the last

    async def _finish_group(self, group: _Group) -> None:
        """Verify the group together and write its rows; a failed rollout fails the whole group
        (its own class for it, GroupMemberFailed for the others: nothing of it is verified)."""
        members = [group.members[i] for i in sorted(group.members)]
        try:
            failed = next((m for m in members if m.error is not None), None)
            if failed is not None:
                await self._fail_group(members, failed, self._replacement(group))
                return
            if not self.settings.group_verify:  # (replacing failed groups) each already verified
                rows = [m.rollout for m in members if m.rollout is not None]
                await self._write_rows(rows, members)
                return
            task = self.plan.rows[group.task_index]
            asked = [GroupMember(m.rollout.messages, m.env_session) for m in members if m.rollout is not None]
            try:
                verdicts, _ = await with_retry(
                    partial(self.env.verify_group, self.settings.environment, task, asked),
                    self.policy,
                    backoff=self.backoff,
                    sleep=self.hooks.sleep,
                    on_retry=self._on_retry,
                    outages=self.outages,
                )
            except RolloutFailed as exc:  # one verdict failed: evidence once, not once per rollout
                replaced = self._replacement(group) is not None
                for i, m in enumerate(members):
                    await self._fail(m.key, exc.error, m.attempts, evidence=i == 0, replaced=replaced)
                return
        finally:
            for m in members:
                if m.env_session:
                    await close_sessions(self.env, None, m.env_session)
        rows = [
            replace(
                m.rollout,
                reward=m.steps_reward + v.reward,
                reward_components=dict(v.components),
                extracted_answer=v.extracted_answer,
                verify_details=dict(v.details),
                masked=v.masked,
            )
            for m, v in zip(members, verdicts, strict=True)
            if m.rollout is not None
        ]
        await self._write_rows(rows, members)

    async def _write_rows(self, rows: list[Rollout], members: list[_Member]) -> None:
        """A group's rows in one sink call; a row the sink refused as too large fails."""
        attempts = {m.key: m.attempts for m in members}
        for rollout, too_large in await self._write_group(rows):
            await self._fail(
                rollout.key,
                ErrorClass(too_large.reason, False, None, too_large.message),
                attempts[rollout.key],
            )

    def _replacement(self, group: _Group, *, reason: str = "failed") -> Group | None:
        """The fresh group that replaces a failed one (queued for the producer), or None: the job
        does not replace groups, or cannot (refill.py counts the shortfall)."""
        if self.refill is None or group.group is None:
            return None
        fresh = self.refill.replace(group.group)
        p = self.progress
        p.groups_replaced, p.groups_short = self.refill.replaced, self.refill.short
        telemetry.GROUPS_REFILLED.labels("replaced" if fresh is not None else "short").inc()
        if fresh is None:
            log.warning(
                "group_not_replaced",
                job_id=self.job_id,
                task=group.task_index,
                reason=ReplacementsExhausted.reason,
                why=self.refill.why_short(),
            )
        else:
            log.info(
                "group_replaced",
                job_id=self.job_id,
                task=group.task_index,
                reason=reason,
                by=f"{fresh.task_index}/{fresh.keys[0].rollout_index}",
            )
            self._refills.put_nowait(fresh)
        return fresh

    async def _fail_group(self, members: list[_Member], failed: _Member, fresh: Group | None = None) -> None:
        """Fail every rollout of a group; with `fresh` (its replacement) they are the replaced
        group's, not the job's failures (GroupReplaced for the ones that succeeded)."""
        assert failed.error is not None
        if fresh is not None:
            reason = GroupReplaced.reason
            why = (
                f"rollout {failed.key.as_str()} of this group failed ({failed.error.name}): the group "
                f"is replaced by task {fresh.task_index}'s rollouts {fresh.keys[0].rollout_index}.."
                f"{fresh.keys[-1].rollout_index}"
            )
        elif self.refill is not None:
            reason = GroupMemberFailed.reason
            why = (
                f"rollout {failed.key.as_str()} of this group failed ({failed.error.name}) and the group "
                f"could not be replaced ({ReplacementsExhausted.reason}): no partial group is written"
            )
        else:
            reason = GroupMemberFailed.reason
            why = (
                f"rollout {failed.key.as_str()} of this group failed ({failed.error.name}): the group's "
                "rewards depend on all its rollouts, so none of it is verified"
            )
        replaced = fresh is not None
        for m in members:
            if m.error is not None:
                await self._fail(m.key, m.error, m.attempts, replaced=replaced)
            else:
                err = ErrorClass(reason, False, None, why)
                await self._fail(m.key, err, m.attempts, evidence=False, replaced=replaced)

    async def _write_group(self, rollouts: list[Rollout]) -> list[tuple[Rollout, RolloutTooLarge]]:
        """The group's rows in one sink call (one batch); returns those the sink refused as too large."""
        async with self._write_lock:
            start = time.perf_counter()
            refused = await self.sink.write_group(rollouts)
            self._observe_write(time.perf_counter() - start)
            out = {r.key for r, _ in refused}
            for rollout in rollouts:
                if rollout.key not in out:
                    self._written(rollout)
        return refused

    def _observe_write(self, took: float) -> None:
        self._sink_seconds.observe(took)
        if self.sink.write_times is not None:
            self.sink.write_times.add(took)

    async def _write(self, rollout: Rollout) -> None:
        async with self._write_lock:
            start = time.perf_counter()
            await self.sink.write(rollout)
            self._observe_write(time.perf_counter() - start)
            self._written(rollout)

    def _written(self, rollout: Rollout) -> None:
        """Count a rollout the sink accepted (progress, metrics, hooks)."""
        if tracing.in_sampled_trace():
            tracing.annotate(
                **{
                    "rollmesh.outcome": "succeeded",
                    "rollmesh.reward": rollout.reward,
                    "rollmesh.policy_version": rollout.policy_version,
                    "rollmesh.attempts": rollout.attempts,
                }
            )
        self._sink_rows.inc()
        telemetry.rollout_succeeded()
        p = self.progress
        p.done += 1
        p.succeeded += 1
        p.add_reward(measured_reward(rollout))
        p.completion_tokens += rollout.completion_tokens
        self._fail_fast.success()
        if self.keep_scored:
            self.scored.append(Scored.of(rollout))
        if self.hooks.on_rollout is not None:
            self.hooks.on_rollout(rollout)

    async def _fail(
        self,
        key: RolloutKey,
        err: ErrorClass,
        attempts: int,
        *,
        evidence: bool = True,
        replaced: bool = False,
    ) -> None:
        """Write a rollout's failure. `evidence` False: it says nothing of the job's health (a group
        member failed by a sibling), so fail fast neither counts it nor resets its streak. `replaced`:
        its group was replaced (refill.py): in `replaced_rollouts`, not the job's done or failed."""
        failure = RolloutFailure(key, self.job_id, err.name, err.message, attempts, err.agent_program)
        log.info("rollout_failed", job_id=self.job_id, key=key.as_str(), error=err.name, attempts=attempts)
        async with self._write_lock:
            await self.sink.write_failure(failure)
            telemetry.SINK_WRITES.labels(self._sink_kind, "failure").inc()
            telemetry.rollout_failed(err.name)
            if tracing.in_sampled_trace():  # the rollout's root span
                tracing.annotate(
                    **{
                        "rollmesh.outcome": "failed",
                        "rollmesh.error_class": err.name,
                        "rollmesh.attempts": attempts,
                    }
                )
                tracing.set_error(f"{err.name}: {err.message}")
            self.failures.append(failure)
            if replaced:
                self.progress.replaced_rollouts += 1
            else:
                self.progress.done += 1
                self.progress.failed += 1
                self.tally.add(err.name, err.message)
            if self.hooks.on_failure is not None:
                self.hooks.on_failure(failure)
        if evidence and self._fail_fast.failure(err.name, err.retryable):
            self.stop(
                RunResult(
                    "FAILED",
                    f"{self._fail_fast.streak} rollouts in a row failed with {err.name} (fail fast after "
                    f"{self._fail_fast.after}; retries cannot fix it): {err.message}. "
                    "Everything written is kept; fix the cause and resume the job.",
                )
            )
            return
        if err.budget_exhausted:
            self.stop(
                RunResult(
                    "FAILED",
                    f"{err.message}. Everything written is kept; resume the job once the services are back.",
                )
            )
