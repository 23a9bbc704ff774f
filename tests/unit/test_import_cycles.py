"""No import cycle through the CLI's commands, the SDK, or the scheduler's errors / retry / spec
(they had three: errors -> retry -> spec -> errors, commands _common <-> _exit, the SDK's trainer
<-> _batch). Every import counts (at module level, under TYPE_CHECKING, inside a function): each
one says which module needs which."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.procs import REPO

ROOTS = [REPO / "services", REPO / "clients" / "python"]
# Modules (a trailing dot: every module of a package) no import cycle may run through.
UNTANGLED = (
    "rollmesh.commands.",
    "rollmesh_client.",
    "rollmesh.scheduler.errors",
    "rollmesh.scheduler.retry",
    "rollmesh.scheduler.spec",
)


def untangled(module: str) -> bool:
    return any(module.startswith(m) if m.endswith(".") else module == m for m in UNTANGLED)


def modules() -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if "v1" in parts or parts[0] not in ("rollmesh", "rollmesh_client"):
                continue  # generated code
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that `name` (at `path`) imports, anywhere in its code."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            named.add(base)
            named.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in named if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> Iterator[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    yield component


def test_no_import_cycle_through_the_untangled_modules() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert "rollmesh.scheduler.errors" in graph and "rollmesh_client.trainer" in graph  # it saw the tree
    found = [sorted(c) for c in cycles(graph) if any(untangled(m) for m in c)]
    assert not found, f"import cycles: {found}"


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert list(cycles(graph)) == [{"a", "b", "c"}]
