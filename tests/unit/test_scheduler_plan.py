"""Spec validation (code + ErrorInfo reason), shard selection, dataset and benchmark resolution."""

from __future__ import annotations

import itertools
import json
import math
import tracemalloc
from pathlib import Path

import grpc
import pytest

from rollmesh.mesh.errors import RollmeshError
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.plan import load_rows
from rollmesh.scheduler.plan import select_tasks
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh.scheduler.spec import SinkConfig
from rollmesh.scheduler.spec import validate
from tests.fakes import Rows


@pytest.fixture
def catalog() -> Catalog:
    return Catalog([Root(BUILTIN_ROOT, 0, "root")])


def test_select_tasks_limit_then_shard() -> None:
    assert select_tasks(10) == list(range(10))
    assert select_tasks(10, limit=4) == [0, 1, 2, 3]
    assert select_tasks(10, shard_index=1, shard_count=3) == [1, 4, 7]
    shards = [select_tasks(10, shard_index=i, shard_count=3) for i in range(3)]
    assert sorted(itertools.chain(*shards)) == list(range(10))  # disjoint and complete
    assert select_tasks(10, limit=5, shard_index=0, shard_count=2) == [0, 2, 4]


def _err(exc: pytest.ExceptionInfo[RollmeshError]) -> tuple[grpc.StatusCode, str]:
    return exc.value.code, exc.value.reason


@pytest.mark.parametrize(
    ("spec", "reason", "needle"),
    [
        (JobSpec(dataset="d", num_repeats=-1), "INVALID_JOB_SPEC", "num_repeats"),
        (JobSpec(dataset="d", concurrency=-5), "INVALID_JOB_SPEC", "concurrency"),
        (JobSpec(dataset="d", retry=RetryPolicy(max_attempts=-1)), "INVALID_JOB_SPEC", "retry.max_attempts"),
        (JobSpec(dataset="d", shard_index=3, shard_count=3), "INVALID_SHARD", "[0, 3)"),
        (JobSpec(dataset="d", shard_index=1, shard_count=0), "INVALID_SHARD", "shard count"),
        (JobSpec(), "INVALID_JOB_SPEC", "no dataset"),
        (JobSpec(dataset="d", sampling={"top_p": 0.0}), "INVALID_JOB_SPEC", "top_p"),
        (JobSpec(dataset="d", sampling={"temperature": math.nan}), "INVALID_JOB_SPEC", "temperature"),
        (
            JobSpec(dataset="d", retry=RetryPolicy(unavailable_budget_s=math.nan)),
            "INVALID_JOB_SPEC",
            "retry.unavailable_budget_s is nan",
        ),
        (
            JobSpec(dataset="d", retry=RetryPolicy(rollout_timeout_s=math.inf)),
            "INVALID_JOB_SPEC",
            "retry.rollout_timeout_s is inf",
        ),
        (  # gRPC dialled port 34463 (99999 mod 65536): rollouts sent to whatever listens there
            JobSpec(dataset="d", sink=SinkConfig(kind="grpc", address="10.0.0.5:99999")),
            "INVALID_JOB_SPEC",
            "sink.grpc.address '10.0.0.5:99999' is not host:port",
        ),
    ],
)
def test_validate_rejects(spec: JobSpec, reason: str, needle: str) -> None:
    with pytest.raises(RollmeshError) as info:
        validate(spec)
    assert _err(info) == (grpc.StatusCode.INVALID_ARGUMENT, reason)
    assert needle in info.value.message


def test_benchmark_defaults_and_builtin_dataset(catalog: Catalog) -> None:
    plan = build_plan(catalog, JobSpec(benchmark="arithmetic", limit=3))
    assert plan.spec.environment == "arithmetic" and plan.num_repeats == 8
    assert plan.spec.sampling == {"temperature": 1.0, "max_tokens": 16}
    assert plan.dataset_path.name == "test.jsonl" and plan.total == 24
    assert plan.k_values == (1, 2, 4, 8)
    override = build_plan(
        catalog, JobSpec(benchmark="arithmetic", num_repeats=2, sampling={"temperature": 0.0})
    )
    assert override.num_repeats == 2 and override.spec.sampling["temperature"] == 0.0


