"""`rollmesh models`."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Annotated
from typing import Any

import typer

from rollmesh.commands._common import ApiKey
from rollmesh.commands._common import GatewayAddr
from rollmesh.commands._common import JsonOut
from rollmesh.commands._common import as_dict
from rollmesh.commands._common import connect
from rollmesh.commands._common import print_json
from rollmesh.commands._common import print_table
from rollmesh.commands._common import run

if TYPE_CHECKING:
    from rollmesh_client.v1 import gateway_pb2

models_app = typer.Typer(help="The models the gateway serves.", no_args_is_help=True)


@models_app.command("list")
def list_models(
    gateway: GatewayAddr = "",
    api_key: ApiKey = "",
    as_json: JsonOut = False,
) -> None:
    """List the gateway's models and routes with their replicas."""
    from rollmesh_client.v1 import gateway_pb2 as pb

    async def go() -> list[pb.ModelInfo]:
        async with await connect(gateway=gateway, api_key=api_key) as c:
            return [m async for m in c.gateway.models()]

    items = run(go())
    if as_json:
        print_json([as_dict(m, unset_too=True) for m in items])
        return
    rows = [
        (
            m.name + (" (default)" if m.is_default else ""),
            m.backend,
            m.max_model_len or "?",
            m.policy_version or "-",
            "paused" if m.paused else "running",
            ", ".join(_replica_cell(r) for r in m.replicas),
        )
        for m in items
    ]
    print_table("models", ["model", "backend", "context", "policy", "state", "replicas"], rows)


def _replica_cell(r: gateway_pb2.ReplicaInfo) -> str:
    """One replica in the table: health, load, and the weights it reports serving (when it does),
    so a replica left on other weights than its model's policy version shows."""
    cell = f"{r.replica_id}{'' if r.healthy else ' (down)'}: {r.in_flight} running, {r.sessions} sess."
    if r.weights_id or r.policy_version:
        cell += f", weights {r.weights_id or '?'} (policy {r.policy_version or '-'})"
    return cell


@models_app.command("update-weights")
def update_weights(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="A safetensors checkpoint folder (readable by the replicas) or a registry model."
        ),
    ],
    model: Annotated[
        str, typer.Option("--model", help="The served model (default: the default model).")
    ] = "",
    version: Annotated[
        str,
        typer.Option("--version", help="Policy version to label later generations (default: previous + 1)."),
    ] = "",
    abort_in_flight: Annotated[
        bool,
        typer.Option(
            "--abort-in-flight", help="Abort running generations and run them again on the new weights."
        ),
    ] = False,
    continue_in_flight: Annotated[
        bool,
        typer.Option(
            "--continue-in-flight",
            help="Stop running generations and continue them on the new weights from their tokens so far.",
        ),
    ] = False,
    drain_timeout: Annotated[
        float, typer.Option("--drain-timeout", min=0, help="Seconds running generations may take (0: 300).")
    ] = 0.0,
    upload: Annotated[
        bool,
        typer.Option(
            "--upload",
            help="Stream the folder's files to the gateway (no shared filesystem), not its path.",
        ),
    ] = False,
    gateway: GatewayAddr = "",
    api_key: ApiKey = "",
    as_json: JsonOut = False,
) -> None:
    """Load new weights into every replica of a model and bump its policy version (all or none)."""
    from pathlib import Path

    from rollmesh_client.v1 import gateway_pb2 as pb

    path = Path(checkpoint).expanduser()
    target = str(path.resolve()) if path.is_dir() else checkpoint  # the gateway resolves it, not our cwd

    if upload and not path.is_dir():
        raise typer.BadParameter(f"{checkpoint} is not a folder to upload", param_hint="CHECKPOINT")
    if abort_in_flight and continue_in_flight:
        raise typer.BadParameter("give --abort-in-flight or --continue-in-flight, not both")
    options: dict[str, Any] = {
        "model": model,
        "policy_version": version,
        "in_flight": "abort_and_retry" if abort_in_flight else "continue" if continue_in_flight else "finish",
        "drain_timeout_s": drain_timeout,
    }

    async def go() -> pb.UpdateWeightsResponse:
        async with await connect(gateway=gateway, api_key=api_key) as c:
            if upload:
                return await c.gateway.update_weights_from_folder(path, **options)
            return await c.gateway.update_weights(target, **options)

    resp = run(go())
    if as_json:
        print_json(as_dict(resp, unset_too=True))
        return
    typer.echo(
        f"policy version {resp.previous_version or '-'} -> {resp.policy_version}: "
        f"{resp.tensors} tensors from {resp.checkpoint_path} into {len(resp.replica_ids)} replicas; "
        f"generation held {resp.paused_s:.2f} s"
        + (f", {resp.retried_requests} generations retried" if resp.retried_requests else "")
    )


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
