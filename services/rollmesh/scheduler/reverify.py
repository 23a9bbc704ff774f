"""Re-score stored rollouts through the verifier's `VerifyBatch` stream (no model calls).

Requests are sent over one bidi stream with at most `window` unanswered; answers come back in
completion order and are matched by id (the rollout key). Each row gets the new `reward`,
`reward_components`, `extracted_answer` and `verify_details`; the old reward is kept in
`previous_reward`. An item the verifier could not score keeps its row and gets
`reverify_error` ("CODE: message"); the stream goes on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from rollmesh.mesh.errors import DeadlineExceeded, Unavailable
from rollmesh.mesh.errors import code_name as status_code_name
from rollmesh.scheduler import convert
from rollmesh.scheduler.records import Json, RolloutKey
from rollmesh_client import aio_channel
from rollmesh_client.v1 import verifier_pb2, verifier_pb2_grpc


class VerifierUnavailable(Unavailable):
    reason = "VERIFIER_UNAVAILABLE"


class ReverifyTimeout(DeadlineExceeded):
    reason = "REVERIFY_TIMEOUT"


@dataclass
class ReverifyReport:
    rows: list[Json]
    scored: int = 0
    errors: int = 0
    changed: int = 0
    old_mean: float = 0.0
    new_mean: float = 0.0
    error_samples: list[str] = field(default_factory=list)


def row_key(row: Json) -> RolloutKey:
    return RolloutKey(int(row["task_index"]), int(row["rollout_index"]))


def verify_request(row: Json, environment: str) -> verifier_pb2.VerifyRequest:
    """The VerifyRequest of a stored row: the echoed task and the response's messages."""
    from rollmesh.scheduler.records import Rollout

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
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out = [dict(r) for r in rows]
    by_id = {str(i): row for i, row in enumerate(out)}
    report = ReverifyReport(rows=out)
    if not out:
        return report
    credits = asyncio.Semaphore(window)
    channel = aio_channel(verifier, api_key=api_key)
    try:
        stub = verifier_pb2_grpc.EnvironmentVerifierStub(channel)
        # Whole-stream deadline: generous, but bounded (idle time is bounded separately below).
        call = stub.VerifyBatch(timeout=idle_timeout_s + 10.0 * len(out))

        async def send() -> None:
            for i, row in enumerate(out):
                await credits.acquire()
                await call.write(
                    verifier_pb2.VerifyBatchRequest(id=str(i), request=verify_request(row, environment))
                )
            await call.done_writing()

        sender = asyncio.create_task(send())
        try:
            for _ in range(len(out)):
                try:
                    async with asyncio.timeout(idle_timeout_s):
                        resp = await call.read()
                except TimeoutError:
                    raise ReverifyTimeout(
                        f"no answer from the verifier at {verifier} for {idle_timeout_s:.0f}s "
                        f"({report.scored + report.errors}/{len(out)} done)"
                    ) from None
                if resp is grpc.aio.EOF:
                    done = report.scored + report.errors
                    raise VerifierUnavailable(
                        f"the verifier ended the stream after {done}/{len(out)} answers"
                    )
                credits.release()
                if resp.id in by_id:
                    _apply(by_id[resp.id], resp, report)
                if on_progress is not None:
                    on_progress(1)
            if sender.done() and sender.exception() is not None:
                raise sender.exception()  # type: ignore[misc]
        except grpc.aio.AioRpcError as exc:
            raise VerifierUnavailable(
                f"VerifyBatch to {verifier} failed: {exc.code().name}: {exc.details()}"
            ) from None
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            call.cancel()
    finally:
        await channel.close()
    olds = [float(r.get("previous_reward", r.get("reward", 0.0))) for r in out]
    news = [float(r.get("reward", 0.0)) for r in out]
    report.old_mean = sum(olds) / len(olds)
    report.new_mean = sum(news) / len(news)
    return report


def _apply(row: Json, resp: verifier_pb2.VerifyBatchResponse, report: ReverifyReport) -> None:
    if resp.WhichOneof("outcome") == "error":
        msg = f"{status_code_name(resp.error.code)}: {resp.error.message}"
        row["reverify_error"] = msg
        report.errors += 1
        if len(report.error_samples) < 5:
            report.error_samples.append(f"{row.get('task_index')}:{row.get('rollout_index')}: {msg}")
        return
    res = resp.result
    old = float(row.get("reward", 0.0))
    row["previous_reward"] = old
    row["reward"] = res.reward
    row["reward_components"] = dict(res.components)
    row["extracted_answer"] = res.extracted_answer
    row["verify_details"] = json.loads(res.details_json) if res.details_json else {}
    row.pop("reverify_error", None)
    report.scored += 1
    if res.reward != old:
        report.changed += 1