def test_unknown_dataset_and_benchmark(catalog: Catalog, tmp_path: Path) -> None:
    with pytest.raises(RollmeshError) as info:
        build_plan(catalog, JobSpec(dataset="nope", environment="arithmetic"))
    assert _err(info) == (grpc.StatusCode.NOT_FOUND, "DATASET_NOT_FOUND")
    with pytest.raises(RollmeshError) as info:
        build_plan(catalog, JobSpec(benchmark="nope"))
    assert _err(info) == (grpc.StatusCode.NOT_FOUND, "BENCHMARK_NOT_FOUND")
    with pytest.raises(RollmeshError) as info:
        build_plan(catalog, JobSpec(dataset=str(tmp_path / "missing.jsonl"), environment="arithmetic"))
    assert _err(info) == (grpc.StatusCode.NOT_FOUND, "DATASET_NOT_FOUND")


def test_malformed_row_names_its_line(catalog: Catalog, tmp_path: Path) -> None:
    path = Rows.arithmetic(3).write(tmp_path / "d.jsonl")
    with open(path, "a") as f:
        f.write("\n{not json}\n")
    with pytest.raises(RollmeshError) as info:
        build_plan(catalog, JobSpec(dataset=str(path), environment="arithmetic"))
    assert _err(info) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_DATASET_ROW")
    assert f"{path}:5:" in info.value.message
    bad = tmp_path / "b.jsonl"
    # (an empty list is a row whose environment gives the prompt: NeMo Gym's aviary rows)
    bad.write_text('{"responses_create_params": {"input": {}}}\n')
    with pytest.raises(RollmeshError) as info:
        build_plan(catalog, JobSpec(dataset=str(bad), environment="arithmetic"))
    assert "b.jsonl:1:" in info.value.message and "input` must be a list" in info.value.message
    bad.write_text('{"responses_create_params": {"inp')  # cut off: read "starting at at column 30"
    with pytest.raises(RollmeshError) as info:
        build_plan(catalog, JobSpec(dataset=str(bad), environment="arithmetic"))
    assert "b.jsonl:1: not valid JSON (Unterminated string starting at column 30)" in info.value.message
    for role in (True, "", {}):  # was sent as the role "True", "" or "{}": a prompt nobody wrote
        bad.write_text(
            json.dumps({"responses_create_params": {"input": [{"role": role, "content": "2+3?"}]}})
        )
        with pytest.raises(RollmeshError, match="is not a message with a `role`"):
            build_plan(catalog, JobSpec(dataset=str(bad), environment="arithmetic"))
    # A lone surrogate passed the plan and failed every rollout as INTERNAL (UnicodeEncodeError).
    bad.write_text('{"responses_create_params": {"input": "2+3? \\ud800"}, "expected_answer": "5"}\n')
    with pytest.raises(RollmeshError) as info:
        build_plan(catalog, JobSpec(dataset=str(bad), environment="arithmetic"))
    assert _err(info) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_DATASET_ROW")
    assert "b.jsonl:1: not valid JSON (a string holds a lone UTF-16 surrogate" in info.value.message


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"temperature": "hot"}, "`responses_create_params.temperature` must be a number, not 'hot'"),
        ({"top_p": float("nan")}, "`responses_create_params.top_p` must be a number, not nan"),
        ({"max_output_tokens": [5]}, "`responses_create_params.max_output_tokens` must be an integer"),
        ({"top_k": True}, "`responses_create_params.top_k` must be an integer, not True"),
        ({"stop": 5}, "`responses_create_params.stop` must be a string or a list of strings, not 5"),
        (  # the image was dropped and the model asked the rest of the question
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "What is in the picture?"},
                            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                        ],
                    }
                ]
            },
            "`responses_create_params.input[0].content`: only text content parts are supported",
        ),
    ],
)
def test_a_row_sampling_value_of_the_wrong_type_names_its_line(
    catalog: Catalog, tmp_path: Path, params: dict[str, object], said: str
) -> None:
    """It failed every rollout of the row with INTERNAL ("could not convert string to float") at run time."""
    path = Rows.arithmetic(2).write(tmp_path / "d.jsonl")
    row = {"responses_create_params": {"input": "What is 1 + 2?", **params}, "expected_answer": "3"}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    with pytest.raises(RollmeshError) as info:
        build_plan(catalog, JobSpec(dataset=str(path), environment="arithmetic"))
    assert _err(info) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_DATASET_ROW")
    assert f"{path}:3: {said}" in info.value.message, info.value.message


