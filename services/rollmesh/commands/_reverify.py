"""`rollmesh reverify`'s work: re-score stored rollouts through the verifier's `VerifyBatch` stream
(no model calls), with the SDK's `VerifierClient.verify_many`.

Requests are sent over one bidi stream with at most `window` unanswered; answers come back in
completion order and are matched by id (the row's position). A verifier that is unreachable or
whose stream breaks fails the whole run (VERIFIER_UNAVAILABLE), as does no answer for
`idle_timeout_s` (REVERIFY_TIMEOUT); a refusal (UNAUTHENTICATED ...) is raised as the SDK error.
Each row gets the new `reward`, `reward_components`, `extracted_answer` and `verify_details` (and
`mask_sample` when the verdict is masked or the row had one); the old reward is kept in
`previous_reward`. An item the verifier could not score keeps its row and gets
`reverify_error` ("CODE: message"); the stream goes on, and the command fails at the end
(`ReverifyReport.failed`; the means are over the re-scored rows only). With `--tasks`, each row is
first joined to its dataset row by the input messages (`join_tasks`: NeMo Gym's recorded
rollouts; a message with image or audio parts is matched by its parts, since no model is called).
Without it, a row recorded elsewhere (no rollmesh `task_index`) whose reward falls to 0 gets
`reverify_warning` and fails the command too: NeMo Gym's recorded rollouts lack row fields some
verifies need, and a server that defaults them scores 0 (circle_count: no circles, count 0).

An environment that takes turns (GetEnvironment's `takes_turns`) is re-scored by replaying each
rollout through the agent loop in a new session (scheduler/drivers/replay.py), at most `window` at once:
its reward is the replayed steps' rewards plus verify's, and the row also gets the replayed
`env_steps`. A verify of the final messages alone would score without the episode.

An environment that scores groups (GetEnvironment's `scores_groups`) is re-scored a task's group at
a time (the rows of one job and task, in rollout order) with one `VerifyGroup` each, at most
`window` groups at once: each row's reward is its stored step rewards plus its share of the group's
verdict. A group the verifier refuses gives each of its rows `reverify_error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Coroutine
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from rollmesh.commands._common import connect
from rollmesh.commands._errors import ReverifyTimeout
from rollmesh.commands._errors import VerifierUnavailable
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.responses_items import messages_from_input
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.scheduler import convert
from rollmesh.scheduler.drivers.replay import Replayed
from rollmesh.scheduler.drivers.replay import replay
from rollmesh.scheduler.records import ADDED_FIELDS
from rollmesh.scheduler.records import Json
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh_client import DeadlineExceededError
from rollmesh_client import RollmeshClientError
from rollmesh_client import UnavailableError
from rollmesh_client.v1 import verifier_pb2


@dataclass
class ReverifyReport:
    """What a reverify did. The means are over the re-scored rows only (None when none was): a row
    the verifier could not score keeps its recorded reward, which says nothing about the checker.
    `unjoined_drops` counts rows recorded elsewhere (NeMo Gym: no rollmesh `task_index`) and
    scored without their dataset rows (no `--tasks`) whose reward fell to 0: such a row may lack a
    field its verify needs, so the 0 may be the missing field's, not the answer's."""

    rows: list[Json]
    scored: int = 0
    errors: int = 0
    changed: int = 0
    unjoined_drops: int = 0
    diverged: int = 0  # replays that did not end where their recorded episode ended (REPLAY_DIVERGED)
    old_mean: float | None = None
    new_mean: float | None = None
    error_samples: list[str] = field(default_factory=list)
    joined: bool = False  # each row was joined to its dataset row (--tasks)

    @property
    def failed(self) -> bool:
        """Whether the command fails: a row was not re-scored, or a reward may be a missing field's."""
        return bool(self.errors or self.unjoined_drops or self.diverged)

    def sample(self, row: Json, what: str) -> None:
        """Keep `what` happened to `row` (by its rollout key) among the first five the summary shows."""
        if len(self.error_samples) < 5:
            self.error_samples.append(f"{Rollout.from_row(row).key.as_str()}: {what}")


