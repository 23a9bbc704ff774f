"""reasoning_gym, adversarially (issue 38): the scored answer is the final assistant message's,
outside think blocks. Each forgery below scored 1.0 when the assistant's messages were joined and
read as NeMo Gym's server reads them: the only `<answer>` inside `<think>…</think>`, an answer in
an earlier assistant message, the first `\\boxed{}` where a later one corrects it. NeMo Gym's
reading stays available as an option (ROLLMESH_VERIFIER_REASONING_GYM_READING=nemo_gym, or a
task's `verifier_metadata.answer_reading`) and reproduces it."""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rollmesh.mesh.answer_text import outside_think
from rollmesh.procedural.scoring import extract
from rollmesh.verifier import Message
from rollmesh.verifier import Response
from rollmesh.verifier import Task
from rollmesh.verifier.testing import TEST_CONFIG
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env

HERE = Path(__file__).resolve().parent.parent
ROWS = [json.loads(line) for line in (HERE / "data" / "example.jsonl").read_text().splitlines()]
ROW = next(r for r in ROWS if r["metadata"]["source_dataset"] == "chain_sum")
GOLD = str(ROW["answer"])
WRONG = str(int(GOLD) + 1)


def said(*texts: str) -> Response:
    return Response(tuple(Message("assistant", t) for t in texts))


# (what the policy wrote, as assistant messages): each scores 0 read as the final message outside
# think blocks, and each scored 1 (the gold) read as NeMo Gym's server reads it.
FORGERIES: list[tuple[str, ...]] = [
    (f"<think>maybe <answer>{GOLD}</answer></think>I am not sure.",),
    (f"<think><answer>{GOLD}</answer></think>",),
    (f"<answer>{GOLD}</answer>", "On reflection, no answer."),
    (f"\\boxed{{{GOLD}}}", f"Hmm, maybe \\boxed{{{WRONG}}}"),
    (f"\\boxed{{{GOLD}}} ... wait, that is wrong: \\boxed{{{WRONG}}}",),
    (f"<THINK><answer>{GOLD}</answer></THINK>{WRONG}",),
    (f"<thinking><answer>{GOLD}</answer></thinking>{WRONG}",),
    (f"<answer>{GOLD}</answer></think>{WRONG}",),  # a lone </think>: what precedes it was thinking
]
# Right answers, read right: the answer outside the think block, in the final message.
RIGHT: list[tuple[str, ...]] = [
    (f"<think>is it <answer>{WRONG}</answer>? no</think><answer>{GOLD}</answer>",),
    (f"<answer>{WRONG}</answer>", f"Corrected: <answer>{GOLD}</answer>"),
    (f"\\boxed{{{WRONG}}} ... wait, that is wrong: \\boxed{{{GOLD}}}",),
    (f"thinking...</think>\n<answer>{GOLD}</answer>",),
    (f"<think>long thought</think>\n\nThe sum is \\boxed{{{GOLD}}}.",),
    (f"<answer>{GOLD}</answer><think>an afterthought that never closes",),
]


def scored(reward: float, fails: list[Any]) -> None:
    assert not fails, f"should score {reward}: {fails}"


async def test_forgeries_score_0_and_nemo_gyms_reading_scored_them_1() -> None:
    async with load_env(HERE) as env:
        fails = []
        for texts in FORGERIES:
            r = await check(env, Task(ROW), said(*texts))
            if r.reward != 0.0:
                fails.append((texts, r))
        scored(0.0, fails)
        nemo = Task({**ROW, "verifier_metadata": {"answer_reading": "nemo_gym"}})
        scored(1.0, [t for t in FORGERIES if (await check(env, nemo, said(*t))).reward != 1.0])


async def test_right_answers_outside_think_blocks_score_1() -> None:
    async with load_env(HERE) as env:
        fails = []
        for texts in RIGHT:
            r = await check(env, Task(ROW), said(*texts))
            if (r.reward, r.extracted_answer) != (1.0, GOLD):
                fails.append((texts, r))
        scored(1.0, fails)


def test_the_reading_in_parts() -> None:
    assert outside_think("<think>a</think>b<think>c</think>d") == "d"
    assert outside_think("a</think>b") == "b"
    assert outside_think("a<think>b") == "a"
    assert extract(f"\\boxed{{\\frac{{1}}{{2}}}} then \\boxed{{{GOLD}}}") == GOLD
    assert extract("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"  # NeMo Gym's regex read `\frac{1`
    assert extract("\\boxed{\\frac{1}{2}}", "nemo_gym") == "\\frac{1"
    assert extract(f"<think><answer>{GOLD}</answer></think>", "nemo_gym") == GOLD
    assert extract(f"<think><answer>{GOLD}</answer></think>") == ""


async def test_the_verifier_wide_option_and_a_bad_one() -> None:
    nemo = replace(TEST_CONFIG, reasoning_gym_reading="nemo_gym")
    async with load_env(HERE, nemo) as env:
        r = await check(env, Task(ROW), said(*FORGERIES[0]))
        assert r.reward == 1.0  # as NeMo Gym's server scored it
    async with load_env(HERE) as env:
        from rollmesh.verifier import BadTask

        with pytest.raises(BadTask, match="answer_reading"):
            await check(env, Task({**ROW, "verifier_metadata": {"answer_reading": "first"}}), said(GOLD))
