"""Running untrusted Python against tests: a separate process per run, in a fresh temp dir.

Isolation is probed once at start and logged (`sandbox_isolation`):

- `namespaces` (when the kernel lets us `unshare` mount, net, pid, ipc and uts namespaces): the
  run sees a chroot built from a tmpfs holding read-only binds of /usr (and /lib*, /bin) and the
  Python prefix, with its temp dir as /sandbox; no network interface but loopback; its own pid
  namespace, so killing the outer process kills every descendant (fork bombs included); as root
  the code runs as uid/gid 65534, which makes RLIMIT_NPROC bite and the service's files unreadable.
- `process` (fallback): a plain child in a new session (the whole process group is killed), an
  empty environment, cwd in the temp dir, and the runner's guards (no sockets, no fork/exec, no
  files outside the temp dir: best effort against deliberate escapes).

Always: rlimits (CPU, address space, file size, processes, core 0), a wall-clock timeout, an
empty environment (no ROLLMESH_API_KEY), output kept up to a cap (the rest is dropped), and a
semaphore bounding concurrent runs. Spawning uses asyncio subprocesses; nothing blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rollmesh.mesh.config import ConfigError
from rollmesh.mesh.logging import get_logger
from rollmesh.verifier.config import SandboxConfig, SandboxLimits

log = get_logger("rollmesh.verifier.sandbox")

RUNNER = Path(__file__).with_name("_sandbox_runner.py")
SANDBOX_UID = 65534
_TAIL_BYTES = 64 * 1024
_CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/sandbox"}

# Runs as root inside the new namespaces; builds the chroot and drops privileges.
_NS_SCRIPT = r"""
set -e
R=$1; W=$2; PFX=$3; PY=$4; DROP=$5
mount -t tmpfs -o size=4m,mode=755 sbxroot "$R"
for d in usr bin sbin lib lib32 lib64; do
  if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$R/$d"
  elif [ -d "/$d" ]; then
    mkdir "$R/$d"; mount --rbind "/$d" "$R/$d"; mount -o remount,bind,ro "$R/$d" 2>/dev/null || true
  fi
