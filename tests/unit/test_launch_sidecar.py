"""The sidecar supervisor (launch/sidecar.py) on a real child process: ready through its port file
and health, BROKEN while down after a SIGKILL, restarted on the same address, a start failure in
one line naming the interpreter and the log, and nothing left running after stop."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from rollmesh.launch.errors import SidecarStartFailed
from rollmesh.launch.restart import RestartPolicy
from rollmesh.launch.sidecar import Sidecar
from rollmesh.launch.sidecar import SidecarSpec
from rollmesh.launch.sidecar import State

SERVER = textwrap.dedent(
    """
    import http.server, os, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(str(os.getpid()).encode())
        def log_message(self, *a): pass
    srv = http.server.HTTPServer(("127.0.0.1", int(os.environ["ROLLMESH_SIDECAR_PORT"])), H)
    print("serving", flush=True)
    with open(os.environ["ROLLMESH_PORT_FILE"], "w") as f:
        f.write(f"127.0.0.1:{srv.server_port}")
    srv.serve_forever()
    """
)


async def http_ok(address: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://{address}/") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


def spec(tmp_path: Path, source: str, start_timeout_s: float = 60) -> SidecarSpec:
    script = tmp_path / "server.py"
    script.write_text(source)
    return SidecarSpec(
        name="test server",
        argv=(sys.executable, str(script)),
        log_path=tmp_path / "server.log",
        port_file=tmp_path / "server.addr",
        probe=http_ok,
        env=dict(os.environ),
        restart=RestartPolicy(mode="always", max_restarts=3, window_s=60, backoff_s=0.05),
        start_timeout_s=start_timeout_s,
    )


async def test_a_killed_sidecar_is_broken_then_back_on_its_address(tmp_path: Path) -> None:
    car = Sidecar(spec(tmp_path, SERVER))
    await car.start()
    try:
        address, pid = car.address, car.pid
        assert car.state is State.SERVING and await http_ok(address)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        async with asyncio.timeout(60):
            while car.state is State.SERVING:  # noqa: ASYNC110 (the supervisor task sets it)
                await asyncio.sleep(0.01)
        assert car.state is State.BROKEN and "was killed by signal SIGKILL" in car.problem
        assert await car.ready(60)
        assert car.address == address and car.pid != pid and car.restarts == 1 and car.problem == ""
        assert await http_ok(address)
    finally:
        await car.stop()
    assert car.state is State.STOPPED and not await http_ok(address)
    assert (tmp_path / "server.log").read_text().count("serving") == 2


async def test_a_new_life_is_counted_before_the_restarted_server_answers(tmp_path: Path) -> None:
    """A session kept from the old server must never pass for the new one's: `incarnation` moves when
    the old process is seen dead, before the new one is started, while `restarts` counts a restart
    only once the new one has served (a bridge's call reached the new server in between: a reward
    from a server without the session's state, seen as a flaky NeMo Gym job test)."""
    seen: list[tuple[int, int]] = []  # (incarnation, restarts) whenever the server answers the probe
    car: Sidecar | None = None

    async def probe(address: str) -> bool:
        ok = await http_ok(address)
        if ok and car is not None:
            seen.append((car.incarnation, car.restarts))
        return ok

    car = Sidecar(replace(spec(tmp_path, SERVER), probe=probe))
    await car.start()
    try:
        assert (car.incarnation, car.restarts) == (0, 0)
        pid = car.pid
        assert pid is not None
        seen.clear()
        os.kill(pid, signal.SIGKILL)
        async with asyncio.timeout(60):
            while car.restarts == 0:  # noqa: ASYNC110 (the supervisor task counts it)
                await asyncio.sleep(0.01)
        assert seen and seen[0] == (1, 0), "the new server answered while its life was not yet counted"
        assert (car.incarnation, car.restarts) == (1, 1)
    finally:
        await car.stop()


async def test_a_sidecar_that_cannot_start_fails_in_one_line(tmp_path: Path) -> None:
    car = Sidecar(spec(tmp_path, "import no_such_module_anywhere\n"))
    with pytest.raises(SidecarStartFailed) as err:
        await car.start()
    msg = err.value.message
    assert "\n" not in msg and sys.executable in msg and "test server" in msg
    assert "exited with code 1" in msg and "No module named 'no_such_module_anywhere'" in msg
    assert str(tmp_path / "server.log") in msg
    assert car.state is State.BROKEN
    await car.stop()


async def test_a_sidecar_that_never_serves_is_killed_at_its_timeout(tmp_path: Path) -> None:
    car = Sidecar(spec(tmp_path, "import time\nprint('thinking', flush=True)\ntime.sleep(600)\n", 5.0))
    with pytest.raises(SidecarStartFailed) as err:
        await car.start()
    assert "did not serve within 5s" in err.value.message and "last log line: thinking" in err.value.message
    pid = car.pid
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    await car.stop()


CONFINED_SERVER = textwrap.dedent(
    """
    import http.server, json, os, subprocess, sys
    def attempt(path):
        try:
            with open(path, "w") as f:
                f.write("x")
            return "wrote"
        except OSError as exc:
            return exc.strerror
    child = subprocess.Popen(["sleep", "600"])  # must not outlive the server's stop
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen = {
                "uid": os.getuid(), "pid": os.getpid(), "ppid": os.getppid(), "child_pid": child.pid,
                "home": attempt(os.path.join(os.environ["HOME"], "ok")),
                "shared": attempt(os.path.join(sys.argv[1], "planted")),
                "root": sorted(os.listdir("/root")),
            }
            self.send_response(200); self.end_headers(); self.wfile.write(json.dumps(seen).encode())
        def log_message(self, *a): pass
    srv = http.server.HTTPServer(("127.0.0.1", int(os.environ["ROLLMESH_SIDECAR_PORT"])), H)
    with open(os.environ["ROLLMESH_PORT_FILE"], "w") as f:
        f.write(f"127.0.0.1:{srv.server_port}")
    srv.serve_forever()
    """
)


async def seen_by(address: str) -> dict[str, object]:
    async with aiohttp.ClientSession() as s, s.get(f"http://{address}/") as r:
        return dict(await r.json(content_type=None))


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid and namespaces of its own need root")
async def test_a_confined_sidecar_runs_as_its_own_uid_under_an_init_and_writes_only_its_folder(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"  # writable by anyone on the host; only readable for the server
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    base = spec(tmp_path, CONFINED_SERVER)
    car = Sidecar(
        SidecarSpec(
            **{
                **base.__dict__,
                "argv": (*base.argv, str(shared)),
                "confine": True,
                "readable": (str(shared),),
            }
        )
    )
    await car.start()
    try:
        seen = await seen_by(car.address)
        assert car.isolation == "uid+mount+pid" and (tmp_path / "server.addr").read_text() == car.address
        assert isinstance(seen["uid"], int) and 65000 <= seen["uid"] <= 65533
        # pid 2 of a namespace of its own, under its minimal init (pid 1)
        assert (seen["pid"], seen["ppid"]) == (2, 1) and seen["child_pid"] not in (1, 2)
        assert seen["home"] == "wrote" and seen["shared"] == "Read-only file system"
        assert not (shared / "planted").exists()
        assert seen["root"] == [".pyenv"] or str(Path.home()) != "/root"  # only its interpreter there
        keeper = car.pid
        assert keeper is not None
        os.kill(keeper, signal.SIGKILL)  # the keeper outside: the namespace dies with it
        async with asyncio.timeout(60):
            while car.state is State.SERVING:  # noqa: ASYNC110 (the supervisor task sets it)
                await asyncio.sleep(0.01)
        assert await car.ready(60) and car.restarts == 1
        again = await seen_by(car.address)
        assert again["uid"] == seen["uid"] and again["pid"] == 2
        await group_gone(keeper)  # the first incarnation: the server and its child
    finally:
        await car.stop()
    assert car.pid is not None
    await group_gone(car.pid)


async def group_gone(pgid: int) -> None:
    """Wait (up to 30 s) until no process of the group is left (a pid namespace is torn down, and
    its processes reaped, after its keeper is gone)."""
    async with asyncio.timeout(30):
        while True:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            await asyncio.sleep(0.02)


async def test_a_sidecar_confined_without_a_uid_says_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not root (no uid to lease): the server runs as this user, under rlimits, and says so."""
    from rollmesh.mesh.confine import UidLeases

    async def no_uid(self: UidLeases) -> None:
        return None

    monkeypatch.setattr(UidLeases, "lease", no_uid)
    base = spec(tmp_path, CONFINED_SERVER)
    car = Sidecar(SidecarSpec(**{**base.__dict__, "argv": (*base.argv, str(tmp_path)), "confine": True}))
    await car.start()
    try:
        seen = await seen_by(car.address)
        assert car.isolation == "limits" and seen["uid"] == os.getuid() and seen["pid"] == car.pid
    finally:
        await car.stop()
