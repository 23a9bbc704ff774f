"""OpenEnv's own client on an OpenEnv server, for the tests and the bench that compare rollmesh's
host bridge with it: run in the OpenEnv virtualenv (it imports openenv, never rollmesh).

    <openenv python> own_client.py play URL < {"reset": {...}, "actions": [{...}, ...]}
        -> {"reset": {"observation", "reward", "done"}, "steps": [{...}, ...]}   (one JSON line)
    <openenv python> own_client.py time URL --steps N < {"reset": {...}, "action": {...}}
        -> {"steps": N, "seconds": S, "cpu_seconds": C}   (N steps of one WebSocket session after a
           warm-up step: wall time, and this process's CPU time)

It uses `GenericEnvClient` (openenv.core: the WebSocket session at /ws, raw dicts), the client an
OpenEnv user reaches any server with; a step's answer is reported as that client parses it.
"""

import argparse
import asyncio
import json
import sys
import time

from openenv.core import GenericEnvClient


def _result(result) -> dict:
    return {"observation": result.observation, "reward": result.reward, "done": result.done}


async def play(url: str, job: dict) -> dict:
    async with GenericEnvClient(base_url=url) as env:
        first = await env.reset(**job.get("reset", {}))
        steps = []
        for action in job["actions"]:
            steps.append(_result(await env.step(action)))
        return {"reset": _result(first), "steps": steps}


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
