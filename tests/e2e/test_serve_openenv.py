"""`rollmesh serve openenv` as docs/openenv.md shows it: the page's command in the foreground (a
verifier started in its process over the artifact roots), its URL read from its one progress line,
health waited on; the page's client example and its TRL wrapper (driven as GRPOTrainer drives an
environment_factory's class) run in the OpenEnv venv against it and print what the page says; then
SIGTERM stops it (exit 0). An unknown environment is one `error:` line naming the known ones, exit 2."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
from pathlib import Path

import httpx

from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block
from tests.procs import ROLLMESH
from tests.procs import run_cli

PAGE = DOCS / "openenv.md"

URL = re.compile(r"as OpenEnv at (http://127\.0\.0\.1:\d+)")


async def _url(stderr: asyncio.StreamReader, seen: list[str]) -> str:
    while line := (await stderr.readline()).decode():
        seen.append(line)
        if found := URL.search(line):
            return found.group(1)
    raise AssertionError("the command ended without serving:\n" + "".join(seen))


async def _healthy(url: str, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        while True:
            try:
                if (await http.get("/health")).json() == {"status": "healthy"}:
                    return
            except httpx.HTTPError:
                pass
            assert asyncio.get_running_loop().time() < deadline, f"{url}/health never answered"
            await asyncio.sleep(0.1)


def _python_block(after: str) -> str:
    """The first ```python block of docs/openenv.md after the text `after`."""
    return re.findall(r"```python\n(.*?)```", PAGE.read_text().split(after, 1)[1], flags=re.DOTALL)[0]


async def _run_python(python: Path, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = await asyncio.create_subprocess_exec(
        str(python), "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()[-3000:]
    return out.decode()


# Plays the TRL wrapper of the page as GRPOTrainer calls an environment_factory's class: reset, the
# tools the model calls, then the reward function with the environments and the completions.
TRL_DRIVER = """
envs = [Counter(), Counter()]
prompts = [e.reset(index=i, prompt=[]) for i, e in enumerate(envs)]
envs[0].increment_counter(3)
envs[1].increment_counter(1)
done = [[{"role": "assistant", "content": "It is 3."}], [{"role": "assistant", "content": "It is 6."}]]
print(prompts[0])
print(reward(environments=envs, completions=done, index=[0, 1]))
"""


async def test_the_pages_command_and_examples_run_against_the_served_environment(
    openenv_python: Path, tmp_path: Path
) -> None:
    command = shlex.split(bash_block("## Serve a rollmesh environment", PAGE).strip())
    assert command[:3] == ["rollmesh", "serve", "openenv"] and "8000" in command, command
    command = [str(ROLLMESH), *command[1:]]
    command[command.index("8000")] = "0"
    proc = await asyncio.create_subprocess_exec(*command, cwd=tmp_path, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        url = await asyncio.wait_for(_url(proc.stderr, seen), 180)
        await _healthy(url, 60)
        client = _python_block("OpenEnv's own client plays an episode")
        out = await _run_python(openenv_python, client.replace("http://127.0.0.1:8000", url))
        prompt, tools = out.splitlines()[0].rsplit(" [", 1)
        assert "starts at 0" in prompt and "add 3" in prompt
        assert sorted(tools.rstrip("]").replace("'", "").split(", ")) == [
            "get_counter_value",
            "increment_counter",
        ]
        assert out.splitlines()[1:] == ["3 None False", "1.0 True"]
        trl = _python_block("TRL's `GRPOTrainer")
        out = await _run_python(openenv_python, trl.replace("http://127.0.0.1:8000", url) + TRL_DRIVER)
        first, rewards = out.splitlines()
        assert "starts at 0" in first and rewards == "[1.0, 0.0]"  # row 0: 0 + 3 = 3; row 1: 5 + 1 != 7
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(proc.stderr.read(), 60)
        code = await asyncio.wait_for(proc.wait(), 60)
    err = "".join(seen) + rest.decode()
    assert code == 0, err
    assert "Traceback" not in err, err


async def test_an_unknown_environment_is_one_line_naming_the_known_ones(tmp_path: Path) -> None:
    code, _, err = await run_cli("serve", "openenv", "--environment", "nope", "--port", "0")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert (
        errors == [errors[0]] and "unknown environment 'nope'" in errors[0] and "arithmetic" in errors[0]
    ), err
    assert "Traceback" not in err, err
