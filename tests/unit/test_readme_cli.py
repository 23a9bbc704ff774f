"""The docs' command table, flag lists and examples match the CLI (README.md and the docs site's
pages, docs/*.md): every `rollmesh ...` command they name exists (`--help` answers), and every
`--flag` a row, the common-flags paragraph or one of the README's examples names is an option of
that command (a renamed or dropped flag fails here, not in a user's shell)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollmesh.cli import build_app

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOCS = "\n".join(page.read_text() for page in PAGES)
# The command table (docs/running.md).
ROWS = re.findall(
    r"^\| `rollmesh ([^`]+)`(.*)$", (REPO / "docs" / "running.md").read_text(), flags=re.MULTILINE
)
# The README's "Ways to run it" block: each `rollmesh ...` line (after any VAR=value words).
WAYS = re.findall(
    r"^(?:[A-Z_]+=\S+ )*rollmesh (.+)$",
    re.findall(r"## Ways to run it.*?```bash\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)[0],
    flags=re.MULTILINE,
)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _commands(spelled: str) -> list[tuple[str, ...]]:
    """`jobs submit\\|status` -> [("jobs", "submit"), ("jobs", "status")]: the words before the
    first argument or option, alternatives expanded."""
    words: list[str] = []
    for word in spelled.replace("\\|", "|").split():
        if word.startswith(("-", "[", "'", ".")) or word.isupper() or "." in word:
            break
        words.append(word)
    *path, last = words
    return [(*path, alt) for alt in last.split("|")]


@functools.cache
def _help(command: tuple[str, ...]) -> str:
    result = CliRunner().invoke(build_app(), [*command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, (command, result.output)
    return result.stdout


def test_the_readme_has_a_command_table() -> None:
    assert len(ROWS) >= 15


@pytest.mark.parametrize(("spelled", "rest"), ROWS, ids=[r[0][:40] for r in ROWS])
def test_each_command_in_the_table_exists_with_the_flags_it_names(spelled: str, rest: str) -> None:
    commands = _commands(spelled)
    helps = [_help(c) for c in commands]
    for flag in set(FLAG.findall(spelled + rest)):
        assert any(flag in h for h in helps), (
            f"README row `rollmesh {spelled}` names {flag}: not in {commands}"
        )


@pytest.mark.parametrize("line", WAYS)
def test_each_way_to_run_it_names_a_command_and_its_flags(line: str) -> None:
    [command] = _commands(line)
    for flag in set(FLAG.findall(line)):
        assert flag in _help(command), f"README example `rollmesh {line}`: {flag} is not an option"


def test_the_readme_shows_every_way_to_run_it() -> None:
    assert {w.split()[0] for w in WAYS} >= {"run", "up", "jobs", "serve"}


def test_the_common_run_and_submit_flags_exist_on_both() -> None:
    paragraph = DOCS[DOCS.index("Common `run` / `jobs submit` flags") :]
    paragraph = paragraph[: paragraph.index("\n\n")]
    flags = set(FLAG.findall(paragraph))
    assert {"--num-repeats", "--logprobs", "--allowed-failures"} <= flags
    for command in (("run",), ("jobs", "submit")):
        missing = sorted(f for f in flags if f not in _help(command))
        assert not missing, f"rollmesh {' '.join(command)} lacks {missing}"


# The pages that name the variables rollmesh reads (docs/external-agents.md also names those it sets
# for an agent program).
VARIABLE_PAGES = ["README.md", "DESIGN.md", "docs/training.md", "docs/nemo-gym-migration.md"] + [
    f"docs/{page}.md"
    for page in (
        "getting-started running scaling containers sdk grpcurl environments configuration security"
        " job-states benchmarks development container-tasks architecture"
    ).split()
]


@pytest.mark.parametrize("doc", VARIABLE_PAGES)
def test_every_rollmesh_variable_the_docs_name_is_declared(doc: str) -> None:
    """`rollmesh config` lists ENV_VARS: a variable the docs name but no code reads is a trap."""
    from rollmesh.mesh.config import ENV_VARS

    text = (REPO / doc).read_text()
    # ROLLMESH_COMPOSE is printed by deploy/local-docker.sh for the shell, not read by rollmesh.
    named = set(re.findall(r"ROLLMESH_[A-Z0-9_]*[A-Z0-9]", text)) - {"ROLLMESH_COMPOSE"}
    assert not sorted(named - set(ENV_VARS)), f"{doc} names undeclared variables"


def test_the_job_state_exit_codes_are_the_clis() -> None:
    from rollmesh.commands._exit import JOB_EXIT_CODES

    table = dict(re.findall(r"^\| `([A-Z_]+)` \|.*\| (\d+) \|$", DOCS, flags=re.MULTILINE))
    assert {state: int(code) for state, code in table.items()} == JOB_EXIT_CODES


@pytest.mark.parametrize("doc", ["README.md", "DESIGN.md"])
def test_the_default_ports_are_the_configs(doc: str) -> None:
    from rollmesh.mesh.config import DEFAULT_PORTS
    from rollmesh.mesh.config import OPENAI_HTTP_PORT

    text = " ".join((REPO / doc).read_text().split())
    expected = ", ".join(f"{s} {p}" for s, p in DEFAULT_PORTS.items())
    expected = expected.replace(
        f"gateway {DEFAULT_PORTS['gateway']}",
        f"gateway {DEFAULT_PORTS['gateway']} (OpenAI HTTP {OPENAI_HTTP_PORT})",
    )
    assert f"Default ports: {expected}" in text


def test_the_docs_home_page_gives_the_purpose_the_two_commands_and_the_picture() -> None:
    """The site's first page is not a bare list of links: it says what rollmesh is, gives the two
    commands and shows the README's architecture picture (the same text, so the two cannot drift)."""
    home = (REPO / "docs" / "index.md").read_text()
    readme = (REPO / "README.md").read_text()
    assert "collects LLM rollouts against verifiable environments" in home
    assert re.search(r"^make run ", home, re.M) and re.search(r"^make test ", home, re.M)
    picture = readme.split("## Architecture", 1)[1].split("```")[1]
    assert picture in home
