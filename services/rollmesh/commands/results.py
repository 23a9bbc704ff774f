"""Results commands: `rollmesh aggregate`, `rollmesh profile`, `rollmesh reverify`, `rollmesh validate`.

They read the JSONL sink's files (rollouts.jsonl rows, failures.jsonl rows, or sink folders).
A missing file or a malformed line is one line on stderr (with the line number) and exit code 2;
so is input holding no rollout row. An unfinished last line (a row still being written) is left
out and named on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated
from typing import Any

import typer

from rollmesh.commands._common import ApiKey
from rollmesh.commands._common import JsonOut
from rollmesh.commands._common import VerifierAddr
from rollmesh.commands._common import err
from rollmesh.commands._common import fail
from rollmesh.commands._common import print_json
from rollmesh.commands._common import print_table
from rollmesh.commands._common import run

Paths = Annotated[list[str], typer.Argument(help="Rollout files, globs or sink folders (shards of one job).")]
OneFile = Annotated[str, typer.Argument(help="A rollouts.jsonl file (or a sink folder).")]


def _finite(value: float) -> float:
    if not math.isfinite(value):  # a NaN threshold scored every rollout wrong
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


Threshold = Annotated[
    float, typer.Option("--threshold", help="A rollout is correct when reward >= this.", callback=_finite)
]


def write_out(out: str, text: str) -> None:
    """Write a command's --out file; an unwritable path is one line and exit 2 (via run)."""
    run(asyncio.to_thread(Path(out).write_text, text))


def check_rows(verb: str, paths: Sequence[str], rows: int, skipped: Sequence[str], failures: int = 0) -> None:
    """Name the unfinished last lines left out; refuse input with no rollout row (ValueError: exit 2)."""
    if skipped:
        err.print(
            f"skipped {len(skipped)} unfinished last line(s) (a row still being written, or cut off): "
            + ", ".join(skipped),
            highlight=False,
        )
    if not rows:
        only = f" (only {failures} failure rows)" if failures else ""
        raise ValueError(f"nothing to {verb}: no rollout rows in {' '.join(paths)}{only}")


def rollout_rows(verb: str, path: str) -> list[tuple[Path, int, dict[str, Any]]]:
    """Every rollout row under `path` (failures files left out) as (file, line number, row), checked
    by `check_rows` (blocking file I/O)."""
    from rollmesh.scheduler.store import expand_paths
    from rollmesh.scheduler.store import read_rollout_rows

    files = [f for f in expand_paths([path]) if not f.name.startswith("failures")]
    skipped: list[str] = []
    rows = [(f, *row) for f in files for row in read_rollout_rows(f, skipped)]
    check_rows(verb, [path], len(rows), skipped)
    return rows


def aggregate(
    paths: Paths,
    out: Annotated[str | None, typer.Option("--out", "-o", help="Write metrics.json here.")] = None,
    k: Annotated[
        list[int] | None, typer.Option("--k", min=1, help="A k for pass@k / maj@k (repeatable).")
    ] = None,
    num_repeats: Annotated[
        int | None,
        typer.Option("--num-repeats", min=1, help="n for the default k values (default: the most seen)."),
    ] = None,
    threshold: Threshold = 1.0,
    as_json: JsonOut = False,
) -> None:
    """Recompute metrics over many shard files as if they were one run (keys deduplicated).

    Exit 3 (metrics still printed) when a job folder holds fewer rows than its job.json planned (a
    shard that failed, was cancelled or still runs): the metrics are not that job's."""
    from rollmesh.commands._exit import EXIT_COMPLETED_WITH_FAILURES
    from rollmesh.commands._jobs import metrics_rows
    from rollmesh.scheduler.convert import metrics_to_pb
    from rollmesh.scheduler.metrics import compute
    from rollmesh.scheduler.store import Incomplete
    from rollmesh.scheduler.store import expand_paths
    from rollmesh.scheduler.store import incomplete_jobs
    from rollmesh.scheduler.store import load_files

    async def go() -> tuple[dict[str, Any], list[Incomplete]]:
        files = expand_paths(paths)
        loaded = await asyncio.to_thread(load_files, files)
        check_rows("aggregate", paths, len(loaded.rollouts), loaded.skipped, len(loaded.failures))
        m = compute(
            loaded.rollouts, loaded.failures, k_values=k, num_repeats=num_repeats, threshold=threshold
        )
        m.num_duplicates += loaded.duplicates
        data = m.to_json()
        if out:
            await asyncio.to_thread(Path(out).write_text, json.dumps(data, indent=2) + "\n")
        return data, await asyncio.to_thread(incomplete_jobs, loaded)

    data, short = run(go())
    for missing in [x for x in k or [] if str(x) not in data["pass_at_k"]]:
        err.print(f"no task has {missing} rollouts: pass@{missing} and maj@{missing} are left out")
    if as_json or not out:
        print_json(data)
    else:
        rows = metrics_rows(metrics_to_pb(data), duplicates=int(data["num_duplicates"]))
        print_table("metrics", ["metric", "value"], rows)
        err.print(f"wrote {out}")
    for job in short:
        err.print(f"[bold yellow]incomplete:[/] {job.describe()}", highlight=False)
    if short:
        raise typer.Exit(EXIT_COMPLETED_WITH_FAILURES)


