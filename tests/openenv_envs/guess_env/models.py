"""The guessing game's action and observation (openenv-core's pydantic models)."""

from openenv.core.env_server.types import Action
from openenv.core.env_server.types import Observation
from pydantic import Field


class GuessAction(Action):
    """Guess the secret number."""

    guess: int = Field(..., description="Your guess, 1 to 100")
    note: str = Field(default="", description="Why you guess it (kept by the environment, unscored)")


class GuessObservation(Observation):
    """Where the secret is relative to the last guess."""

    hint: str = Field(default="", description="higher, lower or correct")
    attempts_left: int = Field(default=0, description="Guesses left in this episode")
    last_guess: int | None = Field(default=None, description="The guess this answers")
    episode_id: str = Field(default="", description="The episode's id (reset's answer only)")
