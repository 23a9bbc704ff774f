"""deploy/local-docker.sh, run for real against fake `docker`, `dockerd`, `debootstrap`, `apt-get`,
`docker-compose`, `curl`, `dpkg-deb`, `python3` (pip config) and `id` on PATH, each recording how it
was called:

- no daemon reachable: nothing installed that is present, a private dockerd started with the
  options this machine kind needs (no iptables, no default bridge, its own data/exec roots and
  socket), the base image made once with debootstrap and `docker import`, pip's find-links wheels
  and CA bundle copied into the build context, and `export` lines for eval on stdout only;
- Compose v2 missing: trixie's docker-compose package fetched from the mirror once, its plugin
  unpacked into the cache and linked into the plugin folder; `docker compose` is what it exports;
- a second run reuses the running daemon, the cached base image and the cached plugin;
- a daemon that is already reachable is used as it is: nothing started, no local base image;
- a dockerd that never answers fails within its bound; a non-root user gets exit 2.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "local-docker.sh"
MIRROR = "http://mirror.invalid/debian"

FAKES = {
    "docker": r"""#!/bin/sh
echo "docker $*" >> "$FAKE_STATE/calls"
case "$1" in
  info) test -f "$FAKE_STATE/daemon" && [ "$(cat "$FAKE_STATE/daemon")" = "${DOCKER_HOST:-}" ] ;;
  image) grep -qxF "$3" "$FAKE_STATE/images" 2>/dev/null ;;
  import) cat > "$FAKE_STATE/imported.tar"; echo "$*" >> "$FAKE_STATE/imported"
          eval "tag=\${$#}"; echo "$tag" >> "$FAKE_STATE/images"; echo sha256:0 ;;
  version) echo 20.10.24-fake ;;
  compose) plugin="$ROLLMESH_DOCKER_PLUGIN_DIR/docker-compose"
           test -x "$plugin" && "$plugin" "$@" ;;
  *) exit 1 ;;
esac
""",
    "dockerd": r"""#!/bin/sh
echo "$*" >> "$FAKE_STATE/dockerd.calls"
[ -n "${FAKE_DOCKERD_HANGS:-}" ] && exit 0
while [ $# -gt 0 ]; do
  if [ "$1" = "-H" ]; then printf '%s' "$2" > "$FAKE_STATE/daemon"; fi
  shift
done
""",
    "debootstrap": r"""#!/bin/sh
echo "$*" >> "$FAKE_STATE/debootstrap.calls"
eval "target=\${$(($# - 1))}"
mkdir -p "$target/usr/bin" "$target/var/cache/apt/archives"
echo '#!/bin/sh' > "$target/usr/bin/python3"
touch "$target/var/cache/apt/archives/python3.deb"
""",
    "apt-get": """#!/bin/sh
echo "apt-get $*" >> "$FAKE_STATE/calls"
exit 1
""",
    "docker-compose": """#!/bin/sh
echo "docker-compose version 1.29.2"
""",
    # The mirror: its trixie package index names the package; the package is whatever dpkg-deb reads.
    "curl": r"""#!/bin/sh
echo "curl $*" >> "$FAKE_STATE/calls"
eval "url=\${$#}"
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
case "$url" in
  */dists/trixie/main/binary-*/Packages.xz)
    { printf 'Package: docker\nFilename: pool/main/d/docker/docker_1_amd64.deb\n\n'
      printf 'Package: docker-compose\nVersion: 2.26.1-4\n'
      printf 'Filename: pool/main/d/docker-compose/docker-compose_2.26.1-4_amd64.deb\n\n'; } | xz > "$out" ;;
  */pool/main/d/docker-compose/docker-compose_2.26.1-4_amd64.deb) echo deb > "$out" ;;
  *) exit 22 ;;
esac
""",
    "dpkg-deb": r"""#!/bin/sh
