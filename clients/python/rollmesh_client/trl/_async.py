"""TRL's AsyncGRPOTrainer on a rollmesh mesh: a rollout worker and a weight-transfer backend
(`rollout_worker=` and `weight_transfer=`, TRL's RolloutWorkerProtocol and WeightTransferProtocol).

`RollmeshRolloutWorker` runs the dataset as rollmesh jobs (one after another, new seeds each pass)
whose rollouts stream into a trainer-side `SinkServer` (whole groups, backpressure), and turns each
group into TRL's `RolloutSample`s: the token record's ids, its loss mask as the completion mask,
the replica's logprobs as the old logprobs, the group-normalised advantage, and the record's policy
version (the oldest of its turns) as the sample's `model_version`, which TRL's staleness bound
reads. `RollmeshWeightTransfer` streams the trainer's parameters to every replica (UploadWeights)
labelled with the version the trainer then tells the worker, so the two counts agree.
"""

from __future__ import annotations

import asyncio
import json
import math
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rollmesh_client._batch import grpo_advantages
from rollmesh_client._client import Client
from rollmesh_client._gateway import InFlight
from rollmesh_client._rollout import TrainerRollout
from rollmesh_client._sync import _Loop
from rollmesh_client.trainer import SinkServer
from rollmesh_client.trl._samples import as_rollmesh_row
from rollmesh_client.trl._samples import row_prompt
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import scheduler_pb2


class RollmeshWeightTransfer:
    """TRL's WeightTransferProtocol over UpdateWeights: `send_weights` uploads the `(name, tensor)`
    pairs the trainer streams (named as the served checkpoint: a tied lm_head is not among them) and
    every replica loads them at once, labelled `start_version + n` at the n-th send: the trainer's
    own `model_version` after that sync. `pause`/`resume` have nothing to do: UpdateWeights holds new
    generations while it loads, and `in_flight` says what happens to running ones ("continue":
    partial rollouts, each id labelled with the version that produced it)."""

    def __init__(
        self,
        *,
        gateway: str | None = None,
        api_key: str | None = None,
        model: str = "",
        in_flight: InFlight = "abort_and_retry",
        start_version: int = 0,
        timeout_s: float = 600.0,
    ) -> None:
        self.gateway, self.api_key, self.model, self.in_flight = gateway, api_key, model, in_flight
        self.version = start_version
        self.timeout_s = timeout_s
        self.sends: list[dict[str, float]] = []
        self._loop: _Loop | None = None
        self._client: Client | None = None

    def init_weight_transfer(self) -> None:
        self._loop = _Loop()
        self._client = self._loop.run(Client.connect(gateway=self.gateway, api_key=self.api_key))

    def pause(self) -> None:
        """Nothing: the load itself holds generation (see the class)."""

    def resume(self) -> None:
        """Nothing: generation resumes when every replica loaded the weights."""

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        if self._loop is None or self._client is None:
            raise RuntimeError("send_weights before init_weight_transfer")
        t0 = time.monotonic()
        state = {name: tensor.detach().to("cpu").contiguous() for name, tensor in iterator}
        version = self.version + 1
        resp = self._loop.run(self._upload(self._client, state, version))
        if resp.policy_version != str(version):
            raise RuntimeError(f"the gateway labelled the weights {resp.policy_version!r}, not {version}")
        self.version = version
        self.sends.append({"version": version, "seconds": time.monotonic() - t0, "paused_s": resp.paused_s})

    async def _upload(self, client: Client, state: dict[str, Any], version: int) -> Any:
        # On the SDK's loop: the gateway's channel is made (on first use) where it is used.
        return await client.gateway.update_weights_from_state_dict(
            state,
            model=self.model,
            policy_version=str(version),
            in_flight=self.in_flight,
            timeout_s=self.timeout_s,
        )

    def destroy(self) -> None:
        if self._loop is not None and self._client is not None:
            self._loop.run(self._client.close())
            self._loop.close()
        self._loop = self._client = None


