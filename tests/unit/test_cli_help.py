"""`--help` as a reader sees it (commands/_help.py): no value type on flags, a docstring's paragraph
on one line for the terminal to wrap, `run` and `jobs submit` options grouped by what they decide."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

from rollmesh.cli import build_command
from rollmesh.commands._help import JOB_PANELS
from rollmesh.commands._help import join_wrapped


def _paths(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _paths(sub, (*path, name))


def _help(*path: str) -> str:
    """The help `rollmesh PATH --help` prints on a 240-column terminal."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), mock.patch.dict(os.environ, {"COLUMNS": "240"}):
        code = build_command().main([*path, "--help"], prog_name="rollmesh", standalone_mode=False)
    assert code in (0, None), out.getvalue()
    return out.getvalue()


def test_no_flag_shows_a_value_type_on_any_command() -> None:
    for path in _paths(build_command()):
        assert "<bool>" not in _help(*path), path


def test_a_wrapped_docstring_reads_as_one_paragraph() -> None:
    said = "List every ROLLMESH_* environment variable (default, value in this shell, meaning), then the "
    assert said + "per-job retry and timeout defaults" in _help()


@pytest.mark.parametrize("path", [("run",), ("jobs", "submit")])
def test_job_options_are_grouped_by_what_they_decide(path: tuple[str, ...]) -> None:
    text = _help(*path)
    for panel in JOB_PANELS:
        assert f"─ {panel} ─" in text, panel
    assert text.index("─ Sampling ─") < text.index("--temperature")


def test_list_items_and_indented_lines_keep_their_breaks() -> None:
    text = "A paragraph\nwrapped here.\n\n- one\n- two\n    indented\nend"
    assert join_wrapped(text) == "A paragraph wrapped here.\n\n- one\n- two\n    indented end"
