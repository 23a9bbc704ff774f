"""An agent program (plain `openai` SDK) on the Responses API: the tool loop with `responses.create`,
function_call items answered with function_call_output items (the input grows each turn)."""

from __future__ import annotations

import json
import sys
from typing import Any

from openai import OpenAI
from tool_loop import call_tool


def main() -> None:
    task = json.load(sys.stdin)
    client = OpenAI(max_retries=0)
    items: list[dict[str, Any]] = [{"role": m["role"], "content": m["content"]} for m in task["messages"]]
    tools = [{"type": "function", **t["function"]} for t in task["tools"]]
    text = ""
    for _ in range(max(task["max_steps"], 1)):
        reply = client.responses.create(model="policy", input=items, tools=tools)  # type: ignore[arg-type]
        calls = [item for item in reply.output if item.type == "function_call"]
        items.extend(item.model_dump(exclude_none=True) for item in reply.output)
        text = reply.output_text
        if not calls:
            break
        for call in calls:
            output = call_tool(call.name, call.arguments, call.call_id)
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": output})
    print(text)


if __name__ == "__main__":
    main()