done
case "$PFX" in
  /usr/*|/usr) ;;
  *) mkdir -p "$R$PFX"; mount --rbind "$PFX" "$R$PFX"
     mount -o remount,bind,ro "$R$PFX" 2>/dev/null || true ;;
esac
mkdir -p "$R/sandbox" "$R/dev"
mount --bind "$W" "$R/sandbox"
for n in null zero urandom random; do
  touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"
done
if [ "$DROP" = 1 ]; then
  exec chroot --userspec=65534:65534 "$R" /bin/sh -c 'cd /sandbox && exec "$0" -I -S -B runner.py' "$PY"
fi
exec chroot "$R" /bin/sh -c 'cd /sandbox && exec "$0" -I -S -B runner.py' "$PY"
"""


@dataclass(frozen=True)
class TestSpec:
    """`asserts`: each case is Python source run after the solution (shared globals).
    `io`: each case is {"input", "output"}; the solution runs as __main__ with that stdin."""

    __test__ = False  # not a pytest class

    kind: str
    cases: list[Any]


@dataclass
class RunResult:
    status: str  # "ok", "timeout", "crashed" (no result line), "error" (sandbox failed to start)
    passed: int = 0
    total: int = 0
    cases: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output_truncated: bool = False
    duration_s: float = 0.0
    isolation: str = ""

    def summary(self, max_chars: int = 2000) -> dict[str, Any]:
        out = asdict(self)
        out["stdout"] = self.stdout[:max_chars]
        out["stderr"] = self.stderr[-max_chars:]
        return out


async def _drain(stream: asyncio.StreamReader | None, cap: int) -> tuple[bytes, bytes, bool]:
    """Read to EOF keeping the first `cap` bytes and the last 64 KiB; the rest is dropped."""
    head, tail, total = bytearray(), bytearray(), 0
    if stream is None:
        return b"", b"", False
    while chunk := await stream.read(1 << 16):
        total += len(chunk)
        if len(head) < cap:
            take = cap - len(head)
            head += chunk[:take]
            chunk = chunk[take:]
        if chunk:
            tail += chunk
            del tail[:-_TAIL_BYTES]
    return bytes(head), bytes(tail), total > cap


class Sandbox:
    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.isolation = "process" if config.isolation == "process" else ""
        self._slots = asyncio.Semaphore(config.concurrency)
        self._drop_privileges = os.geteuid() == 0
        self.runs = 0

    # -- isolation probe ------------------------------------------------------------------------------

    async def start(self) -> str:
        """Decide the isolation mode (probing the kernel) and log it. Idempotent."""
        if self.isolation:
            return self.isolation
        ok, why = await self._probe()
        if ok:
            self.isolation = "namespaces"
        elif self.config.isolation == "namespaces":
            raise ConfigError(
                f"ROLLMESH_VERIFIER_SANDBOX_ISOLATION=namespaces but the kernel refused: {why}; "
                "use auto or process"
            )
        else:
            self.isolation = "process"
        log.info(
            "sandbox_isolation",
            mode=self.isolation,
            probe_error=why or None,
            uid=SANDBOX_UID if self.isolation == "namespaces" and self._drop_privileges else os.geteuid(),
            limits=asdict(self.config.limits),
        )
        return self.isolation

    async def _probe(self) -> tuple[bool, str]:
        if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
            return False, "unshare(1) not available"
        limits = replace(self.config.limits, wall_s=20.0, cpu_s=10)
        try:
            res = await self._run_once("x = 1", TestSpec("asserts", ["assert x == 1"]), limits, "namespaces")
        except OSError as exc:
            return False, str(exc)
        if res.status == "ok" and res.passed == 1:
            return True, ""
        return False, (res.error or res.stderr.strip() or res.status)[-300:]

    # -- runs -----------------------------------------------------------------------------------------

    async def run(
        self, code: str, tests: TestSpec, *, limits: SandboxLimits | None = None, guards: bool = True
    ) -> RunResult:
        """Run `code` against `tests` under the limits; never raises for anything the code does."""
        mode = await self.start()
        async with self._slots:
            self.runs += 1
            return await self._run_once(code, tests, limits or self.config.limits, mode, guards=guards)

    def _command(self, mode: str, root: Path, work: Path) -> list[str]:
        py = os.path.realpath(sys._base_executable if hasattr(sys, "_base_executable") else sys.executable)
        if mode == "process":
            return [py, "-I", "-S", "-B", "runner.py"]
        prefix = os.path.realpath(sys.base_prefix)
        flags = ["--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
        if os.geteuid() != 0:
            flags[:0] = ["--user", "--map-root-user"]
        drop = "1" if self._drop_privileges else "0"
        return [
            "unshare",
            *flags,
            "--",
            "/bin/sh",
            "-c",
            _NS_SCRIPT,
            "sh",
            str(root),
            str(work),
            prefix,
            py,
            drop,
        ]

    async def _run_once(
        self, code: str, tests: TestSpec, limits: SandboxLimits, mode: str, *, guards: bool = True
    ) -> RunResult:
        start = time.monotonic()
        base = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="rollmesh-sbx-"))
        try:
            work, root = base / "work", base / "root"
            await asyncio.to_thread(self._prepare, base, work, root, code, tests, mode)
            cap = limits.output_kb * 1024
            nonce = secrets.token_hex(16)
            proc = await asyncio.create_subprocess_exec(
                *self._command(mode, root, work),
                cwd=str(work),
                env=dict(_CLEAN_ENV),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            result = await self._supervise(proc, nonce, limits, cap, guards)
            result.isolation = mode
            result.duration_s = round(time.monotonic() - start, 4)
            return result
        finally:
            await asyncio.to_thread(shutil.rmtree, base, True)

    def _prepare(self, base: Path, work: Path, root: Path, code: str, tests: TestSpec, mode: str) -> None:
        work.mkdir()
        root.mkdir()
        (work / "solution.py").write_text(code, encoding="utf-8")
        (work / "tests.json").write_text(json.dumps({"kind": tests.kind, "cases": tests.cases}))
        shutil.copyfile(RUNNER, work / "runner.py")
        if mode == "namespaces" and self._drop_privileges:
            os.chown(work, SANDBOX_UID, SANDBOX_UID)
        elif mode == "process":
            os.chmod(base, 0o700)

    async def _supervise(
        self, proc: asyncio.subprocess.Process, nonce: str, limits: SandboxLimits, cap: int, guards: bool
    ) -> RunResult:
        header = {"nonce": nonce, "limits": asdict(limits), "guards": guards}
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write((json.dumps(header) + "\n").encode())
            await proc.stdin.drain()
            proc.stdin.close()
        readers = asyncio.gather(_drain(proc.stdout, cap), _drain(proc.stderr, cap))
        timed_out = False
        try:
            async with asyncio.timeout(limits.wall_s):
                await proc.wait()
        except TimeoutError:
            timed_out = True
        finally:
            self._kill(proc)
            await proc.wait()
        try:
            async with asyncio.timeout(2.0):
                (out_head, out_tail, out_trunc), (err_head, _, err_trunc) = await readers
        except TimeoutError:  # an escaped descendant still holds a pipe: give up on its output
            readers.cancel()
            out_head = out_tail = err_head = b""
            out_trunc = err_trunc = True
        stdout = _strip_result(out_head.decode(errors="replace"), nonce)
        result = RunResult(
            status="timeout" if timed_out else "crashed",
            exit_code=proc.returncode,
            stdout=stdout,
            stderr=err_head.decode(errors="replace"),
            output_truncated=out_trunc or err_trunc,
        )
        if timed_out:
            result.error = f"wall-clock limit of {limits.wall_s:g}s exceeded; process group killed"
            return result
        payload = _find_result(out_head + b"\n" + out_tail, nonce)
        if payload is None:
            code = proc.returncode or 0
            why = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            result.error = f"no result from the runner ({why})"
            return result
        result.status = "ok"
        result.passed = int(payload.get("passed", 0))
        result.total = int(payload.get("total", 0))
        result.cases = list(payload.get("cases", []))
        result.error = str(payload.get("error", ""))
        return result

    @staticmethod
    def _kill(proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()


def _find_result(data: bytes, nonce: str) -> dict[str, Any] | None:
    marker = nonce.encode()
    idx = data.rfind(marker)
    if idx < 0:
        return None
    line = data[idx + len(marker) :].split(b"\n", 1)[0]
    try:
        payload = json.loads(line)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def _strip_result(text: str, nonce: str) -> str:
    """The code's own output, without the runner's result line."""
    idx = text.rfind(nonce)
    return text if idx < 0 else text[:idx]