def input_key(row: Json) -> str:
    """A row's input messages (role and text of each) as one comparable string ("" when none). A
    message with image or audio parts is keyed by its parts as written (reverify calls no model,
    so such a row is joined like any other)."""
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        return ""
    try:
        msgs = messages_from_input(params.get("input"), params.get("instructions"))
    except ValueError:
        return _parts_key(params)
    return json.dumps([(m.role, m.content) for m in msgs], ensure_ascii=False)


def _parts_key(params: Json) -> str:
    """The input's messages as (role, content) with every content part kept whole, for an input the
    text-only reading refuses; "" when it is not a list of messages."""
    items = params.get("input")
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        return ""
    head = [("system", params["instructions"])] if params.get("instructions") else []
    body = [(i.get("role", "user"), i.get("content")) for i in items]
    return "parts:" + json.dumps(head + body, ensure_ascii=False, sort_keys=True)


def join_tasks(rows: Sequence[Json], tasks: Sequence[Json]) -> tuple[list[Json], int]:
    """Each stored rollout scored as the row of `tasks` with the same input messages: that row's
    fields, plus what the rollout added (response, reward, its key, ...). NeMo Gym's recorded
    rollouts need it: they lack row fields verify reads (`expected_count`) and carry the recorded
    verdict's own (`library_reward`), which a server echoing its request refuses to get twice.
    A rollout no task matches is kept as stored; returns the rows and how many matched none.
    Tasks sharing an input must be the same row (else which one is meant is unknown: ValueError)."""
    by_input: dict[str, Json] = {}
    for task in tasks:
        key = input_key(task)
        if key in by_input and by_input[key] != task:
            raise ValueError(f"two rows of the tasks share the input {key[:120]}")
        by_input[key] = task
    out: list[Json] = []
    unmatched = 0
    for row in rows:
        match = by_input.get(input_key(row))
        if match is None:
            unmatched += 1
            out.append(dict(row))
            continue
        added = {k: v for k, v in row.items() if k in ADDED_FIELDS or k.startswith("_ng_")}
        out.append({**match, **added})
    return out, unmatched


def verify_request(row: Json, environment: str) -> verifier_pb2.VerifyRequest:
    """The VerifyRequest of a stored row: the echoed task and the response's messages."""
    r = Rollout.from_row(row)
    return verifier_pb2.VerifyRequest(
        environment=environment,
        task_json=json.dumps(r.task, ensure_ascii=False),
        response=verifier_pb2.ModelResponse(messages=[convert.message_to_pb(m) for m in r.messages]),
    )


REPLAY_DIVERGED = "REPLAY_DIVERGED"
UNJOINED_DROP = (
    "recorded elsewhere with a reward, scored 0 here without its dataset row: the row may lack a "
    "field its verify needs (NeMo Gym's recorded rollouts do); give --tasks with the dataset"
)


async def reverify(
    rows: Sequence[Json],
    *,
    environment: str,
    verifier: str,
    api_key: str | None = None,
    window: int = 32,
    idle_timeout_s: float = 300.0,
    on_progress: Callable[[int], None] | None = None,
    joined: bool = False,
) -> ReverifyReport:
    """Re-score `rows` (JSONL rollout rows) with `environment` on the verifier at `verifier`
    (`joined`: each row was joined to its dataset row, --tasks)."""
    out = [dict(r) for r in rows]
    report = ReverifyReport(rows=out, joined=joined)
    if not out:
        return report
    requests = ((str(i), verify_request(row, environment)) for i, row in enumerate(out))
    async with await connect(verifier=verifier, api_key=api_key or "", timeout_s=idle_timeout_s) as c:
        described = await _describe(c.verifier, environment, verifier)
        if described is not None and described.scores_groups:
            await _verify_groups(out, environment, c.verifier, window, idle_timeout_s, report, on_progress)
            return _means(out, report)
        if described is not None and described.takes_turns:
            port = VerifierEnv.connect(verifier, api_key=api_key or None)
            try:
                await _replay_all(out, environment, port, window, idle_timeout_s, report, on_progress)
            finally:
                await port.close()
            return _means(out, report)
        try:
            async for item_id, answer in c.verifier.verify_many(
                requests, window=window, timeout_s=idle_timeout_s
            ):
                _apply(out[int(item_id)], answer, report)
                if on_progress is not None:
                    on_progress(1)
        except DeadlineExceededError:
            raise ReverifyTimeout(
                f"no answer from the verifier at {verifier} for {idle_timeout_s:.0f}s "
                f"({report.scored + report.errors}/{len(out)} done)"
            ) from None
        except UnavailableError as exc:
            raise VerifierUnavailable(
                f"VerifyBatch to {verifier} failed after {report.scored + report.errors}/{len(out)} "
                f"answers: {exc}"
            ) from None
    return _means(out, report)


