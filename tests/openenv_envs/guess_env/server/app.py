"""The guessing game's server: openenv-core's `create_app` (HTTP /reset /step /state /schema, /ws)."""

from openenv.core.env_server.http_server import create_app

try:
    from ..models import GuessAction
    from ..models import GuessObservation
    from .guess_environment import GuessEnvironment
except ImportError:
    from models import GuessAction
    from models import GuessObservation
    from server.guess_environment import GuessEnvironment

app = create_app(
    GuessEnvironment, GuessAction, GuessObservation, env_name="guess_env", max_concurrent_envs=16
)