class RollmeshRolloutWorker:
    """TRL's RolloutWorkerProtocol on a rollmesh mesh (see the module). `rows`: rollmesh (NeMo Gym)
    rows or TRL rows with a `prompt`; `num_generations`: the group size (the job's num_repeats);
    `sampling`: the job's (logprobs are always recorded: TRL's loss needs them). `window`: rollouts the
    scheduler may have sent and the trainer not taken (SinkServer); `max_staleness`: also drop stale
    groups at the sink, where the job replaces them (None: leave it to TRL's own bound). `passes`:
    how many times the dataset runs (None: until stopped)."""

    def __init__(
        self,
        rows: Iterable[Mapping[str, Any]],
        *,
        environment: str,
        num_generations: int,
        gateway: str | None = None,
        scheduler: str | None = None,
        api_key: str | None = None,
        model: str = "",
        sampling: common_pb2.SamplingParams | None = None,
        max_steps: int = 0,
        work_dir: str | Path | None = None,
        queue_maxsize: int = 1024,
        window: int = 64,
        max_staleness: int | None = None,
        concurrency: int = 0,
        seed: int = 0,
        passes: int | None = None,
    ) -> None:
        self.rows = [as_rollmesh_row(r) for r in rows]
        self.environment, self.num_generations = environment, num_generations
        self.addresses = {"gateway": gateway, "scheduler": scheduler}
        self.api_key, self.model, self.max_steps = api_key, model, max_steps
        self.sampling = common_pb2.SamplingParams(temperature=1.0) if sampling is None else sampling
        self.sampling.logprobs = True
        self.work_dir = (
            Path(work_dir) if work_dir is not None else Path("runs") / f"trl-async-{uuid.uuid4().hex[:8]}"
        )
        self.window, self.max_staleness, self.concurrency = window, max_staleness, concurrency
        self.seed, self.passes = seed, passes
        self.rollout_buffer: queue.Queue[Any] = queue.Queue(maxsize=queue_maxsize)
        self.metrics_queue: queue.Queue[dict[str, float]] = queue.Queue(maxsize=4096)
        self.model_version = 0
        self.jobs: list[str] = []
        self.groups = 0
        self.recent: deque[TrainerRollout] = deque(maxlen=256)  # the last rollouts turned into samples
        self._heartbeat = time.time()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sink: SinkServer | None = None
        self._thread: threading.Thread | None = None

    # -- the protocol ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._heartbeat = time.time()
        self._thread = threading.Thread(target=self._main, name="rollmesh-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(lambda: None)  # wake the loop to see the flag
        if self._thread is not None:
            self._thread.join(timeout=120)
            self._thread = None

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version
        sink, loop = self._sink, self._loop
        if sink is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(setattr, sink, "policy_version", model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise RuntimeError(f"the rollmesh rollout worker failed: {self._error!r}") from self._error
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            raise RuntimeError(
                f"the rollmesh rollout worker produced nothing for {age:.0f} s (> {stale_after_s:.0f} s); "
                f"jobs so far: {self.jobs}"
            )

    # -- the loop -------------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # check_health raises it in the trainer
            self._error = exc

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        dataset = self.work_dir.resolve() / "rows.jsonl"
        dataset.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        async with (
            await Client.connect(**self.addresses, api_key=self.api_key, timeout_s=120.0) as client,
            SinkServer(
                window=self.window,
                group_complete=True,
                group_size=self.num_generations,
                max_staleness=self.max_staleness,
                policy_version=self.model_version,
                api_key=self.api_key,
            ) as sink,
        ):
            self._sink = sink
            done = 0
            while not self._stop.is_set() and (self.passes is None or done < self.passes):
                spec = scheduler_pb2.JobSpec(
                    dataset=str(dataset),
                    environment=self.environment,
                    model=self.model,
                    sampling=self.sampling,
                    num_repeats=self.num_generations,
                    starting_seed=self.seed + done * self.num_generations,
                    concurrency=self.concurrency,
                    output_dir=str(self.work_dir.resolve() / "jobs"),
                    allowed_failure_fraction=1.0,
                    sink=scheduler_pb2.SinkSpec(
                        grpc=scheduler_pb2.GrpcSinkSpec(address=sink.address, window=self.window)
                    ),
                )
                if self.max_steps:
                    spec.agent.max_steps = self.max_steps
                if self.max_staleness is not None:
                    spec.replace_groups = "same_task"  # a group dropped as stale is generated again
                job = await client.scheduler.submit(spec)
                self.jobs.append(job.job_id)
                try:
                    await self._consume(sink)
                finally:
                    if self._stop.is_set():
                        await asyncio.wait({asyncio.create_task(job.cancel())}, timeout=5.0)
                done += 1

    async def _consume(self, sink: SinkServer) -> None:
        """Until the job closes (or the worker stops): each group into the buffer. The wait for the
        next group is never cancelled (that would end the generator), only looked at every second."""
        groups = sink.groups(until_closed=True)
        pending: asyncio.Future[list[TrainerRollout]] | None = None
        try:
            while not self._stop.is_set():
                if pending is None:
                    pending = asyncio.ensure_future(anext(groups))
                done, _ = await asyncio.wait({pending}, timeout=1.0)
                if not done:
                    continue
                try:
                    unit = pending.result()
                except StopAsyncIteration:
                    pending = None
                    return
                pending = None
                for sample in self._samples(unit):
                    await self._put(sample)
                self._heartbeat = time.time()
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            await groups.aclose()

    async def _put(self, sample: Any) -> None:
        """Into the buffer; while it is full the trainer is behind (backpressure holds the job)."""
        while not self._stop.is_set():
            try:
                await asyncio.to_thread(self.rollout_buffer.put, sample, True, 1.0)
                return
            except queue.Full:
                self._heartbeat = time.time()

    def _samples(self, group: list[TrainerRollout]) -> list[Any]:
        """TRL's RolloutSamples of one group: one per segment of each rollout's token record (an agent
        program that rewrote its history has several), each with the rollout's advantage."""
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        self.groups += 1
        self.recent.extend(group)
        rewards = [r.reward for r in group]
        advantages = grpo_advantages(rewards, [0] * len(group), eps=1e-8, masked=[r.masked for r in group])
        samples = []
        now = time.time()
        for r, advantage in zip(group, advantages, strict=True):
            if r.logprobs is None or not r.token_ids:
                continue  # nothing TRL can train on (the job records logprobs; a server gave no ids)
            prompt = row_prompt(r.task)
            completion = [{"role": m.role, "content": m.content} for m in r.raw.messages]
            version = r.version if r.version is not None else self.model_version
            for start, end in r.segments:
                mask = [0] * (end - start) if r.masked else r.loss_mask[start:end]
                samples.append(
                    RolloutSample(
                        prompt=prompt,
                        completion=completion,
                        input_ids=np.asarray(r.token_ids[start:end], dtype=np.int64),
                        completion_mask=np.asarray(mask, dtype=np.int64),
                        old_log_probs=np.asarray(r.logprobs[start:end], dtype=np.float32),
                        advantage=float(advantage),
                        model_version=version,
                        group_id=self.groups,
                        metrics={"reward": math.nan if r.masked else float(r.reward)},
                        enqueued_at=now,
                    )
                )
        return samples
