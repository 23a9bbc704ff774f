"""One OpenEnv episode of a rollmesh environment, played through the verifier's environment API
(`EnvPort`: SeedSession, CallTool, Step, Verify, CloseSession), as the built-in agent loop plays a
rollout (scheduler/drivers/agent_loop.py) with the OpenEnv client in the model's seat.

- **reset** closes the episode before, picks a row (`ResetParams`), seeds a verifier session (none
  for a stateless environment whose row declares no tools, as in the loop) and answers the prompt:
  the row's input messages, then the environment's opening messages, with the tools offered.
- **step** takes one assistant turn (`wire.Action`). Its calls to the environment's tools run
  through CallTool (none when the environment's tool calls are the answer; with environment turns,
  only calls to its own tools); an environment that takes turns then steps (its reward is the
  step's). A turn without calls ends the episode of an environment that takes no turns, as a
  final answer ends the loop; so does a step that says done, a tool that ends the agent, and the
  `max_steps`-th turn. At the end, Verify scores every message after the prompt with the session,
  and the last step's reward is its own plus verify's: the episode's rewards sum to the reward
  rollmesh records for the same rollout. Intermediate steps of an environment without turns have
  reward None (nothing was measured), never a made-up 0.
- A failure of the verifier (a bad row, a tool that breaks, an unreachable service) ends the
  episode (its session closed): a step after it needs a new reset; it is raised to the caller as it
  is (one line on the wire).

Not thread-safe; one per WebSocket connection, whose messages come one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollmesh.openenv_server import wire
from rollmesh.openenv_server.errors import BadReset
from rollmesh.openenv_server.errors import NoEpisode
from rollmesh.scheduler.drivers.agent_loop import EnvDescription
from rollmesh.scheduler.drivers.agent_loop import EnvPort
from rollmesh.scheduler.drivers.agent_loop import SessionOpened
from rollmesh.scheduler.drivers.agent_loop import close_sessions
from rollmesh.scheduler.drivers.agent_loop import has_prompt
from rollmesh.scheduler.drivers.agent_loop import input_messages
from rollmesh.scheduler.drivers.agent_loop import merge_tools
from rollmesh.scheduler.drivers.agent_loop import row_tools
from rollmesh.scheduler.drivers.agent_loop import run_tool_calls
from rollmesh.scheduler.errors import NoPrompt

Json = wire.Json


class Episode:
    """The episode of one OpenEnv session (module docstring)."""

    def __init__(
        self,
        env: EnvPort,
        environment: str,
        description: EnvDescription,
        rows: Sequence[Json],
        *,
        session_prefix: str,
        max_steps: int,
    ) -> None:
        self._env = env
        self._environment = environment
        self._description = description
        self._rows = rows
        self._prefix = session_prefix
        self._max_steps = max(1, max_steps)
        self._resets = 0
        self._next_row = 0
        self._state = wire.State(environment=environment)
        self._task: Json = {}
        self._opened = SessionOpened()
        self._session = ""  # the verifier session open now ("" when none)
        self._new: list[Json] = []  # every message after the prompt, as the loop keeps them
        self._calls = 0
        self._live = False
        self._why_not = "no episode was started"  # why a step now has no episode to act on

    @property
    def state(self) -> wire.State:
        return self._state

    def _pick(self, params: wire.ResetParams) -> tuple[Json, int | None]:
        if params.row is not None:
            if "responses_create_params" not in params.row:
                raise BadReset("reset's `row` has no `responses_create_params` (a dataset row's JSON)")
            return params.row, None
        if not self._rows:
            raise BadReset("this server has no dataset rows: reset with `row` (a dataset row's JSON)")
        if params.index is not None:
            if params.index >= len(self._rows):
                raise BadReset(f"reset index {params.index} is past the dataset's {len(self._rows)} rows")
            return self._rows[params.index], params.index
        if params.seed is not None:
            index = params.seed % len(self._rows)
        else:
            index, self._next_row = self._next_row, (self._next_row + 1) % len(self._rows)
        return self._rows[index], index

    async def reset(self, params: wire.ResetParams) -> wire.Observation:
        await self.close()
        self._live, self._why_not = False, "the last reset failed"
        task, index = self._pick(params)
        self._resets += 1
        episode_id = params.episode_id or f"{self._prefix}/{self._resets}"
        self._state = wire.State(episode_id=episode_id, environment=self._environment, task_index=index)
        self._task, self._new, self._calls = task, [], 0
        self._opened = SessionOpened()
        if not self._description.stateless or row_tools(task):
            self._opened = await self._env.seed_session(self._environment, task, episode_id)
            self._session = episode_id
        if not self._opened.messages and not has_prompt(task):
            await self.close()
            raise NoPrompt(
                f"the row's `responses_create_params.input` is empty and environment "
                f"{self._environment!r} gave no first observation at seed: there is no prompt"
            )
        self._live = True
        self._why_not = ""
        tools = merge_tools(merge_tools(self._opened.tools, self._opened.session_tools), row_tools(task))
        return wire.Observation(messages=[*input_messages(task), *self._opened.messages], tools=tools)

    async def step(self, action: wire.Action) -> wire.Observation:
        if not self._live:
            raise NoEpisode(f"step with no episode to act on ({self._why_not}): reset first")
        try:
            return await self._step(action)
        except BaseException:
            self._live, self._why_not = False, "its last step failed"
            await self.close()
            raise

    async def _step(self, action: wire.Action) -> wire.Observation:
        msg = action.assistant_message(self._calls)
        self._calls += len(action.tool_calls)
        self._state.step_count += 1
        start = len(self._new)
        self._new.append(msg)
        calls: list[Json] = msg.get("tool_calls", [])
        turns = self._opened.takes_turns
        reward: float | None = None
        info: Json = {}
        finish = ""
        if calls and not self._description.tool_calls_are_answer:
            if await run_tool_calls(self._env, self._session, calls, self._opened, self._new):
                finish = "agent_timeout"  # the environment ended the agent (its time is up)
        elif not turns:
            finish = "tool_calls" if calls else "stop"
        if turns and not finish:
            answer = await self._env.step(self._session, self._new[start:])
            self._new.extend(answer.messages)
            reward, info = answer.reward, dict(answer.info)
            if answer.done:
                finish = "tool_calls" if calls else "stop"
        if not finish and self._state.step_count >= self._max_steps:
            finish = "max_steps"
        done = bool(finish)
        if done:
            verdict = await self._env.verify(self._environment, self._task, self._new, self._session)
            reward = (reward or 0.0) + verdict.reward
            info |= {
                "finish_reason": finish,
                "verify_reward": verdict.reward,
                "reward_components": verdict.components,
                "extracted_answer": verdict.extracted_answer,
                "verify_details": verdict.details,
                "masked": verdict.masked,
            }
            self._live, self._why_not = False, "the episode is over"
            await self.close()
        self._state.reward += reward or 0.0
        self._state.done = done
        return wire.Observation(messages=self._new[start + 1 :], info=info, reward=reward, done=done)

    async def close(self) -> None:
        """Close the episode's verifier session, if one is open (best effort, bounded, as the loop
        closes its sessions: a failed close is logged; the verifier evicts idle sessions anyway)."""
        session, self._session = self._session, ""
        if session:
            await close_sessions(self._env, None, session)
