"""Guess a secret number in 1..100 (from reset's seed) in at most `ATTEMPTS` steps. The reward depends
on the action: 1.0 for the right guess (the episode ends), else minus the distance / 100 (a closer
guess costs less); the episode also ends when the attempts run out. A guess outside 1..100 raises
(the server answers the step with an error)."""

import random
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

try:
    from ..models import GuessAction
    from ..models import GuessObservation
except ImportError:
    from models import GuessAction
    from models import GuessObservation

ATTEMPTS = 6


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self) -> None:
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._secret = 50

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:  # type: ignore[override]
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._secret = random.Random(seed).randint(1, 100)
        return GuessObservation(
            hint=f"Guess my number (1-100) in {ATTEMPTS} tries.",
            attempts_left=ATTEMPTS,
            episode_id=self._state.episode_id or "",
        )

    def step(self, action: GuessAction) -> GuessObservation:  # type: ignore[override]
        if not 1 <= action.guess <= 100:
            raise ValueError(f"guess {action.guess} is outside 1..100")
        self._state.step_count += 1
        left = ATTEMPTS - self._state.step_count
        if action.guess == self._secret:
            hint, reward, done = "correct", 1.0, True
        else:
            hint = "higher" if action.guess < self._secret else "lower"
            reward, done = -abs(action.guess - self._secret) / 100, left <= 0
        return GuessObservation(
            hint=hint,
            attempts_left=left,
            last_guess=action.guess,
            done=done,
            reward=reward,
            metadata={"note": action.note},
        )

    @property
    def state(self) -> State:
        return self._state
