"""NeMo Gym's own files, fetched from PyPI and cached, for the tests that run rollmesh on them.

    python scripts/nemo_gym.py data [--version 0.4.0]     # prints the folder holding resources_servers/

`data` downloads the nemo-gym wheel of that version (pure Python; no install, no interpreter of its
own needed) into the cache and unpacks its `resources_servers/` tree: each server's app.py, configs and
`data/example.jsonl` / `data/example_rollouts.jsonl` (the rows and the rewards NeMo Gym itself recorded).
Nothing of NeMo Gym's is committed to this repository: tests read it from here.

The cache is `$ROLLMESH_CACHE_DIR/nemo-gym/<version>/` (default `~/.cache/rollmesh`). Each step is
skipped when what it makes is there (a stamp file marks a finished unpack), runs under a file lock so
concurrent callers wait for one download, and unpacks into a temporary folder renamed into place, so
an interrupted run leaves nothing half-made. Exit status: 0 ready (the path on stdout), 1 a step failed
(one line on stderr says which).

    python scripts/nemo_gym.py venv [--version 0.4.0] [--server NAME ...]   # prints its interpreter

`venv` builds a virtualenv for running NeMo Gym's resources servers themselves (the bridge's managed
mode, verifier/bridges/nemo_gym.py, and the compose stack's `nemo-gym` image, deploy/Dockerfile.nemo-gym):
the interpreter NeMo Gym needs (pyenv's 3.12 for 0.2-0.4, a Debian forky root's 3.13 for 0.5-0.7;
see `python_for`), nemo-gym from the
cached wheel and each named server's own requirements.txt (the tested servers by default). nemo-gym
pins its own openai, ray and mlflow, so it never shares rollmesh's virtualenv. The venv is
`<cache>/<version>/venv/`: a stamp lists what is installed, a server whose requirements are missing
is added, and the lock makes concurrent callers wait for one build (an interrupted build is found
without its stamp and made again). Exit status 3: no interpreter of the version NeMo Gym needs on
this machine (the tests skip, naming it).

    python scripts/nemo_gym.py python [--version 0.7.0]   # prints an interpreter NeMo Gym can use

nemo-gym 0.5-0.7 needs Python >= 3.13.14, newer than pyenv's or bookworm's 3.13. `python` finds one
(`find_interpreter`), else takes Debian forky's python3.13 from a root debootstrapped once
(scripts/debian_root.py: as root, minutes; `venv` does the same), else (not root) builds one:
CPython's own source tarball, as Debian ships it in the python3.X source package of a newer suite
(`apt-get source --download-only` against a private sources list of unstable and testing: nothing
of the system's apt setup changes), configured and installed under `$ROLLMESH_CACHE_DIR/python/<version>/`
(a stamp marks a finished install; the build takes 15-50 minutes once, then `find_interpreter` finds
it). Exit status 3: no suite has a new enough package, or apt-get is not there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from debian_root import root_python  # type: ignore[import-not-found]
from venv_build import STAMP_BUILT  # type: ignore[import-not-found]
from venv_build import AssetError  # type: ignore[import-not-found]
from venv_build import NoInterpreter  # type: ignore[import-not-found]
from venv_build import build_venv  # type: ignore[import-not-found]
from venv_build import built_root  # type: ignore[import-not-found]
from venv_build import find_interpreter  # type: ignore[import-not-found]
from venv_build import locked  # type: ignore[import-not-found]
from venv_build import print_venv  # type: ignore[import-not-found]
from venv_build import run_step  # type: ignore[import-not-found]
from venv_build import version_key  # type: ignore[import-not-found]

__all__ = ["NemoGymAssetError", "NoInterpreter", "data", "find_python", "venv"]

DEFAULT_VERSION = "0.4.0"
# nemo-gym's Requires-Python: pip download checks it against the version it is told to target.
_TARGET_PYTHON = {"0.2": "3.12", "0.3": "3.12", "0.4": "3.12"}
_LATER_PYTHON = "3.13.14"
_SERVERS = "resources_servers/"


#: A step of fetching NeMo Gym's files failed; the message says which, in one line.
NemoGymAssetError = AssetError


def cache_root() -> Path:
    base = os.environ.get("ROLLMESH_CACHE_DIR") or str(Path.home() / ".cache" / "rollmesh")
    return Path(base) / "nemo-gym"


def target_python(version: str) -> str:
    return _TARGET_PYTHON.get(".".join(version.split(".")[:2]), _LATER_PYTHON)


def wheel(version: str) -> Path:
    """The nemo-gym wheel of `version`, downloaded once into the cache."""
    folder = cache_root() / version / "wheel"
    found = sorted(folder.glob("nemo_gym-*.whl"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(dir=cache_root() / version) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", target_python(version), f"nemo-gym=={version}", "-d", tmp,
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        got = sorted(Path(tmp).glob("nemo_gym-*.whl"))
        if done.returncode != 0 or not got:
            last = (done.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
            raise NemoGymAssetError(f"pip could not download nemo-gym=={version}: {last}")
        folder.mkdir(parents=True, exist_ok=True)
        return Path(shutil.move(str(got[0]), folder / got[0].name))


def data(version: str = DEFAULT_VERSION) -> Path:
    """The folder holding NeMo Gym `version`'s `resources_servers/` tree (fetched and unpacked once)."""
    root = cache_root() / version
    out = root / "src"
    stamp = out / ".unpacked"
    if stamp.exists():
        return out
    with locked(root / ".lock"):
        if stamp.exists():
            return out
        whl = wheel(version)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix="src-"))
        try:
            with zipfile.ZipFile(whl) as zf:
                members = [n for n in zf.namelist() if n.startswith(_SERVERS)]
                if not members:
                    raise NemoGymAssetError(f"{whl.name} has no {_SERVERS} folder")
                zf.extractall(tmp, members)
            (tmp / ".unpacked").write_text(whl.name + "\n")
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
        except (OSError, zipfile.BadZipFile) as exc:
            raise NemoGymAssetError(f"cannot unpack {whl}: {exc}") from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


