"""Run an external agent program under resource limits: `python _program_limits.py LIMITS_JSON -- ARGV...`.

Standard library only (it runs before the program, in the program's own environment, which has no
rollmesh on its path). Asks the kernel to SIGTERM it when the scheduler dies (PR_SET_PDEATHSIG, kept
across exec; done here, not in a `preexec_fn`: the scheduler runs gRPC, whose fork handlers a
`preexec_fn` would run in the child, which then aborted), sets the rlimits named in LIMITS_JSON
({"parent": pid, "rlimits": {"RLIMIT_AS": bytes, ...}}; a limit the platform lacks is skipped), then
replaces itself with ARGV (exit 127 when ARGV cannot be run, the reason on stderr). Its caller
(program.py) has already made it a session leader, so killing the process group ends the program
and everything it started.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: _program_limits.py LIMITS_JSON -- ARGV...\n")
        return 2
    settings = json.loads(argv[0])
    _die_with(int(settings.get("parent", 0)))
    for name, value in settings.get("rlimits", {}).items():
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


def _die_with(parent: int) -> None:
    """SIGTERM when `parent` dies (Linux; elsewhere nothing): the shape of mesh/children.py's
    die_with_parent, which cannot be imported here."""
    if not sys.platform.startswith("linux") or not parent:
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the call: the kernel will not tell us
        sys.exit(143)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