def _means(out: list[Json], report: ReverifyReport) -> ReverifyReport:
    """The recorded and the new mean reward over the re-scored rows (None when none was)."""
    scored = [r for r in out if "previous_reward" in r and "reverify_error" not in r]
    if scored:
        report.old_mean = sum(float(r["previous_reward"]) for r in scored) / len(scored)
        report.new_mean = sum(float(r.get("reward", 0.0)) for r in scored) / len(scored)
    return report


async def _describe(client: Any, environment: str, verifier: str) -> verifier_pb2.Environment | None:
    """`environment` as the verifier describes it (whether it takes turns, scores groups); None when
    the verifier cannot say (an unknown name, an older verifier): each Verify then answers for
    itself, as before."""
    try:
        env: verifier_pb2.Environment = await client.get(environment)
    except UnavailableError as exc:
        raise VerifierUnavailable(f"GetEnvironment to {verifier} failed: {exc}") from None
    except RollmeshClientError:
        return None
    return env


async def _verify_groups(
    out: list[Json],
    environment: str,
    client: Any,
    window: int,
    idle_timeout_s: float,
    report: ReverifyReport,
    on_progress: Callable[[int], None] | None,
) -> None:
    """One VerifyGroup per task's group of rows (module docstring), at most `window` at once."""
    groups: dict[tuple[str, int], list[int]] = {}
    for i, row in enumerate(out):
        key = Rollout.from_row(row).key
        groups.setdefault((str(row.get("job_id", "")), key.task_index), []).append(i)
    todo = iter(sorted(groups.values(), key=lambda g: g[0]))

    async def worker() -> None:
        for members in todo:
            rollouts = sorted(((Rollout.from_row(out[i]), i) for i in members), key=lambda p: p[0].key)
            try:
                async with _verifier_call(f"VerifyGroup of the group of row {members[0]}", idle_timeout_s):
                    results = await client.verify_group(
                        environment,
                        json.dumps(rollouts[0][0].task, ensure_ascii=False),
                        [_model_response(r.messages) for r, _ in rollouts],
                    )
            except RollmeshClientError as exc:
                for _, i in rollouts:
                    _failed(out[i], _named(exc), report)
            else:
                for (r, i), res in zip(rollouts, results, strict=True):
                    steps = sum(float(s.get("reward", 0.0)) for s in r.env_steps)
                    details = json.loads(res.details_json) if res.details_json else {}
                    reward = steps + res.reward
                    _scored(out[i], reward, res.components, res.extracted_answer, details, res.masked, report)
            if on_progress is not None:
                on_progress(len(members))

    await _run_workers(worker, min(window, len(groups)))


def _model_response(messages: list[Json]) -> verifier_pb2.ModelResponse:
    return verifier_pb2.ModelResponse(messages=[convert.message_to_pb(m) for m in messages])


