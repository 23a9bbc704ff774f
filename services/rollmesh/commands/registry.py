"""`rollmesh artifacts list|resolve`."""

from __future__ import annotations

from typing import Annotated

import typer

from rollmesh.commands._common import ApiKey
from rollmesh.commands._common import JsonOut
from rollmesh.commands._common import RegistryAddr
from rollmesh.commands._common import as_dict
from rollmesh.commands._common import connect
from rollmesh.commands._common import print_json
from rollmesh.commands._common import print_table
from rollmesh.commands._common import run

artifacts_app = typer.Typer(
    help="List and resolve artifacts (datasets, environments, benchmarks, models ...).", no_args_is_help=True
)


@artifacts_app.command("list")
def list_artifacts(
    kind: Annotated[
        str | None,
        typer.Option("--kind", "-k", help="environment, benchmark, dataset, config, prompt or model."),
    ] = None,
    registry: RegistryAddr = "",
    api_key: ApiKey = "",
    as_json: JsonOut = False,
) -> None:
    """List artifacts across the roots, in search order."""
    from rollmesh_client._registry import kind_value
    from rollmesh_client.v1 import registry_pb2 as pb

    async def go() -> list[pb.ListedArtifact]:
        if kind is not None:
            kind_value(kind)
        async with await connect(registry=registry, api_key=api_key) as c:
            return [a async for a in c.registry.artifacts(kind)]

    items = run(go())
    rows = [
        (
            pb.ArtifactKind.Name(a.kind).removeprefix("ARTIFACT_KIND_").lower(),
            a.name,
            a.path,
            ", ".join(a.collides_with),
        )
        for a in items
    ]
    if as_json:
        print_json([dict(zip(("kind", "name", "path", "collides_with"), r, strict=True)) for r in rows])
    else:
        print_table("artifacts", ["kind", "name", "path", "collides with"], rows)


@artifacts_app.command("resolve")
def resolve(
    kind: Annotated[str, typer.Argument(help="environment, benchmark, dataset, config, prompt or model.")],
    name: Annotated[str, typer.Argument(help="The artifact's name.")],
    registry: RegistryAddr = "",
    api_key: ApiKey = "",
    as_json: JsonOut = False,
) -> None:
    """Resolve one artifact to its path, root and sha256."""

    async def go() -> dict[str, object]:
        async with await connect(registry=registry, api_key=api_key) as c:
            return as_dict(await c.registry.resolve(kind, name))

    data = run(go())
    if as_json:
        print_json(data)
    else:
        print_table(f"{kind} {name}", ["field", "value"], [(k, v) for k, v in data.items() if k != "files"])


def register(app: typer.Typer) -> None:
    app.add_typer(artifacts_app, name="artifacts")
