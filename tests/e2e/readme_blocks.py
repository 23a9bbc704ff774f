"""The README's (or a docs page's) shell blocks as tests run them: a block after a heading or
phrase, its default ports mapped to a running mesh's addresses, run by bash with the venv's grpcurl
and rollmesh first on PATH; and every command block of the README and docs/ with what its page says
about running it (`command_blocks`: tests/e2e/test_docs_commands.py runs or accounts for each).

How a page tells the docs test about a block: HTML comments (invisible on the site) on the lines
right above its fence, each `<!-- docs-test: DIRECTIVE -->`, or `<!-- docs-test N[,M]: DIRECTIVE -->`
for parts N, M of the block only (its paragraphs, split at blank lines, counted from 1). In a list
item, where a comment line would end the list, the comments end the paragraph above the block:

- `skip REASON: why` — not run here; REASON is one of `SKIP_REASONS` (a real external need).
- `by tests/PATH.py` — run by that test, which finds the block with `bash_block` (checked).
- `mesh` — run against a running `rollmesh up` (the docs test's, fake model): its default
  addresses (127.0.0.1:5005x, localhost:5005x) are mapped to the running mesh's.
- `openai-server` — an OpenAI-compatible server (rollmesh.devtools.openai_server) serving the
  block's `--model`, at the address the block names (mapped).
- `exits N` — the block's last command exits N (the block shows an error).
- `output` — the block's last comment lines are what it prints: each must be in the output, in
  order, whitespace aside, `...` standing for anything.
- `file PATH` — on a non-command block (Python, TOML, JSON): saved as PATH (relative to the page's
  scratch folder) before the page's blocks run.
A block with none of these runs as written in the page's scratch folder (the checkout's folders
linked in), on the fake model (ROLLMESH_GATEWAY_BACKEND=fake), and must exit 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from rollmesh.mesh.config import DEFAULT_PORTS
from tests.procs import GRPCURL

README = Path(__file__).resolve().parents[2] / "README.md"
DOCS = README.parent / "docs"

#: The languages of command blocks: every one is run, or its page says why not.
COMMAND_LANGS = ("bash", "console", "sh", "shell")
#: Why a block may not run here: the only reasons `skip` takes.
SKIP_REASONS = {
    "docker": "a Docker daemon and the stack's images (`make test-containers` runs the compose stack)",
    "cluster": "several machines (a Ray cluster; host names such as HEAD and GATEWAY stand for them)",
    "gpu": "a GPU and a model the reader brings",
    "suite": "the suite itself (`make test`), or `make run`'s real model: tests/e2e/test_run_terminal.py",
    "bench": "a benchmark of minutes on every core (`make bench`; figures in docs/benchmarks.md)",
    "yours": "what only the reader has (their own environment package): the comment names the test that"
    " runs the same steps on the suite's own",
}
#: Words a command line starts with: an untagged block holding one is a command block untagged.
COMMAND_WORDS = ("rollmesh ", "python ", "make ", "grpcurl ", "curl ", "docker ", "pip ", "export ", "cd ")

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+)(?P<lang>[\w-]*)\s*$")
_NOTE = re.compile(r"^\s*<!-- docs-test(?: (?P<parts>\d+(?:,\d+)*))?: (?P<directive>.+?) -->\s*$")
_INLINE_NOTE = re.compile(r"<!-- docs-test(?: (?P<parts>\d+(?:,\d+)*))?: (?P<directive>.+?) -->")


@dataclass(frozen=True)
class Directive:
    verb: str  # skip, by, mesh, openai-server, exits, output, file
    arg: str = ""
    parts: tuple[int, ...] = ()  # empty: the whole block


@dataclass
class Block:
    """One fenced block of a page: where, its language, body and what the page says about it."""

    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    directives: list[Directive] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(README.parent)}:{self.line}"

    def parts(self) -> list[str]:
        """The block's paragraphs (split at blank lines)."""
        return [p for p in re.split(r"\n\s*\n", self.body.strip("\n")) if p.strip()]

    def of(self, part: int | None) -> list[Directive]:
        """The directives of part `part` (None: the whole block's)."""
        return [d for d in self.directives if not d.parts or (part is not None and part in d.parts)]


