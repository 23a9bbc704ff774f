"""An agent program (plain `openai` SDK) that compacts its history, as long-horizon harnesses do.

The same chat tool loop as tool_loop.py, but after `COMPACT_AFTER` rounds of tool calls it throws
its conversation away and starts a new one: the first user message followed by "Progress:" and what
each tool returned. rollmesh records the call after the compaction as a new segment of the rollout's
token record (its prompt does not extend the ids before it); both segments are training data.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from openai import OpenAI
from tool_loop import call_tool

COMPACT_AFTER = 2


def main() -> None:
    task = json.load(sys.stdin)
    client = OpenAI(max_retries=0)
    first_user = next(m for m in task["messages"] if m["role"] == "user")
    messages: list[dict[str, Any]] = list(task["messages"])
    extra = {"tools": task["tools"]} if task["tools"] else {}
    progress: list[str] = []
    for _ in range(max(task["max_steps"], 1)):
        reply = client.chat.completions.create(model="policy", messages=messages, **extra)  # type: ignore[call-overload]
        choice = reply.choices[0]
        messages.append(choice.message.model_dump(exclude_none=True))
        if choice.finish_reason != "tool_calls" or not choice.message.tool_calls:
            break
        for tc in choice.message.tool_calls:
            output = call_tool(tc.function.name, tc.function.arguments, tc.id)
            messages.append(
                {"role": "tool", "tool_call_id": tc.id, "name": tc.function.name, "content": output}
            )
            progress.append(f"{tc.function.name} -> {output}")
        if len(progress) >= COMPACT_AFTER:
            summary = f"{first_user['content']}\nProgress: " + "; ".join(progress)
            messages = [{"role": "user", "content": summary}]
    print(messages[-1].get("content") or "")


if __name__ == "__main__":
    main()
