"""Run an external agent program under resource limits: `python _program_limits.py LIMITS_JSON -- ARGV...`.

Standard library only (it runs before the program, in the program's own environment, which has no
rollmesh on its path). Sets the rlimits named in LIMITS_JSON ({"RLIMIT_AS": bytes, ...}; a limit the
platform lacks is skipped), then replaces itself with ARGV (exit 127 when ARGV cannot be run, the
reason on stderr). Its caller (program.py) has already made it a session leader, so killing the
process group ends the program and everything it started.
"""

from __future__ import annotations

import json
import os
import resource
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: _program_limits.py LIMITS_JSON -- ARGV...\n")
        return 2
    for name, value in json.loads(argv[0]).items():
        which = getattr(resource, name, None)
        if which is None:
            continue
        soft = int(value)
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(which, (soft, soft))
    program = argv[2:]
    try:
        os.execvp(program[0], program)
    except OSError as exc:
        sys.stderr.write(f"cannot run {program[0]!r}: {exc.strerror or exc}\n")
        return 127
    return 0  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
