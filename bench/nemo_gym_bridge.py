"""The NeMo Gym bridge's cost: per verify and per tool call through the bridge (the verifier's domain
layer: VerifierService over NemoGymEnvironment) against a plain aiohttp client posting the same
bodies with the same cookie to the same managed server, in the same run; and verifies per second at
concurrency 256 both ways. Prints ONE JSON object to stdout; logs go to stderr.

    .venv/bin/python bench/nemo_gym_bridge.py [--trials 5] [--seconds 3] [--server example_single_tool_call]

Needs the NeMo Gym virtualenv (scripts/nemo_gym.py venv: built once, cached). Each figure is the
mean ± stddev over fixed-duration trials; bridge and plain trials alternate, so drift in the
machine's load hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._meta import env_info
from bench._meta import load_script
from bench._meta import log
from bench._meta import result_stream
from bench._meta import stats
from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.logging import configure
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import Response
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.bridges.nemo_gym import BridgeState
from rollmesh.verifier.bridges.nemo_gym import NemoGymEnvironment
from rollmesh.verifier.bridges.nemo_gym import responses_object
from rollmesh.verifier.bridges.nemo_gym import row_body
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.service import VerifyCall

ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "What's the weather in Paris?"}],
        "tools": [
            {"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}
        ],
    }
}
ARGS = {"city": "Paris"}
ANSWER = Response(
    (
        Message("assistant", "", (ToolCall("call_1", "get_weather", json.dumps(ARGS)),)),
        Message("tool", '{"city":"Paris","weather_description":"cold"}', tool_call_id="call_1"),
        Message("assistant", "It is cold in Paris."),
    )
)


async def trial(one: Callable[[], Awaitable[None]], seconds: float, concurrency: int) -> tuple[float, float]:
    """Calls per second with `concurrency` loops for `seconds`, and this process's CPU per call (µs):
    the client side's cost, which the server's time (another process, the same both ways) is not in."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await one()
            done += 1

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return done / (time.perf_counter() - start), (time.process_time() - cpu) * 1e6 / max(done, 1)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--server", default="example_single_tool_call")
    ap.add_argument("--concurrency", type=int, default=256)
    args = ap.parse_args()
    out = result_stream()
    configure(level="warning")
    python = load_script("nemo_gym").venv("0.4.0", (args.server,))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "environments" / "bench_ng"
        folder.mkdir(parents=True)
        (folder / "nemo_gym.toml").write_text(f'server = "{args.server}"\npython = "{python}"\n')
        roots = RootsConfig(Path("/nonexistent"), (Path(tmp),), BUILTIN_ROOT, False)
        svc = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
        await svc.start()
        env = svc.environment("bench_ng")
        assert isinstance(env, NemoGymEnvironment) and env.sidecar is not None
        url = f"http://{env.sidecar.address}"
        log("server_up", url=url)
        session = (await svc.seed_session("bench_ng", json.dumps(ROW))).session
        state = session.state
        assert isinstance(state, BridgeState)
        cookie = state.cookies.header()
        call = ToolCall("call_1", "get_weather", json.dumps(ARGS))
        connector = aiohttp.TCPConnector(limit=0)  # as the bridge's
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), connector=connector) as http:

            async def post(path: str, body: Any) -> bytes:
                """POST as NeMo Gym's own client does: a dropped keep-alive connection is retried."""
                while True:
                    try:
                        async with http.post(f"{url}{path}", json=body, headers=cookie) as r:
                            return await r.read()
                    except aiohttp.ClientConnectionError:  # dropped, reset (ClientOSError)
                        continue

            async def bridge_tool() -> None:
                await svc.call_tool(session.id, call)

            async def plain_tool() -> None:
                await post("/get_weather", ARGS)

            async def bridge_verify() -> None:
                await svc.verify(VerifyCall("bench_ng", json.dumps(ROW), ANSWER, session.id))

            async def plain_verify() -> None:
                body = row_body(ROW) | {"response": responses_object(ROW, ANSWER)}
                json.loads(await post("/verify", body))

            cases: dict[str, tuple[Callable[[], Awaitable[None]], int]] = {
                "tool_call_bridge": (bridge_tool, 1),
                "tool_call_plain": (plain_tool, 1),
                "verify_bridge": (bridge_verify, 1),
                "verify_plain": (plain_verify, 1),
                f"verify_bridge_c{args.concurrency}": (bridge_verify, args.concurrency),
                f"verify_plain_c{args.concurrency}": (plain_verify, args.concurrency),
            }
            for one, _ in cases.values():  # warm up every path
                await one()
            rates: dict[str, list[float]] = {name: [] for name in cases}
            cpu_us: dict[str, list[float]] = {name: [] for name in cases}
            for n in range(args.trials):
                for name, (one, conc) in cases.items():
                    rate, cpu = await trial(one, args.seconds, conc)
                    rates[name].append(rate)
                    cpu_us[name].append(cpu)
                log("trial", n=n, **{k: round(v[-1], 1) for k, v in rates.items()})
        await svc.aclose()
    c = args.concurrency
    single = [k for k in cases if not k.endswith(f"_c{c}")]
    wall_us = {k: [1e6 / r for r in rates[k]] for k in single}

    def ratio(table: dict[str, list[float]], what: str) -> float:
        return round(statistics.fmean(table[f"{what}_bridge"]) / statistics.fmean(table[f"{what}_plain"]), 3)

    result = {
        "name": "nemo_gym_bridge",
        "params": {
            "trials": args.trials,
            "seconds": args.seconds,
            "server": args.server,
            "nemo_gym": "0.4.0",
        },
        "figures": {
            "wall_us_per_call": {k: stats(v) for k, v in wall_us.items()},
            "client_cpu_us_per_call": {k: stats(cpu_us[k]) for k in single},
            "bridge_over_plain_wall": {w: ratio(wall_us, w) for w in ("tool_call", "verify")},
            "bridge_over_plain_client_cpu": {w: ratio(cpu_us, w) for w in ("tool_call", "verify")},
            f"verifies_per_s_at_{c}": {
                "bridge": stats(rates[f"verify_bridge_c{c}"]),
                "plain": stats(rates[f"verify_plain_c{c}"]),
            },
            f"client_cpu_us_per_verify_at_{c}": {
                "bridge": stats(cpu_us[f"verify_bridge_c{c}"]),
                "plain": stats(cpu_us[f"verify_plain_c{c}"]),
            },
        },
        **env_info("aiohttp", "grpcio"),
    }
    out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