[ "$1" = "--fsys-tarfile" ] && [ "$(cat "$2")" = deb ] || exit 2
root="$FAKE_STATE/deb-root"
mkdir -p "$root/usr/libexec/docker/cli-plugins"
printf '#!/bin/sh\necho "Docker Compose version 2.26.1-fake"\n' \
  > "$root/usr/libexec/docker/cli-plugins/docker-compose"
tar -C "$root" -c ./usr
""",
    "python3": """#!/bin/sh
[ "$*" = "-m pip config list" ] && cat "$FAKE_STATE/pip-config"
""",
    "id": """#!/bin/sh
echo "${FAKE_UID:-0}"
""",
}


def _arch() -> str:
    return subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()


@dataclass
class Machine:
    """A fake machine: PATH with the fakes, the script's folders, and what the fakes recorded."""

    tmp: Path
    state: Path
    env: dict[str, str]

    def run(self, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(SCRIPT)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def lines(self, name: str) -> list[str]:
        path = self.state / name
        return path.read_text().splitlines() if path.exists() else []

    @property
    def root(self) -> Path:
        return self.tmp / "root"

    @property
    def socket(self) -> str:
        return f"unix://{self.tmp / 'run' / 'docker.sock'}"


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    links = tmp_path / "find-links"
    links.mkdir()
    (links / "torch-2.0+cpu-cp311-none-any.whl").write_bytes(b"wheel")
    ca = tmp_path / "proxy-ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n")
    (state / "pip-config").write_text(f"global.find-links='{links}'\nglobal.cert='{ca}'\n")
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR")}
    env = {
        **keep,
        "PATH": f"{bin_dir}:/usr/bin:/bin:/usr/sbin:/sbin",
        "FAKE_STATE": str(state),
        "ROLLMESH_DOCKER_ROOT": str(tmp_path / "root"),
        "ROLLMESH_DOCKER_RUN": str(tmp_path / "run"),
        "ROLLMESH_DOCKER_STORAGE_DRIVER": "vfs",
        "ROLLMESH_DOCKERD_WAIT_S": "20",
        "ROLLMESH_WHEELS_DIR": str(tmp_path / "context" / "wheels"),
        "ROLLMESH_CERTS_DIR": str(tmp_path / "context" / "certs"),
        "DEBIAN_MIRROR": MIRROR,
        "ROLLMESH_DOCKER_PLUGIN_DIR": str(tmp_path / "cli-plugins"),
    }
    return Machine(tmp_path, state, env)


