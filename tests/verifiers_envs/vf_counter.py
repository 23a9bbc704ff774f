"""A verifiers StatefulToolEnv: a counter per session that the tools change. `increment` and `read`
take the session's counter as an argument the model never sees (`args_to_skip`), injected by
`update_tool_args` from the state `setup_state` made; the rubric pays 1.0 when the counter ended at
the target and the last answer says so."""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset


def increment(by: int, counter: dict[str, Any]) -> str:
    """Add `by` to the counter.

    Args:
        by: how much to add
    """
    counter["value"] += by
    return str(counter["value"])


def read(counter: dict[str, Any]) -> str:
    """The counter's value."""
    return str(counter["value"])


class CounterEnv(vf.StatefulToolEnv):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_tool(increment, args_to_skip=["counter"])
        self.add_tool(read, args_to_skip=["counter"])

    async def setup_state(self, state: vf.State) -> vf.State:
        state["counter"] = {"value": int(state["info"]["start"])}
        return state

    def update_tool_args(
        self, tool_name: str, tool_args: dict, messages: vf.Messages, state: vf.State, **kwargs: Any
    ) -> dict:
        return {**tool_args, "counter": state["counter"]}


def reached(state: vf.State, completion: vf.Messages, answer: str) -> float:
    said = str(completion[-1].content or "").rstrip(".").split()[-1:] == [answer]
    return 1.0 if state["counter"]["value"] == int(answer) and said else 0.0


def load_environment() -> vf.Environment:
    ask = "The counter starts at {}. Add {} to it, then tell me its value."
    rows = [
        {"question": ask.format(s, a), "answer": str(s + a), "info": {"start": s}}
        for s, a in [(1, 2), (10, 5), (0, 7)]
    ]
    return CounterEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[reached]), max_turns=5)
