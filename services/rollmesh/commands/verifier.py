"""`rollmesh envs list|show`."""

from __future__ import annotations

import json
from typing import Annotated
from typing import Any

import typer

from rollmesh.commands._common import ApiKey
from rollmesh.commands._common import JsonOut
from rollmesh.commands._common import VerifierAddr
from rollmesh.commands._common import as_dict
from rollmesh.commands._common import connect
from rollmesh.commands._common import print_json
from rollmesh.commands._common import print_table
from rollmesh.commands._common import run

envs_app = typer.Typer(help="List and inspect the verifier's environments.", no_args_is_help=True)


@envs_app.command("list")
def list_envs(verifier: VerifierAddr = "", api_key: ApiKey = "", as_json: JsonOut = False) -> None:
    """Every environment the verifier serves, and every plugin that failed to load."""
    from rollmesh_client.v1 import verifier_pb2 as pb

    async def go() -> tuple[list[pb.Environment], list[pb.BrokenEnvironment]]:
        async with await connect(verifier=verifier, api_key=api_key) as c:
            first = await c.verifier.list()
            envs = [e async for e in c.verifier.environments()]
            return envs, list(first.broken)

    envs, broken = run(go())
    if as_json:
        print_json(
            {
                "environments": [
                    {
                        "name": e.name,
                        "description": e.description,
                        "tools": [t.name for t in e.tools],
                        "source": e.source,
                        "example_dataset": e.example_dataset,
                        "takes_turns": e.takes_turns,
                        "tool_calls_are_answer": e.tool_calls_are_answer,
                        "scores_groups": e.scores_groups,
                        "sandbox": e.sandbox,
                    }
                    for e in envs
                ],
                "broken": [as_dict(b) for b in broken],
            }
        )
        return
    # Whole cells (the table wraps them): the first sentence of a description names a bridged
    # environment's server and interpreter, and a broken one's error is its one line.
    rows: list[tuple[Any, ...]] = [
        (
            e.name,
            "ok",
            e.sandbox or "-",
            ", ".join(t.name for t in e.tools) or "-",
            _first_sentence(e.description),
        )
        for e in envs
    ]
    rows += [(b.name, "BROKEN", "-", "-", b.error) for b in broken]
    print_table("environments", ["name", "status", "sandbox", "tools", "description / error"], rows)


def _first_sentence(text: str) -> str:
    """Up to the first ". " (a path or version's dots stay), whole."""
    head, dot, _ = text.partition(". ")
    return head + ("." if dot else "")


@envs_app.command("show")
def show_env(
    name: Annotated[str, typer.Argument(help="The environment's name.")],
    verifier: VerifierAddr = "",
    api_key: ApiKey = "",
    as_json: JsonOut = False,
) -> None:
    """One environment: description, source, example dataset and tools with their JSON schemas."""
    from rollmesh_client.v1 import verifier_pb2 as pb

    async def go() -> pb.Environment:
        async with await connect(verifier=verifier, api_key=api_key) as c:
            return await c.verifier.get(name)

    env = run(go())
    tools = [
        {"name": t.name, "description": t.description, "parameters": json.loads(t.parameters_json or "{}")}
        for t in env.tools
    ]
    if as_json:
        print_json(
            {
                "name": env.name,
                "description": env.description,
                "source": env.source,
                "example_dataset": env.example_dataset,
                "takes_turns": env.takes_turns,
                "tool_calls_are_answer": env.tool_calls_are_answer,
                "scores_groups": env.scores_groups,
                "public_fields": list(env.public_fields),
                "tools": tools,
            }
        )
        return
    print_table(
        f"environment {env.name}",
        ["field", "value"],
        [
            ("description", env.description),
            ("source", env.source),
            ("example_dataset", env.example_dataset or "-"),
            ("takes_turns", "yes (answers each assistant turn)" if env.takes_turns else "no"),
            ("tool_calls_are_answer", "yes (no call is run)" if env.tool_calls_are_answer else "no"),
            ("scores_groups", "yes (a task's rollouts verified together)" if env.scores_groups else "no"),
            ("public_fields", ", ".join(env.public_fields) or "- (an agent program sees only the prompt)"),
        ],
    )
    if tools:
        print_table(
            "tools",
            ["name", "description", "parameters"],
            [(t["name"], t["description"], json.dumps(t["parameters"])) for t in tools],
        )


def register(app: typer.Typer) -> None:
    app.add_typer(envs_app, name="envs")
