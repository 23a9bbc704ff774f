"""Every command block of README.md and docs/*.md runs as written, or its page says, in a comment the
test reads, which test runs it or why it cannot run here (tests/e2e/readme_blocks.py: the directives).
A new block nobody annotated runs here: if it fails, this fails, so the docs cannot drift silently.

How a block runs: bash, `set -e`, in a scratch folder of its page (the checkout's top-level folders
linked in, the page's `file` blocks written), the venv's rollmesh, python and grpcurl first on PATH,
the gateway on the fake model (ROLLMESH_GATEWAY_BACKEND=fake: what is checked is the commands; the
tiny model's figures are tests/e2e/test_run_terminal.py's). `runs/<job_id>` and JOB_ID name a job the
test ran with the fake model in that folder. A `rollmesh up` line starts that mesh (free ports, the
block's flags and exported variables); what follows it runs against it, its default addresses mapped.
`mesh` blocks share one `rollmesh up` (its registry also sees an extra root that defines environment
`arithmetic` again: docs/grpcurl.md's error example). Whatever a block leaves running is stopped."""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from collections.abc import Mapping
from pathlib import Path

import pytest

from rollmesh.devtools.openai_server import openai_server_process
from rollmesh.mesh.config import DEFAULT_METRICS_PORTS
from rollmesh.mesh.config import DEFAULT_PORTS
from tests.e2e.conftest import rollmesh_up
from tests.e2e.readme_blocks import COMMAND_WORDS
from tests.e2e.readme_blocks import README
from tests.e2e.readme_blocks import SKIP_REASONS
from tests.e2e.readme_blocks import Block
from tests.e2e.readme_blocks import Unit
from tests.e2e.readme_blocks import bash_block
from tests.e2e.readme_blocks import blocks
from tests.e2e.readme_blocks import command_blocks
from tests.e2e.readme_blocks import indented_commands
from tests.e2e.readme_blocks import pages
from tests.e2e.readme_blocks import units
from tests.procs import GRPCURL
from tests.procs import REPO
from tests.procs import ROLLMESH

BLOCKS = command_blocks()
UNITS = [u for b in BLOCKS for u in units(b)]
RUN_HERE = [u for u in UNITS if not (u.has("skip") or u.has("by"))]
VERBS = {"skip", "by", "mesh", "openai-server", "exits", "output", "file"}
TIMEOUT_S = 600
#: Whatever a job of the docs' needs to exist: a small fake-model job in the page's folder.
JOB_ID = "docs-job"
_ADDR = r"(?:127\.0\.0\.1|localhost):(\d+)"


def test_every_command_block_is_run_or_says_why_not() -> None:
    """Each block's directives are known, a `skip` names a known reason and says why, a `by` test
    finds this very block, and no command hides in a block without a command language."""
    assert len(BLOCKS) >= 30, [b.where for b in BLOCKS]
    problems: list[str] = []
    for block in BLOCKS:
        for d in block.directives:
            if d.verb not in VERBS:
                problems.append(f"{block.where}: unknown directive {d.verb!r} (known: {sorted(VERBS)})")
            elif d.verb == "skip":
                reason, _, why = d.arg.partition(":")
                if reason not in SKIP_REASONS or not why.strip():
                    problems.append(
                        f"{block.where}: `skip {d.arg}`: want `skip REASON: why`, of {sorted(SKIP_REASONS)}"
                    )
            elif d.verb == "by" and not _runs_it(REPO / d.arg, block):
                problems.append(f"{block.where}: {d.arg} does not find this block with bash_block")
            if any(p > len(block.parts()) for p in d.parts):
                problems.append(
                    f"{block.where}: the block has {len(block.parts())} parts, not {max(d.parts)}"
                )
    for page in pages():
        for line in indented_commands(page):
            where = f"{page.relative_to(REPO)}:{line}"
            problems.append(f"{where}: an indented code block of commands: fence it ```bash")
        for block in blocks(page):
            if block.lang in ("", "text") and not any(d.verb == "file" for d in block.directives):
                if any(line.startswith(COMMAND_WORDS) for line in block.body.splitlines()):
                    problems.append(f"{block.where}: commands in a ```{block.lang} block: tag it ```bash")
    assert not problems, "\n".join(problems)