def exports(stdout: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        assert line.startswith("export "), f"stdout must hold only export lines, got {line!r}"
        key, _, value = line.removeprefix("export ").partition("=")
        out[key] = value.strip("'")
    return out


def test_without_a_daemon_it_starts_a_private_one_and_makes_the_base_image_once(machine: Machine) -> None:
    first = machine.run()
    assert first.returncode == 0, first.stderr
    assert exports(first.stdout) == {
        "BASE_IMAGE": "rollmesh-base:bookworm",
        "NEMO_GYM_BASE_IMAGE": "rollmesh-base:trixie",  # the nemo-gym service's base (Python >= 3.12)
        "DOCKER_HOST": machine.socket,
        "ROLLMESH_COMPOSE": "docker compose",
    }
    (dockerd,) = machine.lines("dockerd.calls")
    args = dockerd.split()
    for flag in ("--iptables=false", "--bridge=none", "--storage-driver=vfs"):
        assert flag in args, dockerd
    assert args[args.index("--data-root") + 1] == str(machine.root / "data")
    assert args[args.index("--exec-root") + 1] == str(machine.tmp / "run" / "exec")
    assert args[args.index("-H") + 1] == machine.socket
    debootstraps = machine.lines("debootstrap.calls")
    assert [call.split()[2] for call in debootstraps] == ["bookworm", "trixie"]
    for debootstrap in debootstraps:
        boot = debootstrap.split()
        assert boot[:2] == ["--variant=minbase", "--include=python3,python3-venv,python3-pip,ca-certificates"]
        assert boot[4] == MIRROR
        assert not Path(boot[3]).exists(), "the rootfs folder is removed after the import"
    imported = machine.lines("imported")
    assert "rollmesh-base:bookworm" in imported[0].split() and "rollmesh-base:trixie" in imported[1].split()
    with tarfile.open(machine.state / "imported.tar") as tar:
        names = tar.getnames()
    assert "./usr/bin/python3" in names
    assert not [n for n in names if n.endswith(".deb")], "apt's package cache is not imported"
    context = machine.tmp / "context"
    assert (context / "wheels" / "torch-2.0+cpu-cp311-none-any.whl").read_bytes() == b"wheel"
    assert "BEGIN CERTIFICATE" in (context / "certs" / "host-ca-bundle.crt").read_text()
    assert not [c for c in machine.lines("calls") if c.startswith("apt-get")], "nothing was missing"
    fetched = [c.split()[-1] for c in machine.lines("calls") if c.startswith("curl")]
    assert fetched == [
        f"{MIRROR}/dists/trixie/main/binary-{_arch()}/Packages.xz",
        f"{MIRROR}/pool/main/d/docker-compose/docker-compose_2.26.1-4_amd64.deb",
    ]
    plugin = machine.tmp / "cli-plugins" / "docker-compose"
    assert plugin.resolve() == machine.root / "compose-v2" / "docker-compose"
    assert not [p.name for p in (machine.root / "compose-v2").iterdir() if p.name != "docker-compose"]

    second = machine.run()
    assert second.returncode == 0, second.stderr
    assert exports(second.stdout) == exports(first.stdout)
    assert len(machine.lines("dockerd.calls")) == 1, "the running private daemon is reused"
    assert len(machine.lines("debootstrap.calls")) == 2, "the base images are cached"
    assert "is cached" in second.stderr
    assert len([c for c in machine.lines("calls") if c.startswith("curl")]) == 2, "the plugin is cached"


def test_a_reachable_daemon_is_used_as_it_is(machine: Machine) -> None:
    (machine.state / "daemon").write_text("unix:///var/run/elsewhere.sock")
    machine.env["DOCKER_HOST"] = "unix:///var/run/elsewhere.sock"
    res = machine.run()
    assert res.returncode == 0, res.stderr
    assert exports(res.stdout) == {
        "DOCKER_HOST": "unix:///var/run/elsewhere.sock",
        "ROLLMESH_COMPOSE": "docker compose",
    }
    assert not machine.lines("dockerd.calls") and not machine.lines("debootstrap.calls")


def test_not_root_with_compose_v1_uses_it_and_says_what_v2_adds(machine: Machine) -> None:
    (machine.state / "daemon").write_text("unix:///var/run/elsewhere.sock")
    machine.env["DOCKER_HOST"] = "unix:///var/run/elsewhere.sock"
    machine.env["FAKE_UID"] = "1000"
    res = machine.run()
    assert res.returncode == 0, res.stderr
    assert exports(res.stdout)["ROLLMESH_COMPOSE"] == "docker-compose"
    assert "run as root once to add Compose v2" in res.stderr
    assert not [c for c in machine.lines("calls") if c.startswith("curl")]


def test_a_dockerd_that_never_answers_fails_within_its_bound(machine: Machine) -> None:
    machine.env["FAKE_DOCKERD_HANGS"] = "1"
    machine.env["ROLLMESH_DOCKERD_WAIT_S"] = "2"
    started = time.monotonic()
    res = machine.run()
    assert res.returncode == 1
    assert "did not answer within 2s" in res.stderr
    assert time.monotonic() - started < 30
    assert res.stdout == ""


def test_a_non_root_user_is_told_and_nothing_is_started(machine: Machine) -> None:
    machine.env["FAKE_UID"] = "1000"
    res = machine.run()
    assert res.returncode == 2
    assert "must run as root to start dockerd" in res.stderr
    assert not machine.lines("dockerd.calls")


def test_the_script_parses() -> None:
    assert SCRIPT.stat().st_mode & 0o111, "local-docker.sh must be executable"
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
