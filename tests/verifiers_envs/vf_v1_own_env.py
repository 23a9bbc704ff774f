"""A verifiers 0.4 taskset that ships its own `Env` (exported next to it; verifiers runs the taskset
in it: multi-agent episodes, a cross-agent `finalize`): rollmesh runs the single-agent loop only, so
the bridge refuses the taskset by name."""

from __future__ import annotations

from collections.abc import Iterable

import verifiers.v1 as vf


class EchoTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def said_something(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply else 0.0


class EchoTaskset(vf.Taskset[EchoTask, vf.TasksetConfig]):
    def load(self) -> Iterable[EchoTask]:
        yield EchoTask(vf.TaskData(prompt="Say hi."), self.config.task)


class PairEnv(vf.SingleAgentEnv):
    """Its own Env (here only a subclass: any Env but verifiers' SingleAgentEnv is refused)."""


__all__ = ["EchoTaskset", "PairEnv"]