def test_every_page_showing_make_runs_figures_shows_the_readmes() -> None:
    """`make run`'s figures are checked against the README's table (tests/e2e/test_run_terminal.py,
    the real model); a page showing that table again shows the same one."""

    def tables(page: Path) -> list[str]:
        return [b.body for b in blocks(page) if "┃ mean reward" in b.body]

    [readme] = tables(README)
    shown = {page.name: tables(page) for page in pages() if page != README}
    assert shown["getting-started.md"] == [readme]
    assert all(found == [readme] for found in shown.values() if found), shown


def _runs_it(test_file: Path, block: Block) -> bool:
    """Whether `test_file` calls bash_block and, among its string literals, has a text of the page
    with which bash_block finds `block` (passed to it directly or through a helper of the file)."""
    if not test_file.is_file():
        return False
    tree = ast.parse(test_file.read_text())
    nodes = list(ast.walk(tree))
    if not any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "bash_block" for n in nodes):
        return False
    text = block.page.read_text()
    for node in nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) > 6:
            if node.value in text:
                found = (
                    bash_block(node.value, block.page) if "```bash" in text.split(node.value, 1)[1] else ""
                )
                if textwrap.dedent(found).strip() == block.body.strip():
                    return True
    return False


# --- running the blocks ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folders() -> dict[Path, Path]:
    """Each page's scratch folder, made on first use (`scratch`)."""
    return {}


def scratch(page: Path, folders: dict[Path, Path], factory: pytest.TempPathFactory) -> Path:
    """The page's scratch folder: the checkout's top-level entries linked in, its `file` blocks
    written."""
    if page not in folders:
        work = factory.mktemp(page.stem)
        for entry in REPO.iterdir():
            if not entry.name.startswith(".") and entry.name not in ("runs", "site"):
                (work / entry.name).symlink_to(entry)
        for block in blocks(page):
            for d in block.directives:
                if d.verb == "file":
                    (work / d.arg).parent.mkdir(parents=True, exist_ok=True)
                    (work / d.arg).write_text(block.body)
        folders[page] = work
    return folders[page]


def _env(extra: Mapping[str, str] = {}) -> dict[str, str]:
    return {
        **os.environ,
        "ROLLMESH_GATEWAY_BACKEND": "fake",
        **extra,
        "PATH": f"{GRPCURL.parent}{os.pathsep}{os.environ['PATH']}",
    }


