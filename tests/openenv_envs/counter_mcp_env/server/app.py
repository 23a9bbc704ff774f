"""Count up to a target with MCP tools: `add(n)` adds to the counter, `count()` reads it. Reset's
seed picks the target (its observation says it); a call's reward is 1.0 when the counter reaches the
target exactly (the episode ends), -0.5 when it passes it (the episode ends), else 0."""

import random
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.mcp_types import CallToolObservation
from openenv.core.env_server.types import Observation
from openenv.core.env_server.types import State
from pydantic import Field


class CounterObservation(Observation):
    prompt: str = Field(default="", description="What to do")


class CounterEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self) -> None:
        mcp = FastMCP("counter")
        self._count, self._target = 0, 10
        self._state = State(episode_id=str(uuid4()), step_count=0)

        @mcp.tool
        def add(n: int) -> int:
            """Add n to the counter; answers the new count."""
            self._count += n
            return self._count

        @mcp.tool
        def count() -> int:
            """The counter's value."""
            return self._count

        super().__init__(mcp)

    def reset(self, seed=None, episode_id=None, **kwargs) -> CounterObservation:  # type: ignore[override]
        self._count, self._target = 0, random.Random(seed).randint(5, 20)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return CounterObservation(
            prompt=f"The counter is 0. Bring it to exactly {self._target} with the tools."
        )

    async def step_async(self, action, timeout_s=None, **kwargs) -> Observation:  # type: ignore[override]
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction):
            self._state.step_count += 1
            reached, passed = self._count == self._target, self._count > self._target
            observation.reward = 1.0 if reached else -0.5 if passed else 0.0
            observation.done = reached or passed
        return observation

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:  # type: ignore[override]
        return Observation(done=False, reward=0.0, metadata={"error": "call the tools"})

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    CounterEnvironment, CallToolAction, CallToolObservation, env_name="counter_mcp_env", max_concurrent_envs=8
)
