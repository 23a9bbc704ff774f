"""`rollmesh reverify`'s work: re-score stored rollouts through the verifier's `VerifyBatch` stream
(no model calls), with the SDK's `VerifierClient.verify_many`.

Requests are sent over one bidi stream with at most `window` unanswered; answers come back in
completion order and are matched by id (the row's position). A verifier that is unreachable or
whose stream breaks fails the whole run (VERIFIER_UNAVAILABLE), as does no answer for
`idle_timeout_s` (REVERIFY_TIMEOUT); a refusal (UNAUTHENTICATED ...) is raised as the SDK error.
Each row gets the new `reward`, `reward_components`, `extracted_answer` and `verify_details` (and
`mask_sample` when the verdict is masked or the row had one); the old reward is kept in
`previous_reward`. An item the verifier could not score keeps its row and gets
`reverify_error` ("CODE: message"); the stream goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rollmesh.commands._common import connect
from rollmesh.commands._errors import ReverifyTimeout, VerifierUnavailable
from rollmesh.scheduler import convert
from rollmesh.scheduler.records import Json, Rollout
from rollmesh_client import DeadlineExceededError, RollmeshClientError, UnavailableError
from rollmesh_client.v1 import verifier_pb2


@dataclass
class ReverifyReport:
    rows: list[Json]
    scored: int = 0
    errors: int = 0
    changed: int = 0
    old_mean: float = 0.0
    new_mean: float = 0.0
    error_samples: list[str] = field(default_factory=list)


def verify_request(row: Json, environment: str) -> verifier_pb2.VerifyRequest:
    """The VerifyRequest of a stored row: the echoed task and the response's messages."""
    r = Rollout.from_row(row)
    return verifier_pb2.VerifyRequest(
        environment=environment,
        task_json=json.dumps(r.task, ensure_ascii=False),
        response=verifier_pb2.ModelResponse(messages=[convert.message_to_pb(m) for m in r.messages]),
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
) -> ReverifyReport:
    """Re-score `rows` (JSONL rollout rows) with `environment` on the verifier at `verifier`."""
    out = [dict(r) for r in rows]
    report = ReverifyReport(rows=out)
    if not out:
        return report
    requests = ((str(i), verify_request(row, environment)) for i, row in enumerate(out))
    async with await connect(verifier=verifier, api_key=api_key or "", timeout_s=idle_timeout_s) as c:
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
    olds = [float(r.get("previous_reward", r.get("reward", 0.0))) for r in out]
    news = [float(r.get("reward", 0.0)) for r in out]
    report.old_mean = sum(olds) / len(olds)
    report.new_mean = sum(news) / len(news)
    return report


def _apply(
    row: Json, answer: verifier_pb2.VerifyResult | RollmeshClientError, report: ReverifyReport
) -> None:
    if isinstance(answer, RollmeshClientError):
        msg = f"{answer.code.name}: {answer.message}"
        row["reverify_error"] = msg
        report.errors += 1
        if len(report.error_samples) < 5:
            report.error_samples.append(f"{row.get('task_index')}:{row.get('rollout_index')}: {msg}")
        return
    res = answer
    old = float(row.get("reward", 0.0))
    row["previous_reward"] = old
    row["reward"] = res.reward
    row["reward_components"] = dict(res.components)
    row["extracted_answer"] = res.extracted_answer
    row["verify_details"] = json.loads(res.details_json) if res.details_json else {}
    if res.masked or "mask_sample" in row:
        row["mask_sample"] = res.masked
    row.pop("reverify_error", None)
    report.scored += 1
    if res.reward != old:
        report.changed += 1
