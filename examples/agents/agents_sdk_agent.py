"""An agent program on the OpenAI Agents SDK (`openai-agents`, no rollmesh import), run per rollout:

    SDK_PYTHON=$(python scripts/agents_sdk_venv.py)   # a virtualenv with openai-agents 0.24
    rollmesh run ... --agent-program "$SDK_PYTHON examples/agents/agents_sdk_agent.py"
    rollmesh run ... --agent-program "$SDK_PYTHON examples/agents/agents_sdk_agent.py --api responses"

One `Agent` whose tools are the rollout's environment tools (a `FunctionTool` each, run through
ROLLMESH_TOOLS_URL) and whose model is the rollout's recorded URL (OPENAI_BASE_URL / OPENAI_API_KEY,
read by `AsyncOpenAI()`), on the chat-completions model class (`--api chat`, the default) or the
Responses one (`--api responses`); `Runner.run` on the task's messages, at most `max_steps` turns;
its final output printed. Tracing is off: it would export to OpenAI with the capture's token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

import httpx2
from agents import Agent
from agents import FunctionTool
from agents import Model
from agents import OpenAIChatCompletionsModel
from agents import OpenAIResponsesModel
from agents import Runner
from agents import set_tracing_disabled
from agents.tool_context import ToolContext
from openai import AsyncOpenAI


def environment_tool(spec: dict[str, Any], tools_url: str, http: httpx2.AsyncClient) -> FunctionTool:
    """One of the rollout's tools (a chat-completions function tool) as the SDK's FunctionTool."""
    function = spec["function"]

    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
        body = {"name": function["name"], "arguments": arguments, "id": ctx.tool_call_id}
        answer = await http.post(tools_url + "/call", json=body, timeout=60)
        answer.raise_for_status()
        return str(answer.json()["output"])

    return FunctionTool(
        name=function["name"],
        description=function.get("description", ""),
        params_json_schema=function.get("parameters") or {"type": "object", "properties": {}},
        on_invoke_tool=invoke,
        strict_json_schema=False,  # the environment's schemas, as they are
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", choices=("chat", "responses"), default="chat")
    args = parser.parse_args()
    task = json.load(sys.stdin)
    set_tracing_disabled(True)
    client = AsyncOpenAI(max_retries=0)
    name = os.environ.get("ROLLMESH_MODEL", "policy")
    model: Model = (
        OpenAIResponsesModel(name, client)
        if args.api == "responses"
        else OpenAIChatCompletionsModel(name, client)
    )
    async with httpx2.AsyncClient() as http:
        agent = Agent(
            name="rollout",
            instructions=None,  # the task's own messages carry the system prompt
            model=model,
            tools=[environment_tool(t, task["tools_url"], http) for t in task["tools"]],
        )
        messages = [{"role": m["role"], "content": m["content"]} for m in task["messages"]]
        result = await Runner.run(agent, messages, max_turns=max(task["max_steps"], 1))  # type: ignore[arg-type]
    print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())
