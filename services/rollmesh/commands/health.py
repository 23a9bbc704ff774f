"""`rollmesh health PATH`: rollout health findings over any rollouts file or job folder
(scheduler/health.py): how many rollouts have each finding, their share, and each rollout's findings
by key. Exit 0 whatever is found: the findings are a report, not a failure."""

from __future__ import annotations

import asyncio
from typing import Annotated
from typing import Any

import typer

from rollmesh.commands._common import JsonOut
from rollmesh.commands._common import err
from rollmesh.commands._common import print_json
from rollmesh.commands._common import print_table
from rollmesh.commands._common import run
from rollmesh.commands.results import OneFile
from rollmesh.commands.results import rollout_rows


def health(
    path: OneFile,
    context_length: Annotated[
        int | None,
        typer.Option(
            "--context-length",
            min=1,
            help="The model's context length in tokens: turns reaching 90% of it are near_context_limit"
            " (unknown, that check is listed as not checked).",
        ),
    ] = None,
    as_json: JsonOut = False,
) -> None:
    """Rollout health: empty turns, turns cut at max tokens, unanswered tool calls, repeated output,
    unparsed tool-call text, prompts near the context limit; counted, and listed per rollout key."""
    from rollmesh.scheduler import health as checks

    def report_of() -> dict[str, Any]:  # blocking file I/O: run in a thread
        from rollmesh.scheduler.records import Rollout

        rows = rollout_rows("check", path)
        found = [
            (Rollout.from_row(row).key.as_str(), checks.of_row(row, context_length=context_length))
            for _, _, row in rows
        ]
        summary = checks.report(found, context_length=context_length).to_json()
        del summary["keys"]
        summary["rollouts"] = [{"key": key, "findings": f} for key, f in found if f]
        return summary

    data = run(asyncio.to_thread(report_of))
    if as_json:
        print_json(data)
        return
    counts = [(name, n, f"{data['share'][name]:.1%}") for name, n in data["findings"].items()]
    print_table(f"health of {data['checked']} rollouts in {path}", ["finding", "rollouts", "share"], counts)
    for name, why in data["not_checked"].items():
        err.print(f"not checked: {name}: {why}")
    if data["rollouts"]:
        rows = [
            (r["key"], ", ".join(f"{name} (turn {turn})" for name, turn in r["findings"].items()))
            for r in data["rollouts"]
        ]
        print_table("rollouts with findings", ["key", "findings"], rows)


def stored_health(metrics_path: str) -> dict[str, Any] | None:
    """metrics.json's `health` (None when the file cannot be read here: a remote scheduler's)."""
    import json
    from pathlib import Path

    try:
        health = json.loads(Path(metrics_path).read_text()).get("health")
    except (OSError, ValueError):
        return None
    return health if isinstance(health, dict) else None


def health_line(health: dict[str, Any], folder: str) -> str:
    """One line naming each finding's share ("health: 25.0% empty_turn (4 of 16), ...")."""
    checked = int(health.get("checked", 0))
    found = [
        f"{health['share'][k]:.1%} {k} ({n} of {checked})" for k, n in health.get("findings", {}).items() if n
    ]
    if not found:
        return f"health: no finding in {checked} rollouts"
    return f"health: {', '.join(found)}; `rollmesh health {folder}` lists them"


def register(app: typer.Typer) -> None:
    app.command("health")(health)
