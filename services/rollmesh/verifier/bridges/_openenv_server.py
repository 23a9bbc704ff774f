"""Serve one OpenEnv environment's app on loopback, as its Dockerfile does (`cd env && uvicorn
server.app:app`) but on a port of the verifier's choosing.

Run by the verifier (verifier/bridges/openenv_env.py) with the interpreter of an OpenEnv virtualenv,
never with rollmesh's own: it imports nothing of rollmesh, only the standard library, uvicorn, PyYAML
(both openenv-core's) and the app. The job comes in ROLLMESH_OPENENV_APP (JSON):

    {"env_dir": "/path/my_env",   # an OpenEnv environment folder: made the working directory and put
                                  # first on sys.path; its openenv.yaml's `app` is served unless
     "app": ""}                   # `app` ("module:attribute") names the app (an installed package's)

It binds 127.0.0.1:$ROLLMESH_SIDECAR_PORT (0: any free port), writes `127.0.0.1:<port>` to
$ROLLMESH_PORT_FILE when set, and serves the app with uvicorn on that socket. Errors go to stderr
(the sidecar's log) and exit 1.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any


def _app_path(job: dict[str, Any]) -> str:
    if job.get("app"):
        return str(job["app"])
    manifest = Path(job["env_dir"]) / "openenv.yaml"
    import yaml

    try:
        app = (yaml.safe_load(manifest.read_text()) or {}).get("app")
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"cannot read {manifest}: {exc}") from None
    if not isinstance(app, str) or ":" not in app:
        raise SystemExit(f"{manifest} names no app (`app: module:attribute`, e.g. server.app:app)")
    return app


def main() -> None:
    job = json.loads(os.environ["ROLLMESH_OPENENV_APP"])
    if job.get("env_dir"):
        os.chdir(job["env_dir"])
        sys.path.insert(0, str(Path(job["env_dir"]).resolve()))
    module_name, _, attribute = _app_path(job).partition(":")
    app = getattr(importlib.import_module(module_name), attribute or "app", None)
    if app is None:
        raise SystemExit(f"module {module_name!r} has no attribute {attribute!r}")

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(os.environ.get("ROLLMESH_SIDECAR_PORT") or 0)))
    sock.listen(2048)
    port = sock.getsockname()[1]
    if os.environ.get("ROLLMESH_PORT_FILE"):
        port_file = Path(os.environ["ROLLMESH_PORT_FILE"])
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(f"127.0.0.1:{port}\n")
        tmp.rename(port_file)

    import uvicorn

    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, ws_max_size=64 << 20)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
