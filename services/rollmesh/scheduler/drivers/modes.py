"""How a job's external agent program runs (`JobSpec.agent_program_mode`, `--agent-mode`):

- "command" (or ""): a fresh process per rollout (program.py `PerRollout`);
- "warm": per rollout too, forked from an interpreter with the program's imports done
  (drivers/warm.py): a Python program only, `python SCRIPT`, `python -m MODULE` or `python -c CODE`;
- "server": one agent server for the job, a request per rollout (drivers/agent_server.py).

Standard library only: the plan checks a job's mode with it before anything starts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

COMMAND, WARM, SERVER = "command", "warm", "server"
MODES = (COMMAND, WARM, SERVER)
_INTERPRETER_OPTIONS = ("-u", "-B", "-E", "-s", "-S", "-I", "-O", "-OO")


def check_mode(mode: str, argv: Sequence[str]) -> str:
    """The mode ("" is "command"); ValueError naming what is wrong with it for `argv`."""
    mode = mode or COMMAND
    if mode not in MODES:
        raise ValueError(f"agent program mode {mode!r} is not one of {', '.join(MODES)}")
    if mode != COMMAND and not argv:
        raise ValueError(f"agent program mode {mode!r} needs an agent program")
    if mode == WARM:
        warm_argv(argv)
    return mode


def warm_argv(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(the interpreter, what follows its own options: SCRIPT ARGS, -m MODULE ARGS or -c CODE ARGS)
    of a program run warm; ValueError when it is not a Python program of that shape."""
    shape = "python SCRIPT, python -m MODULE or python -c CODE"
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        raise ValueError(f"a warm start needs a Python program ({shape}), not {' '.join(argv)!r}")
    rest = list(argv[1:])
    while rest and rest[0] in _INTERPRETER_OPTIONS:
        rest.pop(0)  # the interpreter's own options are not kept warm
    if not rest or (rest[0].startswith("-") and (rest[0] not in ("-m", "-c") or len(rest) < 2)):
        raise ValueError(f"a warm start needs {shape}, not {' '.join(argv)!r}")
    return argv[0], rest
