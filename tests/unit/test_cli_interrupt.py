"""Ctrl-C while `rollmesh` is still importing its commands (the first second or more on a loaded
machine) ends with one "interrupted" line and exit 130, as Ctrl-C does later, never an import
traceback."""

from __future__ import annotations

import pytest

from rollmesh import cli


def test_ctrl_c_while_the_commands_load_is_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted_import() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_app", interrupted_import)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"
