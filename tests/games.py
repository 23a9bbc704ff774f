"""A turn-taking environment for the tests of environment turns, and a fake model that plays it.

`Guess` is a number-guessing game: seeding starts the episode with a user message naming the range;
each assistant turn is a guess, which the environment answers with "N is too low" / "N is too high"
(a user message, step reward -0.125) until the guess is right (step reward 1.0, done). `peek`, a
tool the session offers from seeding (`Seeded.tools`) and the environment answers in its step (as
NeMo Gym's gymnasium servers answer calls through `info.tool_outputs`), is answered with a "tool"
message saying the parity of the secret; `hint`, the environment's own tool, runs through CallTool.
`verify` adds 0.5 to a won episode. So a game won on the k-th guess scores 1.0 - 0.125 * (k - 1) + 0.5.

`play_guess` is a FakeBackend script (prompt text -> reply): a binary search over the range the
prompt names, narrowed by every "too low" / "too high" in it.
"""

from __future__ import annotations

import re
from typing import Any

from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.verifier import Environment
from rollmesh.verifier import EnvTurn
from rollmesh.verifier import Message
from rollmesh.verifier import Response
from rollmesh.verifier import Seeded
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import ToolSpec
from rollmesh.verifier import VerifyResult
from rollmesh.verifier import tool

LOW, HIGH = 1, 100
PEEK = ToolSpec.of("peek", "Whether the secret is even or odd.", {"type": "object", "properties": {}})
WRONG, RIGHT, WON_BONUS = -0.125, 1.0, 0.5
_NUMBER = re.compile(r"-?\d+")
_RANGE = re.compile(r"between (\d+) and (\d+)")
_FEEDBACK = re.compile(r"(\d+) is too (low|high)")


def guess_row(secret: int) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Let's play a game."}]},
        "verifier_metadata": {"secret": secret},
    }


def guesses_to_find(secret: int) -> list[int]:
    """The guesses `play_guess` makes for `secret`, in order."""
    low, high, out = LOW, HIGH, []
    while True:
        g = (low + high) // 2
        out.append(g)
        if g == secret:
            return out
        low, high = (g + 1, high) if g < secret else (low, g - 1)


def score(secret: int) -> float:
    """The reward of a game `play_guess` wins: its step rewards plus verify's bonus."""
    wrong = len(guesses_to_find(secret)) - 1
    return WRONG * wrong + RIGHT + WON_BONUS


class Guess(Environment):
    """Guess the secret number in as few turns as you can."""

    async def seed_session(self, task: Task) -> Seeded:
        opening = Message("user", f"I picked a number between {LOW} and {HIGH}. Guess it.")
        return Seeded(state={"guesses": [], "won": False}, messages=(opening,), tools=(PEEK,))

    @tool
    async def hint(self, session: Session) -> str:
        """Whether the secret is above 50."""
        return "above 50" if int(session.task.metadata["secret"]) > 50 else "at most 50"

    async def step(self, session: Session, turn: Response) -> EnvTurn:
        secret = int(session.task.metadata["secret"])
        answers = tuple(
            Message("tool", "even" if secret % 2 == 0 else "odd", tool_call_id=c.id, name=c.name)
            for c in turn.tool_calls
            if c.name == "peek"
        )
        if turn.tool_calls:  # a turn of calls is no guess
            return EnvTurn(messages=answers, info={"calls": len(turn.tool_calls)})
        found = _NUMBER.search(turn.final_text)
        if found is None:
            return EnvTurn(messages=(Message("user", "Say a number."),), reward=WRONG)
        guess = int(found.group())
        session.state["guesses"].append(guess)
        if guess == secret:
            session.state["won"] = True
            return EnvTurn(reward=RIGHT, done=True, info={"guesses": len(session.state["guesses"])})
        word = "low" if guess < secret else "high"
        return EnvTurn(messages=(Message("user", f"{guess} is too {word}"),), reward=WRONG)

    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        won = session is not None and bool(session.state["won"])
        return VerifyResult(reward=WON_BONUS if won else 0.0, components={"won": float(won)})


def play_guess(prompt_text: str, request: EngineRequest) -> str:
    """A FakeBackend script that plays `Guess` by binary search (see the module docstring)."""
    del request
    found = _RANGE.search(prompt_text)
    low, high = (int(found.group(1)), int(found.group(2))) if found else (LOW, HIGH)
    for number, word in _FEEDBACK.findall(prompt_text):
        if word == "low":
            low = max(low, int(number) + 1)
        else:
            high = min(high, int(number) - 1)
    return str((low + high) // 2)
