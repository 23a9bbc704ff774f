"""Serve one NeMo Gym resources server on loopback, without `ng_run`.

Run by the verifier (verifier/bridges/nemo_gym.py) with the interpreter of a NeMo Gym installation, never
with rollmesh's own: it imports nothing of rollmesh, only the standard library, nemo_gym and what
the server needs. The job comes in ROLLMESH_NEMO_GYM_SERVER (JSON):

    {"server": "example_single_tool_call",    # resources_servers/<server>
     "server_dir": "",                         # or a folder of the user's own (holds app.py, configs/)
     "config": "",                             # its NeMo Gym YAML (default configs/<server>.yaml)
     "instance": "",                           # the YAML's top-level key (default: the first one
                                               # holding resources_servers.<server>)
     "overrides": {}}                          # fields set over the YAML's server config

It binds 127.0.0.1:$ROLLMESH_SIDECAR_PORT (0: any free port; $ROLLMESH_NEMO_GYM_HOST instead of
127.0.0.1 where the server is a container of its own: the compose stack's `nemo-gym` service), writes
`<host>:<port>` to $ROLLMESH_PORT_FILE when set, builds the server class the way NeMo Gym's
`run_webserver` does (its config validated from the YAML, the session middleware, liveness at GET /,
the exception middleware) and serves it with uvicorn on that socket. The server's own folder, and the root its
`resources_servers.<server>` imports need, are importable. Errors go to stderr (the sidecar's log)
and exit 1.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any


def _server_dir(job: dict[str, Any]) -> Path:
    if job.get("server_dir"):
        return Path(job["server_dir"]).resolve()
    found = importlib.util.find_spec(f"resources_servers.{job['server']}")
    if found is None or not found.submodule_search_locations:
        raise SystemExit(
            f"no resources server {job['server']!r} in this NeMo Gym installation ({sys.executable})"
        )
    return Path(next(iter(found.submodule_search_locations))).resolve()


def _instance(job: dict[str, Any], folder: Path) -> tuple[str, dict[str, Any]]:
    """The server's instance name and config: from `config` when given, else configs/<server>.yaml,
    else the first YAML of configs/ that configures it (several name one server: structured_outputs)."""
    from omegaconf import OmegaConf  # type: ignore[import-not-found]

    if job.get("config"):
        given = Path(job["config"])
        paths = [given if given.is_absolute() else folder / given]
    else:
        default = folder / "configs" / f"{job['server']}.yaml"
        paths = [default] if default.is_file() else sorted((folder / "configs").glob("*.yaml"))
    for path in paths:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        for name, value in raw.items() if isinstance(raw, dict) else ():
            servers = value.get("resources_servers") if isinstance(value, dict) else None
            if not isinstance(servers, dict) or (job.get("instance") and name != job["instance"]):
                continue
            for server_name, cfg in servers.items():
                if server_name == job["server"] or job.get("server_dir"):
                    return str(name), dict(cfg) | dict(job.get("overrides") or {})
    where = ", ".join(str(p) for p in paths) or f"{folder / 'configs'} (no YAML)"
    raise SystemExit(f"no config of resources server {job['server']!r} in {where}")


def _server_class(module: Any) -> Any:
    from nemo_gym.server_utils import SimpleServer  # type: ignore[import-not-found]

    own = [
        c
        for c in vars(module).values()
        if inspect.isclass(c)
        and issubclass(c, SimpleServer)
        and c.__module__ == module.__name__
        and not inspect.isabstract(c)
    ]
    leaves = [c for c in own if not any(o is not c and issubclass(o, c) for o in own)]
    if len(leaves) != 1:
        names = ", ".join(c.__name__ for c in leaves) or "none"
        raise SystemExit(f"{module.__file__}: expected one resources server class, found {names}")
    return leaves[0]


def main() -> None:
    job = json.loads(os.environ["ROLLMESH_NEMO_GYM_SERVER"])
    folder = _server_dir(job)
    roots = [folder]
    if folder.parent.name == "resources_servers":
        roots.append(folder.parent.parent)
    for root in roots:
        sys.path.insert(0, str(root))
    name, cfg = _instance(job, folder)
    entry = str(cfg.get("entrypoint") or "app.py")

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    host = os.environ.get("ROLLMESH_NEMO_GYM_HOST") or "127.0.0.1"
    sock.bind((host, int(os.environ.get("ROLLMESH_SIDECAR_PORT") or 0)))
    sock.listen(2048)
    port = sock.getsockname()[1]
    cfg |= {"host": host, "port": port, "name": name, "entrypoint": entry}
    head = {"host": "127.0.0.1", "port": 0}
    global_config = {name: {"resources_servers": {job["server"]: cfg}}, "head_server": head, "dry_run": False}
    os.environ["NEMO_GYM_CONFIG_DICT"] = json.dumps(global_config)
    os.environ["NEMO_GYM_CONFIG_PATH"] = name

    if folder.parent.name == "resources_servers":
        module = importlib.import_module(f"resources_servers.{folder.name}.{entry.removesuffix('.py')}")
    else:
        spec = importlib.util.spec_from_file_location("rollmesh_nemo_gym_app", folder / entry)
        if spec is None or spec.loader is None:
            raise SystemExit(f"cannot import {folder / entry}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    cls = _server_class(module)

    import uvicorn
    from nemo_gym.config_types import BaseServerConfig  # type: ignore[import-not-found]
    from nemo_gym.server_utils import ServerClient  # type: ignore[import-not-found]
    from omegaconf import OmegaConf  # type: ignore[import-not-found]

    config = cls.model_fields["config"].annotation.model_validate(cfg)
    client = ServerClient(
        head_server_config=BaseServerConfig(**head), global_config_dict=OmegaConf.create(global_config)
    )
    server = cls(config=config, server_client=client)
    # The steps of NeMo Gym's own run_webserver, those a version has (0.7 added telemetry, MCP
    # exposure and cancellation): the server behaves as under ng_run.
    if hasattr(server, "setup_telemetry"):
        server.setup_telemetry()
    app = server.setup_webserver()
    if getattr(config, "expose_tools_over_mcp", False):
        from nemo_gym.mcp_auto_exposure import maybe_auto_expose  # type: ignore[import-not-found]

        maybe_auto_expose(server, app)
    server.setup_liveness(app)
    for step in (
        "setup_exception_middleware",
        "setup_cancellation_middleware",
        "instrument_app_for_telemetry",
    ):
        if hasattr(server, step):
            getattr(server, step)(app)

    if os.environ.get("ROLLMESH_PORT_FILE"):
        port_file = Path(os.environ["ROLLMESH_PORT_FILE"])
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(f"{host}:{port}\n")
        tmp.rename(port_file)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1)).run(sockets=[sock])


if __name__ == "__main__":
    main()