async def _replay_all(
    out: list[Json],
    environment: str,
    port: VerifierEnv,
    window: int,
    idle_timeout_s: float,
    report: ReverifyReport,
    on_progress: Callable[[int], None] | None,
) -> None:
    """Replay every row (at most `window` at once), each in its own session; a row that cannot be
    replayed gets `reverify_error`, an unreachable verifier fails the run."""
    prefix = f"reverify-{uuid.uuid4().hex[:12]}"
    todo: Iterator[int] = iter(range(len(out)))

    async def worker() -> None:
        for i in todo:
            row = out[i]
            try:
                async with _verifier_call(f"replaying row {i} on the verifier", idle_timeout_s):
                    replayed = await replay(
                        Rollout.from_row(row), environment=environment, env=port, session_prefix=prefix
                    )
            except (ReverifyTimeout, VerifierUnavailable):
                raise  # the run ends: RollmeshErrors themselves, they are no row's failure
            except (RollmeshClientError, RollmeshError) as exc:
                _failed(row, _named(exc), report)
            except (KeyError, TypeError, ValueError) as exc:  # a stored row without what the loop needs
                _failed(row, f"MALFORMED_ROW: {type(exc).__name__}: {exc}", report)
            else:
                _replayed(row, replayed, report)
            if on_progress is not None:
                on_progress(1)

    await _run_workers(worker, min(window, len(out)))


@contextlib.asynccontextmanager
async def _verifier_call(what: str, idle_timeout_s: float) -> AsyncIterator[None]:
    """One call to the verifier (VerifyGroup, a replay's calls) that ends the run when it cannot be
    answered: past `idle_timeout_s` ReverifyTimeout, an unreachable verifier VerifierUnavailable,
    each naming `what`. The verifier's answers, refusals included, pass through."""
    try:
        async with asyncio.timeout(idle_timeout_s):
            yield
    except TimeoutError:
        raise ReverifyTimeout(f"{what} took longer than {idle_timeout_s:.0f}s") from None
    except UnavailableError as exc:
        raise VerifierUnavailable(f"{what} failed: {exc}") from None


async def _run_workers(worker: Callable[[], Coroutine[Any, Any, None]], count: int) -> None:
    """`count` (at least one) copies of `worker` at once; the first one's error is raised (it
    cancelled the others)."""
    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(max(1, count)):
                tg.create_task(worker())
    except ExceptionGroup as group:
        raise group.exceptions[0] from None


def _replayed(row: Json, replayed: Replayed, report: ReverifyReport) -> None:
    outcome = replayed.outcome
    v: VerifyResult = outcome.verdict
    _scored(row, outcome.reward, v.components, v.extracted_answer, v.details, v.masked, report)
    row["env_steps"] = [s.record() for s in outcome.steps]
    if replayed.diverged:  # scored, and said: the reward is another episode's than the one recorded
        warning = f"{REPLAY_DIVERGED}: {replayed.diverged}"
        row["reverify_warning"] = warning
        report.diverged += 1
        report.sample(row, warning)


def _apply(
    row: Json, answer: verifier_pb2.VerifyResult | RollmeshClientError, report: ReverifyReport
) -> None:
    if isinstance(answer, RollmeshClientError):
        _failed(row, _named(answer), report)
        return
    res = answer
    details = json.loads(res.details_json) if res.details_json else {}
    _scored(row, res.reward, res.components, res.extracted_answer, details, res.masked, report)


def _named(exc: RollmeshClientError | RollmeshError) -> str:
    """`REASON: message` (the ErrorInfo reason, e.g. BAD_TASK for a row a NeMo Gym server refused with
    422), the status code's name where the error has none."""
    return f"{exc.reason or exc.code.name}: {exc.message}"


def _failed(row: Json, msg: str, report: ReverifyReport) -> None:
    row["reverify_error"] = msg
    report.errors += 1
    report.sample(row, msg)


def _scored(
    row: Json,
    reward: float,
    components: Any,
    extracted_answer: str,
    details: Json,
    masked: bool,
    report: ReverifyReport,
) -> None:
    old = float(row.get("reward", 0.0))
    row["previous_reward"] = old
    row["reward"] = reward
    row.pop("reverify_warning", None)
    if not report.joined and "task_index" not in row and old > 0.0 and reward == 0.0:
        row["reverify_warning"] = UNJOINED_DROP
        report.unjoined_drops += 1
        report.sample(row, UNJOINED_DROP)
    row["reward_components"] = dict(components)
    row["extracted_answer"] = extracted_answer
    row["verify_details"] = details
    if masked or "mask_sample" in row:
        row["mask_sample"] = masked
    row.pop("reverify_error", None)
    report.scored += 1
    if reward != old:
        report.changed += 1
