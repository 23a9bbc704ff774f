"""Probe a Ray cluster from a node of it and print one JSON line (run by raylab.RayLab.probe).

probe.py ADDRESS nodes             -> {"node ip": {"CPU": 1.0, ...}} for alive nodes
probe.py ADDRESS replicas APP      -> {"replica id": "node ip"} for alive Serve replicas of APP
"""

from __future__ import annotations

import json
import logging
import sys

import ray


def main() -> None:
    address, what = sys.argv[1], sys.argv[2]
    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    out: object = {}
    if what == "nodes":
        out = {n["NodeManagerAddress"]: n["Resources"] for n in ray.nodes() if n["Alive"]}  # type: ignore[no-untyped-call]
    elif what == "replicas":
        replicas: dict[str, str] = {}
        prefix = f"SERVE_REPLICA::{sys.argv[3]}#"
        for actor in ray._private.state.actors().values():  # the GCS actor table, no dashboard needed
            name = actor.get("Name") or ""
            if name.startswith(prefix) and actor.get("State") == "ALIVE":
                replicas[name.rsplit("#", 1)[-1]] = actor["Address"]["IPAddress"]
        out = replicas
    elif what == "apps":
        from ray import serve

        out = sorted(serve.status().applications) if _controller_alive() else []
    elif what == "controller":
        out = _controller_alive()
    print("PROBE-RESULT " + json.dumps(out), flush=True)


def _controller_alive() -> bool:
    return any(
        a.get("Name") == "SERVE_CONTROLLER_ACTOR" and a.get("State") == "ALIVE"
        for a in ray._private.state.actors().values()
    )


if __name__ == "__main__":
    main()
