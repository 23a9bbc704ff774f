"""No import cycle among the modules of services/ and the SDK (clients/python). Every import
counts: at module level, under TYPE_CHECKING, and inside a function. A function-level import runs
later than a module-level one and a TYPE_CHECKING one never runs, but each still says that one
module needs the other; a cycle hidden in a function (the verifier's loader imported the bridges
that imported the loader) is as much a tangle as one at the top. A dynamic import (importlib with a
name in a string) is not seen: the registries that replace such imports take objects, never names.

An edge goes to the module named: `from pkg import sub` (sub a module) is an edge to pkg.sub,
`from pkg import name` (a name defined in pkg/__init__.py) one to pkg. Python runs a package's
__init__ before any of its modules, but that implicit step is no edge: every package whose __init__
re-exports its modules would otherwise be a cycle with them.

History: the CLI's commands, the SDK and the scheduler's errors / retry / spec had three cycles
(errors -> retry -> spec -> errors, commands _common <-> _exit, the SDK's trainer <-> _batch); the
gateway's, scheduler's and verifier's telemetry.py imported their service back, and the verifier's
loader and its bridges imported each other (issue #40)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.procs import REPO

ROOTS = [REPO / "services", REPO / "clients" / "python"]


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
            for alias in node.names:
                named.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
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


def tree_graph() -> dict[str, set[str]]:
    """The import graph of services/ and the SDK, read in a fresh interpreter (this module run as a
    script): CPython 3.11.7 keeps the AST constructor's recursion count in state shared by the whole
    process (gh-106905), so in a test worker where other tests parsed code, `ast.parse` once raised
    `SystemError: AST constructor recursion depth mismatch` on a file that parses."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.test_import_cycles"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: set(edges) for name, edges in json.loads(done.stdout).items()}


def test_no_import_cycle_among_the_services_and_the_sdk_modules() -> None:
    graph = tree_graph()
    # it saw the tree, and each kind of import
    assert "rollmesh.scheduler.errors" in graph and "rollmesh_client.trainer" in graph
    assert "rollmesh.verifier.loader" in graph["rollmesh.verifier.service"]
    found = [sorted(c) for c in cycles(graph)]
    assert not found, f"import cycles: {found}"


def test_every_kind_of_import_is_an_edge(tmp_path: Path) -> None:
    pkg = tmp_path / "rollmesh" / "pkg"
    pkg.mkdir(parents=True)
    sources = {
        "__init__.py": "from rollmesh.pkg.a import A\n",
        "a.py": "import typing\nif typing.TYPE_CHECKING:\n    from rollmesh.pkg import b\nA = 1\n",
        "b.py": "def f() -> None:\n    from . import c\n",
        "c.py": "import rollmesh.pkg.a\nfrom rollmesh.pkg import A\n",
    }
    for name, text in sources.items():
        (pkg / name).write_text(text)
    known = {f"rollmesh.pkg.{n[:-3]}" if n != "__init__.py" else "rollmesh.pkg": pkg / n for n in sources}
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert graph == {
        "rollmesh.pkg": {"rollmesh.pkg.a"},
        "rollmesh.pkg.a": {"rollmesh.pkg.b"},  # under TYPE_CHECKING, a module of the package
        "rollmesh.pkg.b": {"rollmesh.pkg.c"},  # inside a function, relative
        "rollmesh.pkg.c": {"rollmesh.pkg.a", "rollmesh.pkg"},  # a name of the package's __init__
    }
    assert sorted(map(sorted, cycles(graph))) == [
        ["rollmesh.pkg", "rollmesh.pkg.a", "rollmesh.pkg.b", "rollmesh.pkg.c"]
    ]


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert list(cycles(graph)) == [{"a", "b", "c"}]


if __name__ == "__main__":
    known = modules()
    print(json.dumps({name: sorted(imports(name, path, known)) for name, path in known.items()}))
