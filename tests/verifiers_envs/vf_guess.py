"""A verifiers MultiTurnEnv game: guess the number; `env_response` answers "higher" or "lower" and
ends the game on the right guess (`final_env_response`). The rubric pays 1.0 for solving it and
0.5 / turns for solving it fast."""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset


class GuessEnv(vf.MultiTurnEnv):
    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        text = str(messages[-1].content or "").strip()
        target = int(state["answer"])
        guess = int(text) if text.lstrip("-").isdigit() else None
        if guess == target:
            state["solved"] = True
            reply = [vf.UserMessage(content="Correct!")]
            state["final_env_response"] = reply
            return reply
        hint = "higher" if guess is not None and guess < target else "lower"
        return [vf.UserMessage(content=f"{hint}")]


def solved(state: vf.State) -> float:
    return 1.0 if state.get("solved") else 0.0


def fast(state: vf.State) -> float:
    return 1.0 / len(state["trajectory"]) if state.get("solved") else 0.0


def load_environment() -> vf.Environment:
    ask = "Guess my number between 1 and 8. Answer with the number only."
    rows = [{"question": ask, "answer": str(t)} for t in (3, 6, 8)]
    rubric = vf.Rubric(funcs=[solved, fast], weights=[1.0, 0.5])
    return GuessEnv(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=6)