# The servers the bridge's tests run (their requirements go into the venv by default).
TESTED_SERVERS = (
    "example_single_tool_call",
    "example_session_state_mgmt",
    "example_tool_call_multireward",
    "example_multi_step",
    "workplace_assistant",
    "math_advanced_calculations",
    "xlam_fc",
    "structured_outputs",
    "math_with_judge",
    "mcqa",
    "reasoning_gym",
    "example_multi_turn_gymnasium",
    "blackjack",
    "equivalence_rule",
    "format_verification",
    "arc_agi",
    "circle_count",
    "mrcr",
    "hotpotqa_qa",
    "bunsenbench_chemistry_mcq",
)


def find_python(version: str = DEFAULT_VERSION) -> Path:
    """An interpreter of the minor version nemo-gym `version` needs (`find_interpreter`)."""
    return Path(find_interpreter(target_python(version), f"nemo-gym=={version}"))


def python_for(version: str = DEFAULT_VERSION) -> Path:
    """`find_python(version)`; for a version that needs a later Python than pyenv's and Debian
    stable's, else the interpreter of a Debian root made once (scripts/debian_root.py; minutes)."""
    if target_python(version) != _LATER_PYTHON:
        return find_python(version)
    return Path(root_python(_LATER_PYTHON, f"nemo-gym=={version}"))


#: Debian suites whose source packages are searched for a newer CPython, newest first.
_SUITES = ("sid", "forky")