def profile(
    path: OneFile,
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="Write the JSONL profile here (default stdout).")
    ] = None,
    threshold: Threshold = 1.0,
    groups: Annotated[
        bool,
        typer.Option(
            "--groups",
            help="One line per group of tasks (task_id up to its last '/': a reasoning-gym generator) "
            "with its pass@k, instead of one per task.",
        ),
    ] = False,
) -> None:
    """Per-task reward profile (mean, std, min, max, correct count per task) as JSONL."""
    from rollmesh.scheduler.metrics import group_profile
    from rollmesh.scheduler.metrics import task_profile
    from rollmesh.scheduler.store import expand_paths
    from rollmesh.scheduler.store import load_files

    async def go() -> list[dict[str, Any]]:
        files = [f for f in expand_paths([path]) if not f.name.startswith("failures")]
        loaded = await asyncio.to_thread(load_files, files)
        check_rows("profile", [path], len(loaded.rollouts), loaded.skipped)
        if groups:
            return [g.to_json() for g in group_profile(loaded.rollouts, threshold)]
        return [t.to_json() for t in task_profile(loaded.rollouts, threshold)]

    rows = run(go())
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if out:
        write_out(out, text)
        err.print(f"wrote {len(rows)} {'groups' if groups else 'tasks'} to {out}")
    else:
        typer.echo(text, nl=False)


def reverify(
    path: OneFile,
    environment: Annotated[
        str, typer.Option("--environment", "-e", help="The environment that scores the rows.")
    ],
    verifier: VerifierAddr = "",
    api_key: ApiKey = "",
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="Write re-scored rows here (default stdout).")
    ] = None,
    window: Annotated[int, typer.Option("--window", help="Rows in flight to the verifier at once.")] = 32,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds without an answer before giving up.")
    ] = 300.0,
    tasks: Annotated[
        str | None,
        typer.Option(
            "--tasks",
            help="Score each rollout as the row of this JSONL with the same input messages (NeMo Gym's "
            "example_rollouts.jsonl lack the row fields verify needs: join them to data/example.jsonl).",
        ),
    ] = None,
) -> None:
    """Re-run verification on stored rollouts through the verifier's VerifyBatch stream (no model calls).

    Without --verifier (or ROLLMESH_VERIFIER_ADDR) a verifier starts in this process, serving the
    environments of the artifact roots as `rollmesh run` does.

    Exit 0 when every row was re-scored, 1 when one was not (its `reverify_error`), fell to 0
    without --tasks though recorded elsewhere with a reward, or was an episode whose replay ended
    elsewhere than recorded (its `reverify_warning`), 2 on unreadable input. Every row is written
    either way; the means are over the re-scored rows."""
    from rich.progress import BarColumn
    from rich.progress import MofNCompleteColumn
    from rich.progress import Progress
    from rich.progress import TextColumn
    from rich.progress import TimeElapsedColumn

    from rollmesh.commands import _reverify as rv

    async def go() -> rv.ReverifyReport:
        rows = [row for _, _, row in await asyncio.to_thread(rollout_rows, "reverify", path)]
        if tasks:
            from rollmesh.mesh.errors import RollmeshError
            from rollmesh.scheduler.plan import load_rows

            try:
                loaded = await asyncio.to_thread(functools.partial(load_rows, Path(tasks), text_only=False))
                rows, unmatched = rv.join_tasks(rows, loaded)
            except (OSError, ValueError, RollmeshError) as exc:
                fail(f"reverify: --tasks {tasks}: {exc}", code=2)
            if unmatched:
                err.print(
                    f"reverify: {unmatched} of {len(rows)} rollouts match no row of {tasks}; scored as stored"
                )
        async with contextlib.AsyncExitStack() as stack:
            address = verifier
            if not address:  # as `run` does: the environments of this folder's roots, in this process
                from rollmesh.launch.embedded import embedded_verifier

                err.print("starting a verifier in this process (--verifier HOST:PORT uses a running one)")
                address = await stack.enter_async_context(embedded_verifier(api_key=api_key))
            return await _reverify_at(address, rows)

    async def _reverify_at(address: str, rows: list[dict[str, Any]]) -> rv.ReverifyReport:
        with Progress(
            TextColumn("reverify"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err
        ) as bar:
            task = bar.add_task("reverify", total=len(rows))
            return await rv.reverify(
                rows,
                environment=environment,
                verifier=address,
                api_key=api_key or None,
                window=window,
                idle_timeout_s=timeout,
                on_progress=lambda n: bar.advance(task, n),
                joined=bool(tasks),
            )

    report = run(go())
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in report.rows)
    if out:
        write_out(out, text)
    else:
        typer.echo(text, nl=False)
    if report.old_mean is None or report.new_mean is None:
        means = "no mean reward (nothing was re-scored)"
    else:
        means = f"mean reward over them {report.old_mean:.4f} -> {report.new_mean:.4f}"
    drops = f", {report.unjoined_drops} fell to 0 without --tasks" if report.unjoined_drops else ""
    drops += f", {report.diverged} replays ended elsewhere than recorded" if report.diverged else ""
    err.print(
        f"reverified {report.scored} rows ({report.errors} errors, {report.changed} rewards changed{drops}); "
        + means
        + (f"; wrote {out}" if out else "")
    )
    for sample in report.error_samples:
        err.print(f"  error {sample}")
    if report.failed:  # every row was written, with its reverify_error / reverify_warning
        raise typer.Exit(1)


