"""`session_state`: a counter kept per session; reward when it ends at the expected value."""

from __future__ import annotations

from dataclasses import dataclass

from rollmesh.verifier import BadTask
from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import SessionRequired
from rollmesh.verifier import Task
from rollmesh.verifier import ToolError
from rollmesh.verifier import VerifyResult
from rollmesh.verifier import tool

MAX_ABS = 10**18
"""The counter stays within +-MAX_ABS: a count that would take it past refuses (a tool error), so a
model's huge counts cannot make the value unprintable (Python's 4300-digit limit) and its verify an
INTERNAL error instead of a reward."""


@dataclass
class Counter:
    value: int


class CounterEnv(Environment):
    """A per-session counter seeded from `verifier_metadata.initial_value` (or, as NeMo Gym's
    example_session_state_mgmt rows say it, the row's `initial_count`). Tools:
    `increment_counter(count)` and `get_counter_value()`. Reward 1.0 when the session's counter
    equals `expected_answer` (or the row's `expected_count`) at verification time. A row whose
    initial or expected value is not an integer raises BadTask; a verify without the rollout's
    session SessionRequired."""

    async def seed_session(self, task: Task) -> Counter:
        where, raw = "verifier_metadata.initial_value", task.metadata.get("initial_value")
        if raw is None and "initial_count" in task.row:
            where, raw = "initial_count", task.row["initial_count"]
        try:
            return Counter(int(raw or 0))
        except (TypeError, ValueError):  # seeding 0 instead would score every rollout of the row wrongly
            raise BadTask(f"{where} is not an integer (got {raw!r:.80})") from None

    @tool
    async def increment_counter(self, session: Session, count: int) -> str:
        """Add `count` (may be negative) to the counter; returns the new value (within +-10**18)."""
        state: Counter = session.state
        if abs(state.value + count) > MAX_ABS:
            raise ToolError(f"the counter must stay within +-{MAX_ABS}; it is {state.value}")
        state.value += count
        return str(state.value)

    @tool
    async def get_counter_value(self, session: Session) -> str:
        """The counter's current value."""
        state: Counter = session.state
        return str(state.value)

    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        del response
        if session is None or not isinstance(session.state, Counter):  # nothing to judge: not a 0
            raise SessionRequired(
                "session_state verifies the counter of the rollout's session; the call carried none "
                "(a stored rollout cannot be re-verified: its session is gone)"
            )
        raw = task.expected_answer
        if raw is None and "expected_count" in task.row:
            raw = task.row["expected_count"]
        try:
            expected = int(raw)
        except (TypeError, ValueError):
            raise BadTask(
                f"task has no integer expected_answer nor expected_count (got {raw!r:.80})"
            ) from None
        ok = session.state.value == expected
        return VerifyResult(
            1.0 if ok else 0.0,
            {"reached": 1.0 if ok else 0.0},
            str(session.state.value),
            {
                "expected": expected,
                "final_value": session.state.value,
                "reason": "reached" if ok else "wrong count",
            },
        )
