"""VerifyGroup in the verifier's domain layer: a group-scored environment's results are checked (one
per member, each a finite VerifyResult) and its members' sessions passed in order; Verify of one of
its rollouts alone is refused (GROUP_SCORED), and VerifyGroup on an environment that scores each
rollout alone, or without members, is BAD_GROUP."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from typing import ClassVar

import pytest

from rollmesh.mesh.errors import Internal
from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier import VerifyResult
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.errors import BadGroup
from rollmesh.verifier.errors import GroupScored
from rollmesh.verifier.loader import Discovery
from rollmesh.verifier.loader import Loaded
from rollmesh.verifier.service import GroupCall
from rollmesh.verifier.service import GroupMember
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.service import VerifyCall
from rollmesh.verifier.workers import WorkerPool


class Agreement(Environment):
    """Reward: the share of the group that gave the same answer (majority-vote agreement)."""

    answer_count: int | None = None  # when set, answers that many results (a broken plugin)
    seen_sessions: ClassVar[list[list[str | None]]] = []

    async def seed_session(self, task: Task) -> Any:
        return {"n": 0}

    def verify_group(
        self, task: Task, responses: Sequence[Response], sessions: Sequence[Session | None]
    ) -> list[VerifyResult]:
        type(self).seen_sessions.append([s.id if s else None for s in sessions])
        texts = [r.final_text for r in responses]
        results = [VerifyResult(reward=texts.count(t) / len(texts)) for t in texts]
        return results[: self.answer_count] if self.answer_count is not None else results

    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        raise AssertionError("never called")


class NaNs(Agreement):
    def verify_group(
        self, task: Task, responses: Sequence[Response], sessions: Sequence[Session | None]
    ) -> list[VerifyResult]:
        return [VerifyResult(reward=float("nan")) for _ in responses]


class Alone(Environment):
    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        return VerifyResult(1.0)


def _service(**envs: type[Environment]) -> VerifierService:
    cfg = VerifierConfig()
    loaded = {n: Loaded(n, cls(EnvContext(n, None, cfg, WorkerPool(1))), "test") for n, cls in envs.items()}
    return VerifierService(cfg, Discovery(loaded, {}))


def _members(*texts: str, sessions: Sequence[str] = ()) -> tuple[GroupMember, ...]:
    sids = list(sessions) or [""] * len(texts)
    return tuple(GroupMember(Response.from_text(t), s) for t, s in zip(texts, sids, strict=True))


async def test_a_group_is_scored_together_with_its_sessions_in_order() -> None:
    svc = _service(vote=Agreement, alone=Alone)
    assert svc.describe("vote").scores_groups and not svc.describe("alone").scores_groups
    for sid in ("s2", "s0", "s1"):
        await svc.seed_session("vote", "{}", sid)
    Agreement.seen_sessions = []
    got = await svc.verify_group(
        GroupCall("vote", "{}", _members("4", "5", "4", sessions=["s0", "s1", "s2"]))
    )
    assert [r.reward for r in got] == [2 / 3, 1 / 3, 2 / 3]
    assert Agreement.seen_sessions == [["s0", "s1", "s2"]]
    got = await svc.verify_group(GroupCall("vote", "{}", _members("4", "4")))  # session-less members
    assert [r.reward for r in got] == [1.0, 1.0] and Agreement.seen_sessions[-1] == [None, None]


async def test_one_rollout_alone_and_malformed_groups_are_refused_by_name() -> None:
    svc = _service(vote=Agreement, alone=Alone, nans=NaNs)
    with pytest.raises(GroupScored):
        await svc.verify(VerifyCall("vote", "{}", Response.from_text("4")))
    with pytest.raises(BadGroup, match="scores each rollout alone"):
        await svc.verify_group(GroupCall("alone", "{}", _members("4")))
    with pytest.raises(BadGroup, match="at least one member"):
        await svc.verify_group(GroupCall("vote", "{}", ()))
    with pytest.raises(Internal, match="not a finite number"):
        await svc.verify_group(GroupCall("nans", "{}", _members("4", "5")))
    Agreement.answer_count = 1
    try:
        with pytest.raises(BadGroup, match="answered 1 results for 2 rollouts"):
            await svc.verify_group(GroupCall("vote", "{}", _members("4", "5")))
    finally:
        Agreement.answer_count = None
