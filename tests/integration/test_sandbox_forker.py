"""The pre-started solution sandbox (verifier/sandbox/forker.py): a run forked from it inherits
nothing another run could have left or the code could use, exactly as a sandbox started fresh
per run. One slot, so consecutive runs share one forker; the guards off, as code that got past
them would be."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollmesh.verifier import SandboxConfig
from rollmesh.verifier import SandboxLimits
from rollmesh.verifier.sandbox.core import Sandbox
from rollmesh.verifier.sandbox.core import TestSpec

LIMITS = SandboxLimits(wall_s=20.0, cpu_s=5, memory_mb=256, nproc=16, fsize_mb=1, output_kb=16)


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    box = Sandbox(SandboxConfig(concurrency=1, limits=LIMITS))
    if await box.start() != "namespaces" or os.geteuid() != 0:
        pytest.skip("solution sandboxes are pre-started only in the namespaces mode as root")
    try:
        yield box
    finally:
        await box.aclose()


async def run(box: Sandbox, code: str, *tests: str) -> tuple[int, int, str]:
    res = await box.run(code, TestSpec("asserts", list(tests)), guards=False)
    return res.passed, res.total, f"{res.status} {res.error} {res.cases} {res.stderr[-500:]}"


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            if int(stat.rpartition(b")")[2].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def _writable_memory(pid: int) -> bytes:
    """Every readable, writable mapping of `pid` (heap, stacks, data): what a child forked from it
    starts with."""
    out = bytearray()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                out += mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
    return bytes(out)


FDS = """
import os, stat
def kinds():
    found = {}
    for fd in range(1024):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        kind = 'socket' if stat.S_ISSOCK(mode) else 'pipe' if stat.S_ISFIFO(mode) else 'other'
        found[fd] = 'chr' if stat.S_ISCHR(mode) else kind
    return found
"""


async def test_a_forked_run_holds_only_its_own_pipes(sandbox: Sandbox) -> None:
    """No socket (the forker's control socket), no file: its stdin (/dev/null), its output pipes, its
    request and reply pipes; the same set on every run."""
    tests = [
        "k = kinds()\nassert 'socket' not in k.values() and 'other' not in k.values(), k",
        "k = kinds()\nassert sorted(k.values()) == ['chr'] + ['pipe'] * 4 and k[0] == 'chr', k",
    ]
    for _ in range(2):
        passed, total, why = await run(sandbox, FDS, *tests)
        assert passed == total == 2, why


async def test_a_run_sees_nothing_of_the_run_before(sandbox: Sandbox) -> None:
    """The run before left a file, a module attribute, a daemon, an xattr on its directory and a SysV
    shared memory segment anyone may read, and tried to kill the forker (pid 1 of their namespace):
    the next run has a fresh /sandbox, interpreter state and IPC namespace, no process of the
    earlier run, and the same forker."""
    leave = (
        "import os, json, time\n"
        "open('left.txt', 'w').write('x')\n"
        "json.left_by_the_run_before = True\n"
        "try:\n    os.setxattr('.', 'user.left', b'x')\nexcept OSError:\n    pass\n"
        "for sig in (9, 15, 2):\n    try:\n        os.kill(1, sig)\n    except OSError:\n        pass\n"
        "if os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
        "import ctypes\n"
        "shm = ctypes.CDLL(None).shmget(0x5EC2E7, 4096, 0o1000 | 0o666)\n"  # IPC_CREAT, for anyone
        "uid = os.getuid()\n"
    )
    passed, total, why = await run(sandbox, leave, "assert uid > 0", "assert shm >= 0")
    assert passed == total == 2, why
    forker = sandbox._forkers[0]
    look = (
        "import os, json\n"
        "files = os.listdir('.')\n"
        "attr = hasattr(json, 'left_by_the_run_before')\n"
        "try:\n    xattrs = os.listxattr('.')\nexcept OSError:\n    xattrs = []\n"
        "alive = []\n"
        "for pid in range(2, 4096):\n"
        "    try:\n        os.kill(pid, 0)\n    except ProcessLookupError:\n        continue\n"
        "    except OSError:\n        pass\n"
        "    alive.append(pid)\n"
        "import ctypes\n"
        "shm = ctypes.CDLL(None).shmget(0x5EC2E7, 4096, 0)\n"
    )
    passed, total, why = await run(
        sandbox,
        look,
        "assert shm == -1",
        "assert files == [], files",
        "assert not attr",
        "assert xattrs == [], xattrs",
        "assert alive == [os.getpid()], alive",
    )
    assert passed == total == 5, why
    assert sandbox._forkers == [forker]  # the same forker ran both (it was not killed)


async def test_the_forker_holds_no_code_tests_or_answers(sandbox: Sandbox) -> None:
    """What a child starts with is the forker's memory (and the clean interpreter's): neither ever
    held a run's code, tests or answers. Read from the host, it holds none of them after a run."""
    code_secret, test_secret, answer_secret = (f"sekrit-{uuid.uuid4().hex}" for _ in range(3))
    code = f"KEY = {code_secret!r}\ndef answer():\n    return {answer_secret[:7]!r} + {answer_secret[7:]!r}\n"
    passed, total, why = await run(sandbox, code, f"assert answer() == {answer_secret!r} and {test_secret!r}")
    assert passed == total == 1, why
    (forker,) = _children(sandbox._forkers[0].proc.pid)
    (clean,) = _children(sandbox._idle[0].proc.proc.pid)
    for pid in (forker, clean):
        memory = _writable_memory(pid)
        assert b"fork_server" in memory or b"fork_solutions" in memory  # the scan reads its memory
        for secret in (code_secret, test_secret, answer_secret):
            assert secret.encode() not in memory, (pid, secret)


async def test_subprocess_imported_after_the_guards_is_still_denied(sandbox: Sandbox) -> None:
    """The guards no longer import `subprocess` (it loads `threading`, whose after-fork hook cost
    every forked child ~0.5 ms): the code's own import of it gets a denied Popen, and neither the
    solution's process nor the clean interpreter had `threading` loaded before the code ran."""
    code = (
        "import sys\n"
        "before = sorted(m for m in ('threading', 'subprocess') if m in sys.modules)\n"
        "import subprocess, importlib\n"
        "def denied(reload=False):\n"
        "    module = importlib.reload(subprocess) if reload else subprocess\n"
        "    try:\n"
        "        module.Popen(['/bin/true']).wait()\n"
        "    except PermissionError as exc:\n"
        "        return str(exc)\n"
        "    return 'started'\n"
        "def loaded():\n"
        "    return before\n"
    )
    res = await sandbox.run(
        code,
        TestSpec(
            "asserts",
            [
                "assert denied() == 'starting processes is not allowed in the sandbox'",
                "assert denied(reload=True) == 'starting processes is not allowed in the sandbox'",
                "assert loaded() == []",
                "import sys\nassert 'threading' not in sys.modules",
            ],
        ),
    )
    assert res.passed == res.total == 4, f"{res.status} {res.error} {res.cases} {res.stderr[-500:]}"
