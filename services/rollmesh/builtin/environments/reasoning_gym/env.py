"""`reasoning_gym`: reasoning-gym's procedural tasks, each scored by its generator's own scorer in
a worker process (rollmesh.procedural.scoring)."""

from __future__ import annotations

import asyncio

from rollmesh.mesh.logging import get_logger
from rollmesh.procedural.rows import SOURCE_FIELD
from rollmesh.procedural.scoring import READINGS
from rollmesh.verifier import BadTask
from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import VerifyResult
from rollmesh.verifier.errors import CheckFailed
from rollmesh.verifier.errors import CheckTimeout
from rollmesh.verifier.errors import WorkerError
from rollmesh.verifier.errors import WorkerTimeout

log = get_logger("rollmesh.env.reasoning_gym")
_SCORE = "rollmesh.procedural.scoring:score"
_ROW_FIELDS = ("question", "answer", "metadata", SOURCE_FIELD)


class ReasoningGym(Environment):
    """reasoning-gym tasks (NeMo Gym's reasoning_gym row shape: `question`, `answer`, `metadata`
    with `source_dataset`). The answer is read from the final assistant message outside its think
    blocks: its last <answer>...</answer>, else its last \\boxed{}, else the whole of it; with
    ROLLMESH_VERIFIER_REASONING_GYM_READING=nemo_gym (or a task's
    `verifier_metadata.answer_reading`), as NeMo Gym's server reads it (procedural/scoring.py).
    The generator's scorer gives the reward (0 when it raises). A row naming no known generator
    raises BadTask; a scorer that overruns its time CheckTimeout."""

    _warming: asyncio.Task[None] | None = None

    def _warm_workers(self) -> asyncio.Task[None]:
        """Import reasoning-gym (~2 s, every generator module) in each worker of this environment's
        pool, once, on the first verify: outside a scoring call's timeout, and never at start (a
        verifier that scores no reasoning-gym task pays nothing)."""
        if self._warming is None:
            self._warming = asyncio.create_task(self._warmup(), name="reasoning-gym-warmup")
        return self._warming

    async def _warmup(self) -> None:
        pool = self.context.workers
        calls = [pool.call("rollmesh.procedural.scoring:warmup", timeout_s=120.0) for _ in range(pool.size)]
        for failed in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(failed, Exception):
                log.warning("reasoning_gym_warmup_failed", error=str(failed))

    async def aclose(self) -> None:
        if self._warming is not None:
            self._warming.cancel()
            await asyncio.gather(self._warming, return_exceptions=True)

    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        del session
        reading = task.metadata.get("answer_reading", self.context.config.reasoning_gym_reading)
        if reading not in READINGS:
            raise BadTask(
                f"verifier_metadata.answer_reading must be one of {', '.join(READINGS)}, not {reading!r:.40}"
            )
        if reading == "nemo_gym":  # NeMo Gym joins every assistant message
            text = "".join(m.content for m in response.messages if m.role == "assistant")
        else:
            text = response.final_text
        if not text.strip():
            return VerifyResult(0.0, {}, "", {"reason": "empty response"})
        row = {k: task.row[k] for k in _ROW_FIELDS if k in task.row}
        await asyncio.shield(self._warm_workers())  # one verify cancelled leaves it to the others
        timeout = self.context.config.math_timeout_s
        try:
            out = await self.context.workers.call(_SCORE, row, text, reading, timeout_s=timeout)
        except WorkerTimeout:
            raise CheckTimeout(
                f"the reasoning-gym scorer took longer than {timeout:g}s; worker killed"
            ) from None
        except WorkerError as exc:
            raise CheckFailed(f"reasoning-gym scoring failed: {exc}") from None
        if "bad_task" in out:
            raise BadTask(str(out["bad_task"]))
        reward = float(out["score"])
        details = {"reason": str(out["reason"]), "generator": str(out["generator"])}
        return VerifyResult(reward, {"score": reward}, str(out["extracted"]), details)
