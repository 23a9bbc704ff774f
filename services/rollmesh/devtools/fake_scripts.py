"""Scripts for the fake backend (`ROLLMESH_FAKE_SCRIPT=rollmesh.devtools.fake_scripts:counter_agent`):
deterministic policies that play a multi-turn tool environment, for tests and the docs' commands.

`counter_agent` plays the built-in `session_state` environment ("The counter starts at S. Use the
tools to add N to it, then tell me its value."): its first turn calls `increment_counter(N)`, the
next `get_counter_value()`, the next answers "The counter is V." with the value the last tool
returned. A conversation whose last user message carries "Progress:" (an agent that compacted its
history into that message) is answered at once from the last number in it.

`nemo_gym_counter_agent` plays NeMo Gym's own example_session_state_mgmt rows ("add 1 then add 2 then
get the count", through the NeMo Gym bridge): one `increment_counter(n)` per number, in order, then
`get_counter_value()`, then "The count is V." with the count the server returned. A conversation of
another kind is answered "I cannot play this." (no tool call).

`container_agent` plays the test suite's Harbor container tasks (tests/container_tasks) through the
container environment's tools: the instruction (the first user message) picks a fixed list of tool
calls, one per turn (`CONTAINER_PLANS`); once each has its result it answers "done." (no call). An
instruction of another kind is answered "I cannot do this.".

`describes_by_seed` answers "Describe the number N." with N and then 1 + seed % 3 times " ha" (the
request's sampling seed: a job's rollouts of one task, seeds starting_seed + rollout_index, answer at
different lengths), for group-scored environments (docs/environments.md, the verifiers group test).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rollmesh.gateway.backends.base import EngineRequest

_ADD = re.compile(r"add (-?\d+)")
_NUMBER = re.compile(r"-?\d+")
_FIRST_USER = re.compile(r"<\|user\|>\n(.*?)<\|end\|>", re.S)
_COUNT = re.compile(r'"count": ?(-?\d+)')


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def describes_by_seed(prompt_text: str, request: EngineRequest) -> str:
    asked = re.findall(r"Describe the number (-?\d+)\.", prompt_text)
    if not asked:
        return "?"
    seed = int(request.sampling.seed or 0)
    return str(asked[-1]) + " ha" * (1 + seed % 3)


def counter_agent(prompt_text: str, request: EngineRequest) -> str:
    del request
    at = prompt_text.rfind("<|user|>\n")
    tail = prompt_text[at:] if at >= 0 else prompt_text
    user = tail[len("<|user|>\n") :].split("<|end|>", 1)[0] if at >= 0 else ""
    if "Progress:" in user:
        numbers = _NUMBER.findall(user.split("Progress:", 1)[1])
        return f"The counter is {numbers[-1] if numbers else '?'}."
    results = tail.split("<|tool|>\n")[1:]
    if not results:
        add = _ADD.search(user)
        return _call("increment_counter", {"count": int(add.group(1)) if add else 1})
    if len(results) == 1:
        return _call("get_counter_value", {})
    value = results[-1].split("<|end|>", 1)[0].strip()
    return f"The counter is {value}."


def nemo_gym_counter_agent(prompt_text: str, request: EngineRequest) -> str:
    del request
    first = _FIRST_USER.search(prompt_text)
    asked = first.group(1) if first else ""
    if "then get the count" not in asked:
        return "I cannot play this."
    numbers = [int(n) for n in _NUMBER.findall(asked)]
    done = prompt_text.count("<|tool|>")
    if done < len(numbers):
        return _call("increment_counter", {"count": numbers[done]})
    if done == len(numbers):
        return _call("get_counter_value", {})
    count = _COUNT.findall(prompt_text)
    return f"The count is {count[-1] if count else '?'}."


#: What `container_agent` does for an instruction containing the key: its tool calls, in order.
CONTAINER_PLANS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "Create the file /app/hello.txt containing exactly: Hello, world!": [
        ("write_file", {"path": "/app/hello.txt", "content": "Hello, world!"}),
        ("read_file", {"path": "/app/hello.txt"}),
    ],
    "The function `add` in /app/calc.py returns the wrong result": [
        ("read_file", {"path": "/app/calc.py"}),
        ("shell", {"command": "sed -i 's/a - b/a + b/' calc.py && cat calc.py"}),
    ],
    "wait for a server that never answers": [
        ("shell", {"command": "touch /app/started && echo started"}),
        ("shell", {"command": "sleep 600", "timeout_s": 600}),
        ("shell", {"command": "echo still here"}),
    ],
    "Try to download http://deb.debian.org/debian/": [
        (
            "shell",
            {
                "command": "python3 -c 'import urllib.request as u; "
                + 'u.urlopen("http://deb.debian.org/debian/", timeout=5)'
                + "'"
            },
        ),
        ("write_file", {"path": "/app/result.txt", "content": "blocked"}),
    ],
}


def container_agent(prompt_text: str, request: EngineRequest) -> str:
    del request
    first = _FIRST_USER.search(prompt_text)
    asked = first.group(1) if first else ""
    plan = next((steps for key, steps in CONTAINER_PLANS.items() if key in asked), None)
    if plan is None:
        return "I cannot do this."
    done = prompt_text.count("<|tool|>")
    if done < len(plan):
        name, arguments = plan[done]
        return _call(name, arguments)
    return "done."
