"""UpdateWeights in the Gateway over FakeBackends: checkpoint validation before anything is touched,
FINISH_IN_FLIGHT vs ABORT_AND_RETRY, all-or-nothing across replicas, policy versions."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from rollmesh.gateway import Gateway
from rollmesh.gateway import GenerateInput
from rollmesh.gateway import Message
from rollmesh.gateway.backends.base import SamplingInput
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.types import GenerateResult
from rollmesh.gateway.weights import check_checkpoint
from rollmesh.gateway.weights import next_version
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.versions import VersionSpan

USER = (Message("user", "what is 5+7?"),)
TENSORS = {"embed.weight": (16, 4), "layer.0.weight": (4, 4), "norm.weight": (4,)}


def write_checkpoint(path: Path, *, scale: float = 1.0, **changes: Any) -> Path:
    """A tiny safetensors checkpoint; `changes`: drop=name, shape=(name, shape), vocab=..., config=..."""
    path.mkdir(parents=True, exist_ok=True)
    shapes = dict(TENSORS)
    if "drop" in changes:
        del shapes[changes["drop"]]
    if "shape" in changes:
        name, shape = changes["shape"]
        shapes[name] = shape
    tensors = {n: torch.full(s, scale) for n, s in shapes.items()}
    save_file(tensors, str(path / "model.safetensors"))
    config = {"architectures": ["Tiny"], "hidden_size": 4, "transformers_version": "5.0"}
    config |= changes.get("config", {})
    (path / "config.json").write_text(json.dumps(config))
    vocab = changes.get("vocab", {"a": 0, "b": 1})
    (path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))
    return path


@pytest.fixture
def served(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "served")


async def started(backend: FakeBackend) -> Gateway:
    gw = Gateway([backend])
    await gw.start()
    return gw


def inp(**kw: Any) -> GenerateInput:
    kw.setdefault("messages", USER)
    return GenerateInput(**kw)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"drop": "norm.weight"}, "tensor norm.weight is missing"),
        ({"shape": ("layer.0.weight", (4, 8))}, "tensor layer.0.weight has shape [4, 8], served [4, 4]"),
        ({"shape": ("extra.weight", (2,))}, "tensor extra.weight is not in the served model"),
        ({"vocab": {"a": 0, "c": 1}}, "tokenizer.json has another vocabulary"),
        ({"config": {"hidden_size": 8}}, "config.json hidden_size is 8, served 4"),
    ],
)
def test_incompatible_checkpoints_are_refused_naming_the_problem(
    served: Path, tmp_path: Path, changes: dict[str, Any], problem: str
) -> None:
    bad = write_checkpoint(tmp_path / "bad", **changes)
    with pytest.raises(RollmeshError) as info:
        check_checkpoint(bad, served)
    assert info.value.reason == "CHECKPOINT_INCOMPATIBLE"
    assert problem in info.value.message


def test_a_weights_only_checkpoint_with_changed_values_fits(served: Path, tmp_path: Path) -> None:
    new = write_checkpoint(tmp_path / "new", scale=2.0, config={"transformers_version": "5.1"})
    (new / "tokenizer.json").unlink()
    manifest = check_checkpoint(new, served)
    assert sorted(manifest.tensors) == sorted(TENSORS)


def test_not_a_checkpoint(served: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "model.safetensors").write_bytes(b"\x01\x02")
    for folder, problem in [
        ("empty", r"no \*\.safetensors file"),
        ("junk", "not a readable safetensors file"),
    ]:
        with pytest.raises(RollmeshError, match=problem):
            check_checkpoint(tmp_path / folder, served)


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("file", "text", "problem"),
    [
        (
            "model.safetensors",
            DEEP,
            "model.safetensors is not a readable safetensors file (nested too deeply)",
        ),
        ("model.safetensors", '{"w": {"dtype": "F32", "shape": ["x"]}}', "not a readable safetensors file"),
        ("model.safetensors", '{"w": 5}', "not a readable safetensors file"),
        ("config.json", DEEP, "config.json is not JSON (nested too deeply)"),
        ("tokenizer.json", "[1]", "tokenizer.json is not a JSON object"),
    ],
)
def test_a_hostile_checkpoint_file_is_refused_naming_it(
    served: Path, tmp_path: Path, file: str, text: str, problem: str
) -> None:
    """An uploaded checkpoint is the caller's input: a header nested past the recursion limit, a
    shape that is not numbers, a tokenizer.json list were RecursionError/ValueError/AttributeError
    out of the check, so UpdateWeights answered INTERNAL."""
    bad = write_checkpoint(tmp_path / "bad")
    data = text.encode()
    (bad / file).write_bytes(struct.pack("<Q", len(data)) + data if file.endswith(".safetensors") else data)
    with pytest.raises(RollmeshError) as info:
        check_checkpoint(bad, served)
    assert info.value.reason == "CHECKPOINT_INCOMPATIBLE" and problem in info.value.message, (
        info.value.message
    )


def test_next_version_counts_up_integers() -> None:
    assert [next_version(""), next_version("1"), next_version("41")] == ["1", "2", "42"]
    with pytest.raises(RollmeshError, match="give policy_version"):
        next_version("step-a")


async def test_update_loads_every_replica_and_bumps_the_version_later_results_carry(
    served: Path, tmp_path: Path
) -> None:
    backend = FakeBackend("m", num_replicas=2, weights_dir=served)
    gw = await started(backend)
    assert (await gw.generate(inp())).policy_version == "0"
    new = write_checkpoint(tmp_path / "step1", scale=2.0)
    update = await gw.update_weights("m", new)
    assert (update.policy_version, update.previous_version, update.tensors) == ("1", "0", 3)
    assert sorted(update.replica_ids) == ["m-replica-0", "m-replica-1"]
    assert set(backend.loaded_weights.values()) == {new}
    assert (await gw.generate(inp())).policy_version == "1"
    update = await gw.update_weights("", write_checkpoint(tmp_path / "step2"), policy_version="7")
    assert (update.policy_version, update.previous_version) == ("7", "1")
    assert (await gw.list_models())[0].policy_version == "7"


async def test_rejected_checkpoint_touches_nothing(served: Path, tmp_path: Path) -> None:
    backend = FakeBackend("m", num_replicas=2, weights_dir=served)
    gw = await started(backend)
    bad = write_checkpoint(tmp_path / "bad", drop="embed.weight")
    with pytest.raises(RollmeshError) as info:
        await gw.update_weights("m", bad)
    assert info.value.reason == "CHECKPOINT_INCOMPATIBLE"
    assert backend.weight_loads == 0 and set(backend.loaded_weights.values()) == {served}
    r = await gw.generate(inp())
    assert (r.finish_reason, r.policy_version) == ("stop", "0")
    assert not (await gw.list_models())[0].paused


async def test_a_replica_failing_to_load_fails_the_update_and_the_old_weights_keep_serving(
    served: Path, tmp_path: Path
) -> None:
    def fail_second(replica: str, checkpoint: Path) -> None:
        if replica.endswith("-1"):
            raise OSError("disk read error")

    backend = FakeBackend("m", num_replicas=2, weights_dir=served, weight_load_hook=fail_second)
    gw = await started(backend)
    gw.set_policy_version("m", "3")
    with pytest.raises(RollmeshError) as info:
        await gw.update_weights("m", write_checkpoint(tmp_path / "new", scale=2.0))
    assert info.value.reason == "WEIGHT_LOAD_FAILED"
    assert "m-replica-1: disk read error" in info.value.message
    assert set(backend.loaded_weights.values()) == {served}
    assert backend.weights_path == served
    assert (await gw.generate(inp())).policy_version == "3"


async def test_finish_in_flight_lets_running_generations_end_on_the_old_version(
    served: Path, tmp_path: Path
) -> None:
    backend = FakeBackend("m", weights_dir=served, script=lambda p, r: "abcdef")
    gw = await started(backend)
    backend.token_latency_s = 0.05
    running = asyncio.create_task(gw.generate(inp(request_id="old")))
    await backend.wait_running("old")
    update = asyncio.create_task(gw.update_weights("m", write_checkpoint(tmp_path / "new")))
    for _ in range(3000):  # the update holds new generations (bounded wait: 30 s) ...
        if (await gw.list_models())[0].paused:
            break
        await asyncio.sleep(0.01)
    assert (await gw.list_models())[0].paused
    held = asyncio.create_task(gw.generate(inp(request_id="new")))
    old = await running
    assert (old.finish_reason, old.policy_version, old.message.content) == ("stop", "0", "abcdef")
    assert (await update).retried_requests == 0
    assert (await held).policy_version == "1"  # ... which run on the new weights
    assert "old" not in backend.aborted


async def test_abort_and_retry_reruns_running_generations_on_the_new_weights(
    served: Path, tmp_path: Path
) -> None:
    backend = FakeBackend("m", weights_dir=served, script=lambda p, r: "abcdef")
    gw = await started(backend)
    backend.token_latency_s = 60  # would never finish on its own
    running = asyncio.create_task(gw.generate(inp(request_id="r1")))
    await backend.wait_running("r1")

    def fast(replica: str, checkpoint: Path) -> None:
        backend.token_latency_s = 0.0

    backend.weight_load_hook = fast
    update = await asyncio.wait_for(
        gw.update_weights("m", write_checkpoint(tmp_path / "new"), in_flight="abort_and_retry"), 30
    )
    assert update.retried_requests == 1 and "r1" in backend.aborted
    r = await asyncio.wait_for(running, 30)
    assert (r.finish_reason, r.policy_version, r.message.content) == ("stop", "1", "abcdef")
    assert [req.request_id for req in backend.requests].count("r1") == 2


async def test_a_stream_that_already_sent_deltas_ends_with_abort_instead_of_rerunning(
    served: Path, tmp_path: Path
) -> None:
    backend = FakeBackend("m", weights_dir=served, script=lambda p, r: "abcdef")
    gw = await started(backend)
    backend.token_latency_s = 60
    stream = gw.generate_stream(inp(request_id="s1"))
    first = await anext(stream)  # the first delta reached the caller
    update = asyncio.create_task(
        gw.update_weights("m", write_checkpoint(tmp_path / "new"), in_flight="abort_and_retry")
    )
    rest = [x async for x in stream]
    assert getattr(first, "text", "") == "a"
    assert (
        getattr(rest[-1], "finish_reason", "") == "abort" and getattr(rest[-1], "policy_version", "?") == "0"
    )
    assert (await update).policy_version == "1"


async def test_finish_in_flight_past_the_drain_timeout_changes_nothing(served: Path, tmp_path: Path) -> None:
    backend = FakeBackend("m", weights_dir=served)
    gw = await started(backend)
    backend.token_latency_s = 60
    running = asyncio.create_task(gw.generate(inp(request_id="slow")))
    await backend.wait_running("slow")
    with pytest.raises(RollmeshError) as info:
        await gw.update_weights("m", write_checkpoint(tmp_path / "new"), drain_timeout_s=0.2)
    assert info.value.reason == "WEIGHT_UPDATE_DRAIN_TIMEOUT"
    assert backend.weight_loads == 0
    assert not (await gw.list_models())[0].paused
    await gw.abort("slow")
    assert (await running).policy_version == "0"


async def test_a_paused_model_stays_paused_after_an_update(served: Path, tmp_path: Path) -> None:
    gw = await started(FakeBackend("m", weights_dir=served))
    gw.pause("m")
    await gw.update_weights("m", write_checkpoint(tmp_path / "new"))
    assert (await gw.list_models())[0].paused


async def test_backends_without_weights_refuse_updates(tmp_path: Path) -> None:
    gw = await started(FakeBackend("m"))
    with pytest.raises(RollmeshError) as info:
        await gw.update_weights("m", write_checkpoint(tmp_path / "new"))
    assert info.value.reason == "WEIGHT_UPDATES_UNSUPPORTED"


def test_fixture_checkpoint_is_self_consistent(served: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(served, copy)
    assert check_checkpoint(copy, served).path == copy


class CancellingBackend(FakeBackend):
    """Ends an aborted request with an error instead of an "abort" chunk (as Ray Serve does for a
    request cancelled before a replica took it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cancelled: set[str] = set()

    async def generate(self, request: Any) -> Any:
        async for chunk in super().generate(request):
            rid = request.request_id
            if rid in self.aborted and rid not in self.cancelled:
                self.cancelled.add(rid)
                raise RuntimeError(f"request {rid} cancelled")
            yield chunk


async def test_abort_and_retry_also_reruns_a_request_the_backend_cancelled_with_an_error(
    served: Path, tmp_path: Path
) -> None:
    backend = CancellingBackend("m", weights_dir=served, script=lambda p, r: "abc")
    gw = await started(backend)
    backend.token_latency_s = 60
    running = asyncio.create_task(gw.generate(inp(request_id="r1")))
    await backend.wait_running("r1")

    def fast(replica: str, checkpoint: Path) -> None:
        backend.token_latency_s = 0.0

    backend.weight_load_hook = fast
    update = await gw.update_weights("m", write_checkpoint(tmp_path / "new"), in_flight="abort_and_retry")
    r = await asyncio.wait_for(running, 30)
    assert backend.cancelled == {"r1"} and update.retried_requests == 1
    assert (r.finish_reason, r.policy_version, r.message.content) == ("stop", "1", "abc")


async def test_a_rollout_straddling_the_first_update_is_as_old_as_its_first_turn(
    served: Path, tmp_path: Path
) -> None:
    """The weights a model is first served with are version "0": unlabelled, a rollout whose first
    turn ran on them and whose second ran after the first update counted as version 1 (the only
    integer among its turns), so a strictly on-policy trainer took it as fresh."""
    from rollmesh.scheduler import convert
    from rollmesh.scheduler.records import Rollout
    from rollmesh.scheduler.records import RolloutKey
    from rollmesh.scheduler.tokens import build_token_record
    from rollmesh_client.trainer import TrainerRollout

    gw = await started(FakeBackend("m", weights_dir=served))
    first = await gw.generate(inp(session_id="s"))
    assert (await gw.list_models())[0].policy_version == "0"
    update = await gw.update_weights("m", write_checkpoint(tmp_path / "step1", scale=2.0))
    assert (update.previous_version, update.policy_version) == ("0", "1")
    follow_up = (*USER, first.message, Message("user", "and 1+1?"))
    second = await gw.generate(inp(messages=follow_up, session_id="s"))
    rec = build_token_record([first, second])  # a GenerateResult carries a turn's ids
    assert [t.policy_version for t in rec.turns] == ["0", "1"]
    rollout = Rollout(RolloutKey(0, 0), "j", {}, [], 1.0, tokens=rec, policy_version="1")
    assert TrainerRollout.from_pb(convert.rollout_to_pb(rollout)).version == 0


def interrupted(fate: str) -> float:
    """The gateway's count of output ids weight updates interrupted, by fate (its Prometheus counter)."""
    from prometheus_client import REGISTRY

    return (
        REGISTRY.get_sample_value("rollmesh_gateway_weight_update_tokens_total", {"model": "m", "fate": fate})
        or 0.0
    )


def new_weights_upper(backend: FakeBackend, target: str = "abcdef") -> Any:
    """A script that writes the rest of `target` after what the assistant already wrote in the
    prompt: lowercase on the served weights, uppercase once new weights are loaded (so the output
    shows which weights produced which characters)."""

    def script(prompt: str, request: Any) -> str:
        so_far = prompt.rsplit("<|assistant|>\n", 1)[-1]
        rest = target[len(so_far) :]
        return rest.upper() if backend.weight_loads else rest

    return script


async def test_continue_goes_on_from_the_streamed_ids_on_the_new_weights(
    served: Path, tmp_path: Path
) -> None:
    backend = FakeBackend("m", weights_dir=served)
    backend.script = new_weights_upper(backend)
    gw = await started(backend)
    resubmitted_before = interrupted("resubmitted")
    backend.token_latency_s = 0.01
    stream = gw.generate_stream(inp(request_id="p1", sampling=SamplingInput(max_tokens=50, logprobs=True)))
    assert [getattr(await anext(stream), "text", "") for _ in range(2)] == ["a", "b"]
    backend.token_latency_s = 60  # the next id waits for the update

    def fast(replica: str, checkpoint: Path) -> None:
        backend.token_latency_s = 0.0

    backend.weight_load_hook = fast
    update = asyncio.create_task(
        gw.update_weights("m", write_checkpoint(tmp_path / "new"), in_flight="continue")
    )
    rest = [x async for x in stream]
    result = rest[-1]
    assert isinstance(result, GenerateResult)
    k = result.versions[0].end  # ids produced on the old weights: the two read, maybe one more
    assert 2 <= k <= 3
    assert result.versions == (VersionSpan(0, k, "0"), VersionSpan(k, 7, "1"))
    assert (result.finish_reason, result.policy_version) == ("stop", "0")
    assert result.message.content == "abcdef"[:k] + "ABCDEF"[k:]
    assert "".join(getattr(x, "text", "") for x in rest[:-1]) == result.message.content[2:]
    assert len(result.logprobs) == len(result.output_token_ids) == 7
    first, second = [r for r in backend.requests if r.request_id == "p1"]
    assert second.prompt_token_ids == (*first.prompt_token_ids, *result.output_token_ids[:k])
    assert second.sampling.max_tokens == first.sampling.max_tokens - k == 50 - k
    assert result.prompt_token_ids == first.prompt_token_ids  # the caller's prompt, not the resubmitted one
    assert (await update).retried_requests == 1
    assert interrupted("resubmitted") - resubmitted_before == k


async def test_continue_ends_on_a_stop_string_that_spans_the_resume_point(
    served: Path, tmp_path: Path
) -> None:
    """Stop "bcd" with "ab" (or "abc") produced before the update: the engine, given those ids as
    prompt, never sees "bcd" whole; the gateway ends the generation at "d" as an uninterrupted run
    would have (it went on to "abcdef" before)."""

    def script(prompt: str, request: Any) -> str:
        return "abcdef"[len(prompt.rsplit("<|assistant|>\n", 1)[-1]) :]

    backend = FakeBackend("m", weights_dir=served, script=script)
    gw = await started(backend)
    backend.token_latency_s = 0.01
    sampling = SamplingInput(max_tokens=50, stop=["bcd"])
    stream = gw.generate_stream(inp(request_id="p4", sampling=sampling))
    assert [getattr(await anext(stream), "text", "") for _ in range(2)] == ["a", "b"]
    backend.token_latency_s = 60  # the next id waits for the update

    def fast(replica: str, checkpoint: Path) -> None:
        backend.token_latency_s = 0.0

    backend.weight_load_hook = fast
    update = asyncio.create_task(
        gw.update_weights("m", write_checkpoint(tmp_path / "new"), in_flight="continue")
    )
    result = [x async for x in stream][-1]
    assert isinstance(result, GenerateResult)
    k = result.versions[0].end
    assert 2 <= k <= 3
    assert (result.message.content, result.finish_reason) == ("a", "stop")
    assert result.versions == (VersionSpan(0, k, "0"), VersionSpan(k, 4, "1"))
    assert len(result.output_token_ids) == 4  # a, b, c and the d that completed the stop string
    assert "p4" in backend.aborted  # the continuation, which went on past it, was stopped
    await update


async def test_continue_before_any_id_runs_the_whole_generation_on_the_new_version(
    served: Path, tmp_path: Path
) -> None:
    backend = FakeBackend("m", weights_dir=served)
    backend.script = new_weights_upper(backend)
    gw = await started(backend)
    backend.first_token_latency_s = 60
    running = asyncio.create_task(gw.generate(inp(request_id="p2")))
    await backend.wait_running("p2")

    def fast(replica: str, checkpoint: Path) -> None:
        backend.first_token_latency_s = 0.0

    backend.weight_load_hook = fast
    await gw.update_weights("m", write_checkpoint(tmp_path / "new"), in_flight="continue")
    r = await asyncio.wait_for(running, 30)
    assert (r.message.content, r.policy_version, r.versions) == ("ABCDEF", "1", ())
    first, second = [q for q in backend.requests if q.request_id == "p2"]
    assert second.prompt_token_ids == first.prompt_token_ids


async def test_continue_after_the_last_allowed_id_ends_with_length(served: Path, tmp_path: Path) -> None:
    """An abort that arrives once max_tokens ids are out leaves nothing to continue: "length"."""

    class LateAbort(FakeBackend):
        async def generate(self, request: Any) -> Any:
            async for chunk in super().generate(request):
                if chunk.finish_reason == "length":
                    await self.wait_aborted(request.request_id)
                    yield dataclasses.replace(chunk, finish_reason="abort")
                    return
                yield chunk

    backend = LateAbort("m", weights_dir=served, script=lambda p, r: "abcdef")
    gw = await started(backend)
    running = asyncio.create_task(gw.generate(inp(request_id="p3", sampling=SamplingInput(max_tokens=3))))
    await backend.wait_running("p3")
    await gw.update_weights("m", write_checkpoint(tmp_path / "new"), in_flight="continue")
    r = await asyncio.wait_for(running, 30)
    assert (r.message.content, r.finish_reason, r.versions) == ("abc", "length", ())
    assert [q.request_id for q in backend.requests].count("p3") == 1


async def test_a_continued_turn_keeps_its_versions_through_record_row_proto_and_collate(
    served: Path, tmp_path: Path
) -> None:
    """A turn split by a CONTINUE update, then a turn on the new weights: the token record says
    which version made which ids (validated), through the JSONL row and the proto; the trainer's
    version (the staleness bound's) is the oldest, and `collate` gives each generated id its own."""
    from rollmesh.scheduler import convert
    from rollmesh.scheduler.records import Rollout
    from rollmesh.scheduler.records import RolloutKey
    from rollmesh.scheduler.records import TokenRecord
    from rollmesh.scheduler.tokens import build_token_record
    from rollmesh.scheduler.tokens import validate_token_record
    from rollmesh_client.trainer import TrainerRollout
    from rollmesh_client.trainer import collate
    from rollmesh_client.trainer import verl_view

    backend = FakeBackend("m", weights_dir=served)
    backend.script = new_weights_upper(backend)
    gw = await started(backend)
    backend.token_latency_s = 0.01
    stream = gw.generate_stream(inp(session_id="s", sampling=SamplingInput(logprobs=True)))
    await anext(stream)
    backend.token_latency_s = 60

    def fast(replica: str, checkpoint: Path) -> None:
        backend.token_latency_s = 0.0

    backend.weight_load_hook = fast
    update = asyncio.create_task(
        gw.update_weights("m", write_checkpoint(tmp_path / "v1"), in_flight="continue")
    )
    first = [x async for x in stream][-1]
    assert isinstance(first, GenerateResult) and len(first.versions) == 2
    await update
    follow_up = (*USER, first.message, Message("user", "again"))
    second = await gw.generate(inp(messages=follow_up, session_id="s", sampling=SamplingInput(logprobs=True)))
    assert (second.policy_version, second.versions) == ("1", ())

    rec = build_token_record([first, second], logprobs_wanted=True)
    t1, t2 = rec.turns
    k = first.versions[0].end
    assert t1.versions == (
        VersionSpan(t1.output_start, t1.output_start + k, "0"),
        VersionSpan(t1.output_start + k, t1.output_end, "1"),
    )
    assert (t1.policy_version, t2.versions) == ("0", ())
    assert validate_token_record(rec) == []
    assert TokenRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    broken = dataclasses.replace(t1, versions=(t1.versions[0],))
    assert validate_token_record(dataclasses.replace(rec, turns=[broken, t2])) == [
        f"turn 1: version spans end at {t1.output_start + k}, its output at {t1.output_end}"
    ]

    rollout = Rollout(RolloutKey(0, 0), "j", {}, [], 1.0, tokens=rec, policy_version="1")
    pb = convert.rollout_to_pb(rollout)
    assert convert.rollout_from_pb(pb).tokens.turns == rec.turns
    trainer = TrainerRollout.from_pb(pb)
    assert trainer.version == 0
    batch = collate([trainer])
    assert batch.token_versions is not None
    row = batch.token_versions[0].tolist()
    expected = [-1] * len(rec.token_ids)
    expected[t1.output_start : t1.output_start + k] = [0] * k
    expected[t1.output_start + k : t1.output_end] = [1] * (t1.output_end - t1.output_start - k)
    expected[t2.output_start : t2.output_end] = [1] * (t2.output_end - t2.output_start)
    assert row == expected
    view = verl_view(batch)
    p = t1.output_start
    assert view["response_versions"][0, : len(rec.token_ids) - p].tolist() == expected[p:]


def test_the_http_extension_names_the_versions_only_of_a_split_output() -> None:
    from rollmesh.gateway.http.protocol import extension
    from rollmesh.gateway.types import Usage

    whole = GenerateResult(
        Message("assistant", "ab"), (1,), (2, 3), (), "stop", Usage(1, 2), "r", "4", "m", "q"
    )
    split = dataclasses.replace(whole, versions=(VersionSpan(0, 1, "4"), VersionSpan(1, 2, "5")))
    assert "versions" not in extension(whole, "s")
    assert extension(split, "s")["versions"] == [
        {"start": 0, "end": 1, "policy_version": "4"},
        {"start": 1, "end": 2, "policy_version": "5"},
    ]
