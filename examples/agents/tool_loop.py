"""An agent program written against the plain `openai` SDK (no rollmesh import): a chat tool loop.

rollmesh runs it once per rollout (`rollmesh run --agent-program "python examples/agents/tool_loop.py"`):
OPENAI_BASE_URL and OPENAI_API_KEY point at the rollout's recorded URL, the task comes on stdin
(also in ROLLMESH_TASK_FILE), and the environment's tools are at ROLLMESH_TOOLS_URL. It calls the
model, runs the tool calls it asks for, and repeats until the model answers without calls (or
`max_steps` turns): the loop rollmesh's built-in agent runs, so both give the same token records.
tool_loop_server.py serves the same loop (`run_loop`) as an agent server.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from typing import Any

from openai import DefaultHttpxClient
from openai import OpenAI


def call_tool(
    name: str,
    arguments: str,
    call_id: str,
    tools_url: str | None = None,
    http: DefaultHttpxClient | None = None,
) -> str:
    """Run one tool call through the rollout's tools URL (`http`: a connection pool to reuse)."""
    body = {"name": name, "arguments": arguments, "id": call_id}
    url = (tools_url or os.environ["ROLLMESH_TOOLS_URL"]) + "/call"
    if http is not None:
        return str(http.post(url, json=body, timeout=60).json()["output"])
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return str(json.load(answer)["output"])


def run_loop(
    client: OpenAI, task: dict[str, Any], http: DefaultHttpxClient | None = None
) -> list[dict[str, Any]]:
    """The tool loop on `task` (the task document: messages, tools, max_steps, tools_url): the
    conversation it ends with. `http`: a connection pool for the tool calls (an agent server's)."""
    messages: list[dict[str, Any]] = list(task["messages"])
    extra = {"tools": task["tools"]} if task["tools"] else {}
    for _ in range(max(task["max_steps"], 1)):
        reply = client.chat.completions.create(model="policy", messages=messages, **extra)  # type: ignore[call-overload]
        choice = reply.choices[0]
        messages.append(choice.message.model_dump(exclude_none=True))
        if choice.finish_reason != "tool_calls" or not choice.message.tool_calls:
            break
        for tc in choice.message.tool_calls:
            output = call_tool(tc.function.name, tc.function.arguments, tc.id, task["tools_url"], http)
            messages.append(
                {"role": "tool", "tool_call_id": tc.id, "name": tc.function.name, "content": output}
            )
    return messages


def main() -> None:
    messages = run_loop(OpenAI(max_retries=0), json.load(sys.stdin))
    print(messages[-1].get("content") or "")


if __name__ == "__main__":
    main()
