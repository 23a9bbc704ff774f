"""Reading a Harbor verifier's verdict: `/logs/verifier/reward.json` (an object of named rewards: all
kept) wins over `reward.txt` (one number, the reward named "reward"), as in Harbor. Which named
reward is THE reward is the environment's `reward_key` (default "reward"; a reward.json with a
single number takes it whatever its name). Everything else is a named failure, never a 0: an empty
or non-number reward.txt, a reward.json that is not an object of finite numbers, a reward.json
without the chosen key (BadRewardFile); neither file (NoRewardFile, or TestScriptFailed when the
script exited non-zero: it crashed before writing one).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from rollmesh.verifier.bridges.container.errors import BadRewardFile
from rollmesh.verifier.bridges.container.errors import NoRewardFile
from rollmesh.verifier.bridges.container.errors import TestScriptFailed

REWARD_TXT = "/logs/verifier/reward.txt"
REWARD_JSON = "/logs/verifier/reward.json"
DEFAULT_KEY = "reward"


@dataclass(frozen=True)
class Rewards:
    reward: float
    named: dict[str, float]
    source: str  # "reward.json" or "reward.txt"


def parse(
    reward_json: bytes | None,
    reward_txt: bytes | None,
    *,
    key: str,
    exit_code: int,
    output_tail: str,
    task: str,
) -> Rewards:
    """The verdict from the two files' bytes (None: absent) and test.sh's exit status."""
    where = f"task {task!r}"
    meta = {"task": task, "exit_code": str(exit_code)}
    if reward_json is not None:
        try:
            data = json.loads(reward_json.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadRewardFile(f"{where}: reward.json is not JSON ({exc})", metadata=meta) from None
        if isinstance(data, bool) or isinstance(data, (int, float)):
            data = {key: data}
        if not isinstance(data, dict) or not data:
            raise BadRewardFile(
                f"{where}: reward.json must be an object of named numbers, got {data!r:.100}", metadata=meta
            )
        named: dict[str, float] = {}
        for name, value in data.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise BadRewardFile(
                    f"{where}: reward.json's {name!r} is not a finite number: {value!r:.60}", metadata=meta
                )
            named[str(name)] = float(value)
        if key not in named:
            if len(named) != 1:
                raise BadRewardFile(
                    f"{where}: reward.json has no {key!r} (the configured reward_key); "
                    f"it has {', '.join(sorted(named))}",
                    metadata=meta,
                )
            return Rewards(next(iter(named.values())), named, "reward.json")
        return Rewards(named[key], named, "reward.json")
    if reward_txt is not None:
        text = reward_txt.decode("utf-8", errors="replace").strip()
        try:
            value = float(text)
        except ValueError:
            raise BadRewardFile(
                f"{where}: reward.txt is not a number: {text[:60]!r}", metadata=meta
            ) from None
        if not math.isfinite(value):
            raise BadRewardFile(f"{where}: reward.txt is not a finite number: {text[:60]!r}", metadata=meta)
        return Rewards(value, {DEFAULT_KEY: value}, "reward.txt")
    if exit_code != 0:
        raise TestScriptFailed(
            f"{where}: tests/test.sh exited {exit_code} without writing a reward: {output_tail[-300:]}",
            metadata=meta,
        )
    raise NoRewardFile(
        f"{where}: tests/test.sh ended (exit 0) without writing {REWARD_TXT} or {REWARD_JSON}", metadata=meta
    )