def build_python(want: str) -> Path:
    """`find_interpreter(want)`, else a Debian root's (scripts/debian_root.py: as root, minutes),
    else CPython >= `want` built from the upstream tarball in Debian's python3.X source package (see
    the module docstring). NoInterpreter when no suite has one."""
    minor = ".".join(want.split(".")[:2])
    try:
        return Path(root_python(want, f"CPython {want}"))
    except NoInterpreter:
        pass
    if shutil.which("apt-get") is None:
        raise NoInterpreter(f"no Python >= {want} here, and no apt-get to fetch its source with")
    with locked(built_root() / ".lock"), tempfile.TemporaryDirectory(prefix="rollmesh-cpython-") as tmp:
        try:
            return Path(find_interpreter(want, f"CPython {want}"))  # another caller built it meanwhile
        except NoInterpreter:
            pass
        work = Path(tmp)
        lines = [
            f"deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
            f"http://deb.debian.org/debian {suite} main"
            for suite in _SUITES
        ]
        (work / "sources.list").write_text("\n".join(lines) + "\n")
        for sub in ("lists/partial", "cache/archives/partial", "parts"):
            (work / sub).mkdir(parents=True)
        apt = [
            f"-oDir::Etc::SourceList={work / 'sources.list'}", f"-oDir::Etc::SourceParts={work / 'parts'}",
            f"-oDir::State::Lists={work / 'lists'}", f"-oDir::Cache={work / 'cache'}",
        ]  # fmt: skip
        run_step(["apt-get", *apt, "update"], work, f"apt-get update of Debian {'/'.join(_SUITES)} sources")
        listed = run_step(["apt-cache", *apt, "showsrc", f"python{minor}"], work, "apt-cache showsrc")
        versions = sorted(
            {ln.split()[1] for ln in listed.splitlines() if ln.startswith("Version: ")},
            key=lambda v: version_key(v.split("-")[0]),
            reverse=True,
        )
        good = [v for v in versions if version_key(v.split("-")[0]) >= version_key(want)]
        if not good:
            raise NoInterpreter(
                f"no Debian suite of {'/'.join(_SUITES)} has python{minor} >= {want} (found {versions})"
            )
        for version in good:  # the newest a mirror serves (an index can name one not yet there)
            try:
                run_step(["apt-get", *apt, "source", "--download-only", f"python{minor}={version}"], work, "")
                break
            except AssetError:
                continue
        else:
            raise AssetError(f"apt-get could download no python{minor} source of {good}")
        upstream = version.split("-")[0]
        run_step(
            ["tar", "xJf", f"python{minor}_{upstream}.orig.tar.xz"], work, "unpacking the CPython source"
        )
        src = work / f"Python-{upstream}"
        prefix = built_root() / upstream
        shutil.rmtree(prefix, ignore_errors=True)
        run_step(
            ["./configure", f"--prefix={prefix}", "--with-ensurepip=install"], src, "CPython's configure"
        )
        run_step(["make", f"-j{os.cpu_count() or 1}"], src, f"building CPython {upstream}")
        run_step(["make", "install"], src, f"installing CPython {upstream} into {prefix}")
        (prefix / STAMP_BUILT).write_text(f"python{minor} {version} (Debian source package)\n")
    return Path(find_interpreter(want, f"CPython {want}"))


def server_requirements(version: str, server: str) -> list[str]:
    """A server's own requirements.txt lines (nemo-gym itself and comments left out)."""
    path = data(version) / _SERVERS / server / "requirements.txt"
    if not path.is_file():
        raise NemoGymAssetError(f"nemo-gym=={version} has no resources server {server!r} ({path} missing)")
    lines = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
    return [
        ln for ln in lines if ln and not ln.startswith("-") and "nemo-gym" not in ln and "nemo_gym" not in ln
    ]


def venv(version: str = DEFAULT_VERSION, servers: tuple[str, ...] = TESTED_SERVERS) -> Path:
    """The interpreter of a virtualenv with nemo-gym `version` and `servers`' requirements (made,
    or completed, once; see the module docstring)."""
    return Path(
        build_venv(
            cache_root() / version / "venv",
            base=lambda: python_for(version),
            library=lambda: [str(wheel(version))],
            what=f"nemo-gym=={version}",
            key="servers",
            items=servers,
            requirements=lambda missing: sorted(
                {r for s in missing for r in server_requirements(version, s)}
            ),
            stamp_fields={"nemo_gym": version},
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_data = sub.add_parser("data", help="fetch and unpack NeMo Gym's resources_servers/ tree")
    p_data.add_argument("--version", default=DEFAULT_VERSION)
    p_venv = sub.add_parser("venv", help="build (once) a virtualenv that runs NeMo Gym's resources servers")
    p_venv.add_argument("--version", default=DEFAULT_VERSION)
    p_venv.add_argument(
        "--server", action="append", help="a server whose requirements to install (repeatable)"
    )
    p_python = sub.add_parser("python", help="find or build (once) the interpreter nemo-gym VERSION needs")
    p_python.add_argument("--version", default=DEFAULT_VERSION)
    args = parser.parse_args(argv)

    def made() -> Path:
        if args.command == "venv":
            return venv(args.version, tuple(args.server or TESTED_SERVERS))
        if args.command == "python":
            return build_python(target_python(args.version))
        return data(args.version)

    return int(print_venv("nemo_gym", made))


if __name__ == "__main__":
    sys.exit(main())
