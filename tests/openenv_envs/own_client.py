"""OpenEnv's own client on an OpenEnv server, for the tests and the bench that compare rollmesh's
host bridge with it: run in the OpenEnv virtualenv (it imports openenv, never rollmesh).

    <openenv python> own_client.py play URL < {"reset": {...}, "actions": [{...}, ...]}
        -> {"reset": {"observation", "reward", "done"}, "steps": [{...}, ...]}   (one JSON line)
    <openenv python> own_client.py time URL --steps N < {"reset": {...}, "action": {...}}
        -> {"steps": N, "seconds": S, "cpu_seconds": C}   (N steps of one WebSocket session after a
           warm-up step: wall time, and this process's CPU time)

It uses `GenericEnvClient` (openenv.core: the WebSocket session at /ws, raw dicts), the client an
OpenEnv user reaches any server with; a step's answer is reported as that client parses it.

`play` also takes (the tests of `rollmesh serve openenv`): a list of jobs (one session each, a list
of answers); a job's `"reset": null` (no reset), `"state": true` (its answer gets the session's
`state()`) and `"headers"` (sent by openenv 0.10's client; 0.3's takes none); a reset or step the
server refuses is `{"error": "<the client's exception>"}` and the episode goes on with its next
action; a session refused at the handshake is `{"connect_error": "..."}`.
"""

import argparse
import asyncio
import inspect
import json
import sys
import time

from openenv.core import GenericEnvClient


def _result(result) -> dict:
    return {"observation": result.observation, "reward": result.reward, "done": result.done}


async def _answer(call) -> dict:
    try:
        return _result(await call)
    except RuntimeError as exc:  # what the client raises for the server's error message
        return {"error": str(exc)}


async def play(url: str, job: dict | list) -> dict | list:
    if isinstance(job, list):
        return [await play(url, one) for one in job]
    headers = job.get("headers")
    taken = "headers" in inspect.signature(GenericEnvClient).parameters
    out: dict = {}
    try:
        async with GenericEnvClient(
            base_url=url, **({"headers": headers} if headers and taken else {})
        ) as env:
            if job.get("reset", {}) is not None:  # `"reset": null`: a step with no reset before it
                out["reset"] = await _answer(env.reset(**job.get("reset", {})))
            out["steps"] = [await _answer(env.step(action)) for action in job.get("actions", [])]
            if job.get("state"):
                out["state"] = await env.state()
    except ConnectionError as exc:  # refused at the handshake
        out["connect_error"] = str(exc)
    return out


async def timed(url: str, job: dict, n: int) -> dict:
    async with GenericEnvClient(base_url=url) as env:
        await env.reset(**job.get("reset", {}))
        await env.step(job["action"])
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            await env.step(job["action"])
        return {"steps": n, "seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["play", "time"])
    parser.add_argument("url")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    job = json.load(sys.stdin)
    run = play(args.url, job) if args.mode == "play" else timed(args.url, job, args.steps)
    print(json.dumps(asyncio.run(run)))


if __name__ == "__main__":
    main()