def test_a_binary_row_is_malformed_not_internal(catalog: Catalog, tmp_path: Path) -> None:
    path = Rows.arithmetic(2).write(tmp_path / "d.jsonl")
    with open(path, "ab") as f:
        f.write(b"\x00\x92\xff binary\n")
    with pytest.raises(RollmeshError) as info:
        build_plan(catalog, JobSpec(dataset=str(path), environment="arithmetic"))
    assert _err(info) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_DATASET_ROW")
    assert f"{path}:3: not UTF-8" in info.value.message


def test_dataset_folder_with_single_jsonl(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "datasets" / "mine").mkdir(parents=True)
    Rows.arithmetic(4).write(root / "datasets/mine/x.jsonl")
    plan = build_plan(Catalog([Root(root, 0, "cwd")]), JobSpec(dataset="mine", environment="arithmetic"))
    assert plan.dataset_path.name == "x.jsonl" and len(plan.rows) == 4


def test_shard_plan_keys(catalog: Catalog, tmp_path: Path) -> None:
    path = Rows.arithmetic(7).write(tmp_path / "d.jsonl")
    plan = build_plan(
        catalog,
        JobSpec(dataset=str(path), environment="arithmetic", num_repeats=2, shard_index=1, shard_count=3),
    )
    assert [(k.task_index, k.rollout_index) for k in plan.keys()] == [(1, 0), (1, 1), (4, 0), (4, 1)]


def test_a_row_over_the_limit_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    """A file with no newline (a model file named by mistake) was read into memory whole before the
    size check: one line of GBs in the scheduler."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(Rows.arithmetic(1).write(tmp_path / "ok.jsonl").read_bytes() + b"\0" * 8_000_000)
    tracemalloc.start()
    try:
        with pytest.raises(RollmeshError) as info:
            load_rows(path, max_row_bytes=1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.reason == "DATASET_ROW_TOO_LARGE" and info.value.metadata["line"] == "2"
    assert int(info.value.metadata["size"]) == 8_000_000 and peak < 4_000_000, peak  # the line is 8 MB


def test_a_generator_spec_is_a_dataset_generated_the_same_each_time(catalog: Catalog, tmp_path: Path) -> None:
    """A job names a reasoning-gym spec (a .json file, or a dataset folder holding reasoning_gym.json)
    instead of a JSONL: its rows are generated at plan time, the same for the same spec, so a
    resumed job finds the same task at each index."""
    bench = build_plan(catalog, JobSpec(benchmark="reasoning_gym_arith", limit=5))
    assert bench.spec.environment == "reasoning_gym" and bench.dataset_path.name == "reasoning_gym.json"
    assert len(bench.rows) == 200 and bench.task_indices == [0, 1, 2, 3, 4] and bench.num_repeats == 8
    assert bench.rows == build_plan(catalog, JobSpec(benchmark="reasoning_gym_arith")).rows
    assert {r["metadata"]["source_dataset"] for r in bench.rows} == {"basic_arithmetic", "chain_sum"}
    spec = tmp_path / "mix.json"
    spec.write_text(
        json.dumps({"reasoning_gym": {"generators": ["leg_counting", "gcd"], "size": 6, "seed": 2}})
    )
    plan = build_plan(catalog, JobSpec(dataset=str(spec), environment="reasoning_gym"))
    assert [r["task_id"].split("/")[1] for r in plan.rows] == [str(i) for i in range(6)]
    for body, reason in [
        ({"reasoning_gym": {"generators": ["leg_counting"], "size": -1}}, "INVALID_GENERATOR_SPEC"),
        ({"reasoning_gym": {"generators": ["leg_countin"], "size": 1}}, "UNKNOWN_GENERATOR"),
        ({"generators": "leg_counting"}, "INVALID_GENERATOR_SPEC"),
    ]:
        spec.write_text(json.dumps(body))
        with pytest.raises(RollmeshError) as info:
            build_plan(catalog, JobSpec(dataset=str(spec), environment="reasoning_gym"))
        assert _err(info) == (grpc.StatusCode.INVALID_ARGUMENT, reason)
    spec.write_text("{not json")
    with pytest.raises(RollmeshError) as info:
        build_plan(catalog, JobSpec(dataset=str(spec), environment="reasoning_gym"))
    assert _err(info) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_DATASET_ROW")
