"""mesh/fields.py: the by-name copy every convert.py builds on, held to its docstring's contract."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field

import pytest

from rollmesh.mesh.fields import from_pb
from rollmesh.mesh.fields import to_pb
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import scheduler_pb2


@dataclass(frozen=True)
class _Span:
    prompt_start: int
    output_start: int
    output_end: int
    replica_id: str = ""


@dataclass
class _Tokens:
    token_ids: list[int] = field(default_factory=list)
    logprobs: tuple[float, ...] = ()
    turns: list[_Span] = field(default_factory=list)
    note: str = "not on the wire"


@dataclass(frozen=True)
class _Sampling:
    temperature: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False


def test_to_pb_copies_same_named_fields_and_converts_nested_dataclasses() -> None:
    rec = _Tokens(token_ids=[1, 2, 3], logprobs=(-0.5,), turns=[_Span(0, 1, 3, "r0"), _Span(3, 4, 5)])
    msg = to_pb(common_pb2.TokenRecord, rec)
    assert list(msg.token_ids) == [1, 2, 3]
    assert list(msg.logprobs) == [-0.5]
    assert [(t.prompt_start, t.output_end, t.replica_id) for t in msg.turns] == [(0, 3, "r0"), (3, 5, "")]
    assert list(msg.loss_mask) == []  # no such attribute: the proto default


def test_to_pb_given_values_win_and_none_leaves_a_field_unset() -> None:
    rec = _Tokens(token_ids=[1, 2])
    msg = to_pb(common_pb2.TokenRecord, rec, token_ids=[9], loss_mask=[1])
    assert list(msg.token_ids) == [9] and list(msg.loss_mask) == [1]
    job = to_pb(scheduler_pb2.Job, object(), job_id="j", end_time=None)
    assert job.job_id == "j" and not job.HasField("end_time")


def test_to_pb_reads_properties_and_maps() -> None:
    @dataclass
    class Usage:
        prompt_tokens: int
        completion_tokens: int

        @property
        def total_tokens(self) -> int:
            return self.prompt_tokens + self.completion_tokens

    assert to_pb(common_pb2.Usage, Usage(3, 4)).total_tokens == 7

    @dataclass
    class Metrics:
        pass_at_k: dict[int, float]

    assert dict(to_pb(scheduler_pb2.JobMetrics, Metrics({1: 0.5, 4: 0.75})).pass_at_k) == {1: 0.5, 4: 0.75}


def test_to_pb_refuses_a_value_of_the_wrong_type() -> None:
    @dataclass
    class Listed:
        name: object

    with pytest.raises(TypeError):
        to_pb(gateway_pb2.ModelInfo, Listed(name=3.5))


def test_from_pb_unset_optional_fields_keep_the_dataclass_default() -> None:
    got = from_pb(_Sampling, common_pb2.SamplingParams(top_k=0, stop=["a", "b"]))
    assert got == _Sampling(temperature=None, top_k=0, stop=("a", "b"), logprobs=False)
    assert isinstance(got.stop, tuple)  # the container follows the dataclass default
    got = from_pb(_Sampling, common_pb2.SamplingParams(temperature=0.0, logprobs=True))
    assert got.temperature == 0.0 and got.logprobs is True


def test_from_pb_leaves_message_fields_to_the_caller() -> None:
    msg = common_pb2.TokenRecord(token_ids=[4], logprobs=[-1.0], turns=[common_pb2.TurnSpan(output_end=2)])
    got = from_pb(_Tokens, msg)
    assert (
        got.token_ids == [4] and got.logprobs == (-1.0,) and got.turns == [] and got.note == "not on the wire"
    )
    got = from_pb(_Tokens, msg, turns=[from_pb(_Span, t) for t in msg.turns])
    assert got.turns == [_Span(0, 0, 2)]
    with pytest.raises(TypeError):
        from_pb(_Span, common_pb2.TokenRecord())  # required fields the proto lacks must be given


def test_from_pb_gives_a_repeated_field_as_a_list_of_its_own() -> None:
    msg = common_pb2.TokenRecord(token_ids=[4, 5])
    got = from_pb(_Tokens, msg)
    assert type(got.token_ids) is list and got.token_ids == [4, 5]
    assert type(from_pb(_Tokens, common_pb2.TokenRecord()).token_ids) is list
    got.token_ids.append(6)
    assert list(msg.token_ids) == [4, 5]


def test_from_pb_ignores_given_names_that_are_no_fields_and_copies_one_scalar() -> None:
    @dataclass(frozen=True)
    class Key:
        task_index: int
        rollout_index: int

    msg = common_pb2.RolloutKey(task_index=3, rollout_index=4)
    assert from_pb(Key, msg) == Key(3, 4)
    assert from_pb(Key, msg, task_index=7, not_a_field=1) == Key(7, 4)  # one scalar left to copy
    assert from_pb(Key, msg, rollout_index=9, task_index=8) == Key(8, 9)  # none left
