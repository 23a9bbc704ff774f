"""The CLI's shared job options and `rollmesh config`'s per-job defaults (issues 15.5, 12.8)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rollmesh.cli import build_app
from rollmesh.commands._jobs import SpecOptions
from rollmesh.commands._jobs import build_spec
from rollmesh.commands._jobs import resume_command
from rollmesh.scheduler.sinks.grpc import ACK_TIMEOUT_S
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh_client.v1 import scheduler_pb2 as pb

runner = CliRunner()


def test_retry_flags_and_resume_choices_go_into_the_spec() -> None:
    spec = build_spec(
        SpecOptions(
            benchmark="arithmetic",
            starting_seed=7,
            max_attempts=5,
            rollout_timeout_s=30.0,
            unavailable_budget_s=120.0,
            resume_latest=True,
        )
    )
    assert spec.starting_seed == 7 and spec.resume_latest and not spec.resume_job_id
    assert (spec.retry.max_attempts, spec.retry.rollout_timeout_s, spec.retry.unavailable_budget_s) == (
        5,
        30.0,
        120.0,
    )
    assert build_spec(SpecOptions(job_id="job-1")).resume_job_id == "job-1"
    with pytest.raises(typer.BadParameter, match="give one"):
        build_spec(SpecOptions(job_id="job-1", resume_latest=True))
    with pytest.raises(typer.BadParameter, match="--rollout-timeout must be >= 0"):
        build_spec(SpecOptions(rollout_timeout_s=-1.0))
    with pytest.raises(typer.BadParameter, match="--unavailable-budget must be >= 0, got nan"):
        build_spec(SpecOptions(unavailable_budget_s=float("nan")))
    assert build_spec(SpecOptions(shard="1/4")).shard == pb.Shard(index=1, count=4)
    for shard in ("0/0", "1", "a/b"):
        with pytest.raises(typer.BadParameter, match="is not i/n with n >= 1"):
            build_spec(SpecOptions(shard=shard))


def test_sink_flags_go_into_the_spec() -> None:
    spec = build_spec(
        SpecOptions(benchmark="b", sink_grpc="10.0.0.5:7000", sink_ack_timeout_s=900.0, sink_window=256)
    )
    grpc_sink = spec.sink.grpc
    assert (grpc_sink.address, grpc_sink.ack_timeout_s, grpc_sink.window) == ("10.0.0.5:7000", 900.0, 256)
    assert not build_spec(SpecOptions(benchmark="b")).HasField("sink")
    with pytest.raises(typer.BadParameter, match="give --sink-grpc too"):
        build_spec(SpecOptions(benchmark="b", sink_ack_timeout_s=900.0))
    with pytest.raises(typer.BadParameter, match="--sink-window is the --sink-grpc trainer's"):
        build_spec(SpecOptions(benchmark="b", sink_window=8))
    with pytest.raises(typer.BadParameter, match="--sink-window must be >= 0, got -1"):
        build_spec(SpecOptions(sink_grpc="h:1", sink_window=-1))
    with pytest.raises(typer.BadParameter, match="--sink-ack-timeout must be >= 0, got inf"):
        build_spec(SpecOptions(sink_grpc="h:1", sink_ack_timeout_s=float("inf")))


def test_resume_command_names_the_cli_flags() -> None:
    job = pb.Job(job_id="job-abc", output_path="/data/my runs/job-abc")
    assert resume_command(job) == "rollmesh run --job-id job-abc --output-dir '/data/my runs'"
    assert resume_command(job, "10.0.0.5:50054").endswith("--scheduler 10.0.0.5:50054")


def test_config_shows_every_retry_default_with_its_flag() -> None:
    result = runner.invoke(build_app(), ["config", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    defaults = {row["field"]: row for row in data["job_defaults"]}
    listed = {f"retry.{f.name}" for f in dataclasses.fields(RetryPolicy)}
    assert set(defaults) == listed | {"sink.grpc.ack_timeout_s"}  # every live retry setting is shown
    assert defaults["retry.max_attempts"]["default"] == RetryPolicy().max_attempts
    assert defaults["retry.max_attempts"]["flag"] == "--max-attempts"
    assert defaults["retry.unavailable_budget_s"]["flag"] == "--unavailable-budget"
    assert defaults["sink.grpc.ack_timeout_s"] | {"doc": ""} == {
        "field": "sink.grpc.ack_timeout_s",
        "default": ACK_TIMEOUT_S,
        "flag": "--sink-ack-timeout",
        "doc": "",
    }
    assert any(v["name"] == "ROLLMESH_SCHEDULER_ADDR" for v in data["variables"])
    table = runner.invoke(build_app(), ["config"])
    assert table.exit_code == 0 and "--rollout-timeout" in table.stdout


def test_config_never_prints_the_api_key() -> None:
    env = {
        "ROLLMESH_API_KEY": "s3cret-token-value",
        "ROLLMESH_SCHEDULER_ADDR": "127.0.0.1:1",
        "COLUMNS": "300",
    }
    data = json.loads(runner.invoke(build_app(), ["config", "--json"], env=env).stdout)
    shown = {v["name"]: v["set"] for v in data["variables"]}
    assert shown["ROLLMESH_API_KEY"] == "(set, hidden)"
    assert shown["ROLLMESH_SCHEDULER_ADDR"] == "127.0.0.1:1"  # other values are shown as set
    table = runner.invoke(build_app(), ["config"], env=env)
    assert table.exit_code == 0 and "(set, hidden)" in table.stdout
    assert "s3cret-token-value" not in table.stdout + json.dumps(data)


def test_run_and_submit_take_the_same_job_options() -> None:
    app = build_app()
    shared = ["--seed", "--starting-seed", "--resume", "--job-id", "--max-attempts", "--rollout-timeout"]
    shared += ["--sink-grpc", "--sink-ack-timeout", "--sink-window"]
    for command in (["run", "--help"], ["jobs", "submit", "--help"]):
        text = runner.invoke(app, command, env={"COLUMNS": "200"}).stdout
        assert all(flag in text for flag in shared), (command, text)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--scheduler", "127.0.0.1:1", "--base-url", "http://h/v1"],
            "--base-url: these configure the embedded",
        ),
        (
            ["--scheduler", "127.0.0.1:1", "--backend", "fake", "--replicas", "2"],
            "--backend, --replicas: these",
        ),
        (["--scheduler", "127.0.0.1:1", "--api-key-env", "MY_KEY"], "--api-key-env: these configure"),
        (["--backend", "fake", "--base-url", "http://h/v1"], "--backend fake does not use it"),
        (["--base-url", "http://h/v1", "--replicas", "4"], "--replicas counts the embedded vLLM replicas"),
    ],
)
def test_run_refuses_flags_it_would_ignore(args: list[str], expected: str) -> None:
    """Before any connection: a flag that would change nothing is one line and exit 2, not a job
    that silently ran on the running mesh's (or the fake's) model."""
    result = runner.invoke(build_app(), ["run", "--benchmark", "arithmetic", *args], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.split())


def test_a_dataset_path_is_made_absolute_and_needs_an_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--dataset takes an artifact name or a path; a path that exists here goes to the scheduler
    absolute (its working folder is not this one); without --benchmark it needs --environment,
    refused before anything starts."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.jsonl").write_text("{}\n")
    spec = build_spec(SpecOptions(dataset="rows.jsonl", environment="arithmetic"))
    assert spec.dataset == str(tmp_path / "rows.jsonl")
    assert build_spec(SpecOptions(dataset="arithmetic", environment="arithmetic")).dataset == "arithmetic"
    assert build_spec(SpecOptions(benchmark="arithmetic", dataset="arithmetic")).dataset == "arithmetic"
    with pytest.raises(typer.BadParameter, match=r"--dataset 'rows.jsonl' needs --environment"):
        build_spec(SpecOptions(dataset="rows.jsonl"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--input", "a.jsonl", "--dataset", "b.jsonl", "-e", "arithmetic"],
            "--input is --dataset's older name",
        ),
        (["-i", "a.jsonl"], "--dataset 'a.jsonl' needs --environment"),
    ],
)
def test_input_is_an_older_name_of_dataset(
    args: list[str], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --input` is `--dataset` under its older name: both at once is one line (exit 2), and it
    is checked as --dataset is, before anything starts."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.jsonl").write_text("{}\n")
    result = runner.invoke(build_app(), ["run", *args], env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.split())


def test_serve_openenvs_flags_default_to_what_the_server_api_defaults_to() -> None:
    """`rollmesh serve openenv` and `openenv_server(...)` serve the same way unless told otherwise."""
    import inspect

    from rollmesh.openenv_server.server import openenv_server

    command = typer.main.get_command(build_app())
    serve = command.commands["serve"].commands["openenv"]  # type: ignore[attr-defined]
    flags = {p.name: p.default for p in serve.params}
    api = inspect.signature(openenv_server).parameters
    shared = [name for name in flags if name in api and api[name].default is not inspect.Parameter.empty]
    assert {"host", "port", "max_steps", "max_sessions", "dataset"} <= set(shared)
    assert {name: flags[name] for name in shared} == {name: api[name].default for name in shared}


def test_the_schedulers_results_root_defaults_to_runs_everywhere_it_is_chosen() -> None:
    """`serve scheduler --output-dir`, `up --output-dir` (passed on to it), the scheduler's config,
    the job manager, the embedded mesh and a job without its own output_dir all default to the one
    DEFAULT_OUTPUT_DIR, which is still runs/; the two commands describe the flag alike."""
    import inspect

    from rollmesh.launch.embedded import embedded_mesh
    from rollmesh.scheduler import DEFAULT_OUTPUT_DIR
    from rollmesh.scheduler.config import SchedulerConfig
    from rollmesh.scheduler.manager import JobManager
    from rollmesh.scheduler.spec import JobSpec

    command = typer.main.get_command(build_app())
    flags = [
        next(p for p in cmd.params if p.name == "output_dir")
        for cmd in (command.commands["serve"].commands["scheduler"], command.commands["up"])  # type: ignore[attr-defined]
    ]
    assert DEFAULT_OUTPUT_DIR == "runs"
    assert [f.default for f in flags] == [DEFAULT_OUTPUT_DIR] * 2
    assert flags[0].help == flags[1].help  # type: ignore[attr-defined]
    assert SchedulerConfig.from_env().output_dir == DEFAULT_OUTPUT_DIR
    for fn in (JobManager, embedded_mesh):
        assert inspect.signature(fn).parameters["output_dir"].default == DEFAULT_OUTPUT_DIR
    assert JobSpec(environment="e").effective_output_dir == DEFAULT_OUTPUT_DIR