def validate(
    path: OneFile,
    tokenizer: Annotated[
        str | None,
        typer.Option("--tokenizer", help="A model folder with a tokenizer: also check decoded text."),
    ] = None,
    as_json: JsonOut = False,
) -> None:
    """Check every rollout's token record (lengths, spans, loss mask, and with a tokenizer the text).

    Exit 0 when every record is valid, 1 when one is not, 2 on unreadable input."""
    from rollmesh.scheduler.records import Rollout
    from rollmesh.scheduler.tokens import Decoder
    from rollmesh.scheduler.tokens import validate_rollout

    def load_tokenizer() -> Decoder | None:
        if not tokenizer:
            return None
        if not Path(tokenizer).exists():
            raise FileNotFoundError(f"{tokenizer}: no such tokenizer folder")
        from transformers import AutoTokenizer

        try:
            tok: Any = AutoTokenizer.from_pretrained(tokenizer)
        except (OSError, ValueError) as exc:  # transformers' own message runs to several lines
            raise ValueError(
                f"--tokenizer {tokenizer}: no tokenizer there ({str(exc).splitlines()[0].rstrip(': ')})"
            ) from None
        return tok  # type: ignore[no-any-return]

    async def go() -> list[dict[str, Any]]:
        rows = await asyncio.to_thread(rollout_rows, "validate", path)
        tok = await asyncio.to_thread(load_tokenizer)
        results: list[dict[str, Any]] = []
        for f, lineno, row in rows:
            r = Rollout.from_row(row)
            reasons = validate_rollout(r, tokenizer=tok)
            results.append({"file": str(f), "line": lineno, "key": r.key.as_str(), "reasons": reasons})
        return results

    results = run(go())
    bad = [r for r in results if r["reasons"]]
    if as_json:
        print_json({"checked": len(results), "invalid": len(bad), "records": bad})
    else:
        for r in bad:
            for reason in r["reasons"]:
                typer.echo(f"{r['file']}:{r['line']} rollout {r['key']}: {reason}")
        err.print(
            f"checked {len(results)} token records: {len(results) - len(bad)} valid, {len(bad)} invalid"
        )
    if bad:
        if as_json:
            raise typer.Exit(1)
        fail(f"{len(bad)} of {len(results)} token records are invalid", code=1)


def register(app: typer.Typer) -> None:
    app.command("aggregate")(aggregate)
    app.command("profile")(profile)
    app.command("reverify")(reverify)
    app.command("validate")(validate)
