"""What an external agent program may read of its task (scheduler/drivers/program.py `public_task`): the
prompt (`responses_create_params`) and the fields its environment marks public
(`Environment.public_fields`, carried by GetEnvironment), never the gold. The whole search, files
and /proc included, through `rollmesh run`: tests/e2e/test_agent_program_gold.py."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from rollmesh.scheduler.drivers.program import CapturedTurn
from rollmesh.scheduler.drivers.program import CaptureRecord
from rollmesh.scheduler.drivers.program import public_task
from rollmesh.verifier.config import VerifierConfig
from rollmesh.verifier.convert import environment_to_pb
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.environment import Environment
from rollmesh.verifier.environment import Response
from rollmesh.verifier.environment import Session
from rollmesh.verifier.environment import Task
from rollmesh.verifier.environment import VerifyResult
from rollmesh.verifier.loader import Discovery
from rollmesh.verifier.loader import Loaded
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.workers import WorkerPool
from tests.unit.test_external_agents import SETTINGS
from tests.unit.test_external_agents import CaptureModel
from tests.unit.test_external_agents import _run
from tests.unit.test_external_agents import _turn

ROW: dict[str, Any] = {
    "responses_create_params": {"input": [{"role": "user", "content": "Which city? Hint given."}]},
    "hint": "it is on a river",
    "expected_answer": "Paris",
    "rubric": ["says Paris"],
}


class Hinted(Environment):
    """An environment whose rows carry a hint the model may be shown."""

    def public_fields(self) -> tuple[str, ...]:
        return ("hint",)

    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        return VerifyResult(1.0 if "Paris" in response.final_text else 0.0)


def test_an_environment_declares_its_public_fields_through_get_environment() -> None:
    cfg = VerifierConfig()
    loaded = {"hinted": Loaded("hinted", Hinted(EnvContext("hinted", Path("."), cfg, WorkerPool(1))), "test")}
    info = VerifierService(cfg, Discovery(loaded, {})).describe("hinted")
    assert info.public_fields == ("hint",)
    assert list(environment_to_pb(info).public_fields) == ["hint"]


def test_the_public_part_of_a_task_is_the_prompt_and_the_marked_fields() -> None:
    assert public_task(ROW) == {"responses_create_params": ROW["responses_create_params"]}
    assert public_task(ROW, ("hint", "absent")) == {
        "responses_create_params": ROW["responses_create_params"],
        "hint": "it is on a river",
    }


async def test_a_program_reads_the_prompt_and_the_public_fields_never_the_gold() -> None:
    script = "import json, sys\nprint(json.dumps(json.load(sys.stdin)['task']))\n"
    turn = _turn([1], [2], finish_reason="stop")
    record = CaptureRecord(calls=[CapturedTurn("chat.completions", [], turn, requested_model="gpt-4o")])
    settings = dataclasses.replace(SETTINGS, public_fields=("hint",))
    outcome = await _run([sys.executable, "-c", script], CaptureModel(record), task=ROW, settings=settings)
    seen = json.loads(outcome.program["stdout"])
    assert seen == {"responses_create_params": ROW["responses_create_params"], "hint": "it is on a river"}
    assert outcome.program["models"] == [{"requested": "gpt-4o", "answered": "", "calls": 1}]
