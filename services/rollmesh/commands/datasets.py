"""`rollmesh datasets generate|generators`: reasoning-gym's procedural tasks as NeMo Gym-format rows."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Annotated

import typer

from rollmesh.commands._common import JsonOut
from rollmesh.commands._common import err
from rollmesh.commands._common import print_json
from rollmesh.commands._common import run

if TYPE_CHECKING:
    from rollmesh.procedural import ProceduralSpec

datasets_app = typer.Typer(
    help="Procedural datasets: reasoning-gym generators as rows.", no_args_is_help=True
)


def build_spec(
    generators: list[str],
    configs: list[str],
    spec_file: str | None,
    size: int | None,
    seed: int | None,
    system_prompt: str | None = None,
    level: int | None = None,
) -> ProceduralSpec:
    """The spec the flags name, every generator at curriculum `level` when given."""
    spec = _spec_of(generators, configs, spec_file, size, seed, system_prompt)
    return spec if level is None else spec.at_level(level)


def _spec_of(
    generators: list[str],
    configs: list[str],
    spec_file: str | None,
    size: int | None,
    seed: int | None,
    system_prompt: str | None,
) -> ProceduralSpec:
    """The spec from --spec (a file) or from --generator/--config/--size/--seed/--system-prompt
    (which override a file's size, seed and system prompt)."""
    from dataclasses import replace

    from rollmesh.mesh import untrusted_json
    from rollmesh.procedural import GeneratorSpec
    from rollmesh.procedural import InvalidGeneratorSpec
    from rollmesh.procedural import ProceduralSpec
    from rollmesh.procedural.spec import parse_generator_arg

    if spec_file and generators:
        raise InvalidGeneratorSpec("give --spec or --generator, not both")
    if spec_file:
        spec = ProceduralSpec.from_json(untrusted_json.loads(Path(spec_file).read_text()), where=spec_file)
        if configs:
            raise InvalidGeneratorSpec("--config goes with --generator; a --spec file holds its configs")
        return replace(
            spec, size=spec.size if size is None else size, seed=spec.seed if seed is None else seed
        )
    if not generators:
        raise InvalidGeneratorSpec("name at least one --generator (or a --spec file)")
    gens = [parse_generator_arg(g) for g in generators]
    by_name: dict[str, dict[str, object]] = {}
    for c in configs:
        name, sep, text = c.partition("=")
        if not sep and len(gens) == 1:
            name, text = gens[0].name, c
        elif not sep:
            raise InvalidGeneratorSpec(f"--config {c!r}: write NAME=JSON when there are several generators")
        value = untrusted_json.loads(text)
        if not isinstance(value, dict):
            raise InvalidGeneratorSpec(f"--config {c!r}: the config must be a JSON object")
        by_name[name.strip()] = value
    unknown = sorted(set(by_name) - {g.name for g in gens})
    if unknown:
        raise InvalidGeneratorSpec(f"--config names {unknown[0]!r}, which no --generator names")
    gens = [GeneratorSpec(g.name, g.weight, by_name.get(g.name, {})) for g in gens]
    return ProceduralSpec(
        tuple(gens), 100 if size is None else size, 0 if seed is None else seed, system_prompt or ""
    )


def _write(spec: ProceduralSpec, out: str | None, spec_only: bool) -> int:
    from rollmesh.procedural.rows import generate_rows

    if spec_only:
        lines: list[dict[str, object]] = [spec.to_json()]
    else:
        lines = list(generate_rows(spec))
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines)
    if out:
        Path(out).write_text(text)
    else:
        sys.stdout.write(text)
    return len(lines)


@datasets_app.command("generate")
def generate(
    generator: Annotated[
        list[str] | None,
        typer.Option(
            "--generator", "-g", help="A reasoning-gym generator, NAME or NAME:WEIGHT (repeat to mix)."
        ),
    ] = None,
    config: Annotated[
        list[str] | None,
        typer.Option(
            "--config", "-c", help="NAME=JSON config for a generator (just JSON with one generator)."
        ),
    ] = None,
    spec: Annotated[
        str | None, typer.Option("--spec", help='A spec file ({"reasoning_gym": {...}}) instead of -g/-c.')
    ] = None,
    size: Annotated[int | None, typer.Option("--size", "-n", help="Rows to write (default 100).")] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed (default 0): same seed, same rows.")
    ] = None,
    system_prompt: Annotated[
        str | None,
        typer.Option(
            "--system-prompt",
            help="A system message before each question: a reasoning-gym SYSTEM_PROMPTS name "
            "(default, simple, direct, ...) or the text (default: none, as NeMo Gym's rows).",
        ),
    ] = None,
    level: Annotated[
        int | None,
        typer.Option(
            "--level",
            min=0,
            help="Every generator at this level of its reasoning-gym curriculum (0: easiest).",
        ),
    ] = None,
    out: Annotated[str | None, typer.Option("--out", "-o", help="Write here (default stdout).")] = None,
    spec_only: Annotated[
        bool, typer.Option("--spec-only", help="Write the spec file a job can name as its dataset, not rows.")
    ] = False,
) -> None:
    """Write NeMo Gym-format rows (question, answer, metadata) for one or several generators."""

    async def go() -> int:
        built = build_spec(generator or [], config or [], spec, size, seed, system_prompt, level)
        return await asyncio.to_thread(_write, built, out, spec_only)

    count = run(go())
    if out:
        err.print(f"wrote {'the spec' if spec_only else f'{count} rows'} to {out}")


@datasets_app.command("generators")
def generators(as_json: JsonOut = False) -> None:
    """List the reasoning-gym generators."""
    from rollmesh.procedural.rows import known_generators

    names = known_generators()
    if as_json:
        print_json(names)
    else:
        sys.stdout.write("".join(n + "\n" for n in names))


def register(app: typer.Typer) -> None:
    app.add_typer(datasets_app, name="datasets")