@dataclass(frozen=True)
class Unit:
    """What runs as one script: a block, or one part of a block whose parts its page annotates."""

    block: Block
    part: int | None
    script: str

    @property
    def id(self) -> str:
        return self.block.where + (f"#{self.part}" if self.part else "")

    def has(self, verb: str) -> bool:
        return any(d.verb == verb for d in self.block.of(self.part))

    def arg(self, verb: str) -> str:
        return next(d.arg for d in self.block.of(self.part) if d.verb == verb)


#: The built-in root's README (docs/environments.md sends readers there to write an environment).
ENVIRONMENTS_README = README.parent / "services" / "rollmesh" / "builtin" / "environments" / "README.md"


def pages() -> list[Path]:
    """The README, every page of the docs site (docs/*.md) and the environments README."""
    return [README, *sorted(DOCS.glob("*.md")), ENVIRONMENTS_README]


def _directive(match: re.Match[str]) -> Directive:
    parts = tuple(int(p) for p in match["parts"].split(",")) if match["parts"] else ()
    verb, _, arg = match["directive"].partition(" ")
    return Directive(verb, arg.strip(), parts)


def blocks(page: Path) -> list[Block]:
    """Every fenced block of `page`, with the `docs-test` comments right above it."""
    lines = page.read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        notes: list[Directive] = []
        above = i - 1
        while above >= 0 and (note := _NOTE.match(lines[above])):
            notes.insert(0, _directive(note))
            above -= 1
        if not notes and above >= 1 and not lines[above].strip():  # in a list: the paragraph's end
            notes = [_directive(n) for n in _INLINE_NOTE.finditer(lines[above - 1])]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != opening["fence"]:
            body.append(lines[j])
            j += 1
        text = textwrap.dedent("\n".join(body) + "\n")
        found.append(Block(page, i + 1, opening["lang"], text, notes))
        i = j + 1
    return found


def indented_commands(page: Path) -> list[int]:
    """The lines of `page` that open an indented code block (4 spaces or more, after a blank line,
    outside fences) holding a command: every command block is to be fenced ```bash."""
    found: list[int] = []
    fenced = False
    lines = page.read_text().split("\n")
    for n, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and n and not lines[n - 1].strip() and re.match(r" {4,}\S", line):
            if line.strip().startswith(COMMAND_WORDS) or re.match(
                r"[\w./-]*python3?\b|[A-Z_]+=\S", line.strip()
            ):
                found.append(n + 1)
    return found


def command_blocks() -> list[Block]:
    """Every command block (`COMMAND_LANGS`) of the README and the docs pages."""
    return [b for page in pages() for b in blocks(page) if b.lang in COMMAND_LANGS]


def units(block: Block) -> list[Unit]:
    """What of `block` runs as a script of its own: the block, or each part when its page annotates
    parts of it."""
    if any(d.parts for d in block.directives):
        return [Unit(block, n, text + "\n") for n, text in enumerate(block.parts(), start=1)]
    return [Unit(block, None, block.body)]


def bash_block(after: str, doc: Path = README) -> str:
    """The first ```bash block of `doc` (README.md) after the text `after`."""
    section = doc.read_text().split(after, 1)[1]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)[0]


def run_block(
    script: str,
    addrs: Mapping[str, str],
    tmp: Path,
    env: Mapping[str, str] | None = None,
    *,
    cwd: Path | None = None,
    timeout_s: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run `script` (`set -e`: it stops at the first command that fails) against the mesh at `addrs`
    (empty: a block that starts its own mesh), in `cwd` (default: the test's)."""
    for service, port in DEFAULT_PORTS.items():
        if service in addrs:
            script = script.replace(f"127.0.0.1:{port}", addrs[service])
    assert not re.search(r"127\.0\.0\.1:5005\d", script), "a README command uses a port the test does not map"
    path = tmp / "readme_block.sh"
    path.write_text("set -e\n" + script)
    full_env = {**os.environ, **(env or {}), "PATH": f"{GRPCURL.parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", str(path)], capture_output=True, text=True, env=full_env, timeout=timeout_s, cwd=cwd
    )