def _bash(script: str, cwd: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """`script` under `set -e` in `cwd`; whatever it leaves running (a `cmd &`) is stopped after."""
    path = cwd / ".docs_block.sh"
    path.write_text("set -e\n" + script)
    proc = subprocess.Popen(
        ["bash", str(path)], cwd=cwd, env=dict(env), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _map(script: str, addrs: Mapping[str, str], metrics: Mapping[str, str] = {}) -> str:
    """The default addresses of `script` replaced by a running mesh's."""
    ports = {str(p): addrs[s] for s, p in DEFAULT_PORTS.items() if s in addrs}
    ports |= {str(p): metrics[s] for s, p in DEFAULT_METRICS_PORTS.items() if s in metrics}
    mapped = re.sub(_ADDR, lambda m: ports.get(m[1], m[0]), script)
    assert not re.search(r"(?:127\.0\.0\.1|localhost):(?:5005\d|946\d)\b", mapped), (
        "an address no mesh here has"
    )
    return mapped


def _addr_env(addrs: Mapping[str, str]) -> dict[str, str]:
    return {f"ROLLMESH_{s.upper()}_ADDR": a for s, a in addrs.items() if s in DEFAULT_PORTS}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The `mesh` blocks' `rollmesh up` (fake model), an extra root defining `arithmetic` again."""
    work = tmp_path_factory.mktemp("stack")
    again = work / "root" / "environments" / "arithmetic"
    again.mkdir(parents=True)
    (again / "env.py").write_text(
        (REPO / "services/rollmesh/builtin/environments/arithmetic/env.py").read_text()
    )
    with rollmesh_up(work, {"ROLLMESH_EXTRA_ROOTS": str(work / "root")}) as addrs:
        yield addrs


def _job(work: Path) -> None:
    """A small job with the fake model in `work/runs/docs-job` (once)."""
    if (work / "runs" / JOB_ID / "rollouts.jsonl").exists():
        return
    args = ["run", "--backend", "fake", "--benchmark", "arithmetic", "--limit", "4", "-n", "2"]
    done = subprocess.run(
        [str(ROLLMESH), *args, "--output-dir", "runs", "--job-id", JOB_ID],
        cwd=work, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def _split_at_up(script: str) -> tuple[dict[str, str], list[str], str] | None:
    """A script with a `rollmesh up` line: (what it exports before, up's flags, the rest)."""
    lines = script.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("rollmesh up")), None)
    if at is None:
        return None
    exported: dict[str, str] = {}
    for line in lines[:at]:
        words = shlex.split(line, comments=True)
        assert not words or words[0] == "export", (
            f"the docs test runs only `export` before `rollmesh up`: {line}"
        )
        exported |= dict(w.split("=", 1) for w in words[1:])
    return exported, shlex.split(lines[at], comments=True)[2:], "\n".join(lines[at + 1 :]) + "\n"


def _shown_output(script: str) -> list[str]:
    """The block's last comment lines (what it prints), as fragments between `...`, whitespace gone."""
    shown: list[str] = []
    for line in reversed(script.rstrip().splitlines()):
        if not line.startswith("#"):
            break
        shown.insert(0, line.lstrip("#"))
    return [re.sub(r"\s+", "", f) for f in " ".join(shown).split("...") if f.strip()]


def _run_unit(
    unit: Unit, work: Path, stack_addrs: Mapping[str, str] | None
) -> subprocess.CompletedProcess[str]:
    script = unit.script
    if "<job_id>" in script or "JOB_ID" in script:
        _job(work)
        script = script.replace("<job_id>", JOB_ID).replace("JOB_ID", JOB_ID)
    if unit.has("openai-server"):
        model = re.search(r"--model (\S+)", script)
        assert model, "an `openai-server` block names its --model"
        served = re.search(r"https?://" + _ADDR, script)
        assert served, "an `openai-server` block names the server's URL"
        with openai_server_process(model=model[1]) as (url, _):
            return _bash(script.replace(served[0], url.removesuffix("/v1")), work, _env())
    if (up := _split_at_up(script)) is not None:
        exported, flags, rest = up
        with rollmesh_up(work, {"ROLLMESH_GATEWAY_BACKEND": "fake", **exported}, flags) as addrs:
            metrics = addrs.get("metrics", {})
            return _bash(_map(rest, addrs, metrics), work, _env({**exported, **_addr_env(addrs)}))
    if unit.has("mesh"):
        assert stack_addrs is not None
        return _bash(_map(script, stack_addrs), work, _env(_addr_env(stack_addrs)))
    assert not re.search(r"(?:127\.0\.0\.1|localhost):5005\d\b", script), (
        "a block naming a mesh's address: start one in it (`rollmesh up`) or annotate it `mesh`"
    )
    return _bash(script, work, _env())


@pytest.mark.parametrize("unit", RUN_HERE, ids=[u.id for u in RUN_HERE])
def test_the_block_runs_as_written(
    unit: Unit,
    folders: dict[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> None:
    work = scratch(unit.block.page, folders, tmp_path_factory)
    stack_addrs = request.getfixturevalue("stack") if unit.has("mesh") else None
    done = _run_unit(unit, work, stack_addrs)
    want = int(unit.arg("exits")) if unit.has("exits") else 0
    printed = done.stdout + done.stderr
    assert done.returncode == want, (
        f"exit {done.returncode}, not {want}:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    )
    if unit.has("output"):
        flat = re.sub(r"\s+", "", printed)
        at = 0
        for fragment in _shown_output(unit.script):
            found = flat.find(fragment, at)
            assert found >= 0, f"the page shows {fragment!r}; the block printed:\n{printed[-3000:]}"
            at = found + len(fragment)
