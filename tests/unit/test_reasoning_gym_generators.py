"""Every reasoning-gym generator that installs here, scored the way the `reasoning_gym` environment
scores (rollmesh.procedural.scoring.score, the function its worker runs) after a JSONL round trip:
the gold answer (or, for generators with no oracle answer, a valid answer they accept) scores 1.0,
an empty answer 0 and junk below a pass, none of them an error. One row per generator (size 1)."""

from __future__ import annotations

import collections
import copy
import json
from typing import Any

import pytest
import reasoning_gym

from rollmesh.procedural import GeneratorSpec
from rollmesh.procedural import ProceduralSpec
from rollmesh.procedural.rows import NOT_JSON_SAFE
from rollmesh.procedural.rows import SOURCE_FIELD
from rollmesh.procedural.rows import generate_rows
from rollmesh.procedural.rows import known_generators
from rollmesh.procedural.scoring import score

GENERATORS = known_generators()
# Scorers that give a little credit for any non-empty answer (a format reward): junk is not a pass.
JUNK_CEILING = 0.05
# Puzzles this test solves by search: the easy ones (rush_hour's default goes up to 50 moves).
CONFIGS: dict[str, dict[str, Any]] = {"rush_hour": {"max_moves": 6}}


def round_trip(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(row) + "\n")
    return out


def one_row(name: str) -> dict[str, Any]:
    spec = ProceduralSpec((GeneratorSpec(name, 1.0, CONFIGS.get(name, {})),), size=1, seed=11)
    return round_trip(next(generate_rows(spec)))


def rush_hour_moves(board_config: str) -> str:
    """A shortest solution by breadth-first search over single-step moves (the task has no oracle)."""
    from reasoning_gym.games.rush_hour import Board

    start = Board(board_config)
    movable = [i for i, p in enumerate(start._pieces) if not p.fixed]
    seen = {tuple(p.position for p in start._pieces)}
    frontier: collections.deque[tuple[Board, list[str]]] = collections.deque([(start, [])])
    while frontier:
        board, moves = frontier.popleft()
        if board.solved:
            return " ".join(moves)
        for i in movable:
            for step in (-1, 1):
                nxt = copy.deepcopy(board)
                nxt.move(chr(ord("A") + i), step)
                state = tuple(p.position for p in nxt._pieces)
                if state not in seen:
                    seen.add(state)
                    frontier.append((nxt, [*moves, f"{chr(ord('A') + i)}{'+' if step > 0 else '-'}1"]))
    raise AssertionError(f"rush hour board {board_config} has no solution")


def boxnet_plan(initial: dict[str, list[str]]) -> str:
    """Walk each box square by square to its target's square, one move per step, then match it."""
    where = {item: pos for pos, items in initial.items() for item in items}
    steps: list[dict[str, str]] = []
    for box, pos in sorted((i, p) for i, p in where.items() if i.startswith("box_")):
        goal = where["target_" + box[4:]]
        x, y = map(float, pos.split("_"))
        gx, gy = map(float, goal.split("_"))
        while (x, y) != (gx, gy):
            nx, ny = (x + (1 if gx > x else -1), y) if x != gx else (x, y + (1 if gy > y else -1))
            steps.append({f"Agent[{x}, {y}]": f"move({box}, square[{nx}, {ny}])"})
            x, y = nx, ny
        steps.append({f"Agent[{x}, {y}]": f"move({box}, target_{box[4:]})"})
    return json.dumps(steps)


def valid_answer(name: str, row: dict[str, Any]) -> str:
    """The gold answer, or for a generator that has none, one its scorer accepts."""
    meta = row["metadata"]
    if row["answer"] is not None:
        return str(row["answer"])
    if name == "graph_color":
        return json.dumps(meta["possible_answer"])
    if name == "propositional_logic":
        return str(meta["example_answer"])
    if name == "rubiks_cube":
        return str(meta["example_correct_answer"])
    if name == "rush_hour":
        return rush_hour_moves(meta["board_config"])
    if name == "boxnet":
        return boxnet_plan(meta["initial_state"])
    raise AssertionError(f"{name} has no gold answer and this test knows no valid one")


@pytest.mark.parametrize("name", GENERATORS)
def test_gold_scores_1_after_jsonl_and_empty_and_junk_do_not(name: str) -> None:
    row = one_row(name)
    gold = valid_answer(name, row)
    right = score(row, f"Thinking it over.\n<answer>{gold}</answer>")
    assert right.get("score") == 1.0, right
    empty = score(row, "<answer></answer>")
    assert (empty["score"], empty["reason"]) == (0.0, "no answer")
    for junk in ("zzz junk", "<answer>%%%</answer>"):
        wrong = score(row, junk)
        assert "bad_task" not in wrong and wrong["score"] <= JUNK_CEILING, (junk, wrong)
    # Scored from the stored metadata alone (as NeMo Gym's server does), the gold answer passes
    # for every generator but those whose rows are rebuilt; for those, such a row is refused.
    stored = {k: v for k, v in row.items() if k != SOURCE_FIELD}
    entry = {"question": row["question"], "answer": row["answer"], "metadata": row["metadata"]}
    from_metadata = reasoning_gym.get_score_answer_fn(name)(answer=gold, entry=entry)
    if name in NOT_JSON_SAFE:
        assert row[SOURCE_FIELD]["rebuild"] is True and from_metadata < 1.0
        assert "tuples" in score(stored, f"<answer>{gold}</answer>")["bad_task"]
    else:
        assert "rebuild" not in row[SOURCE_FIELD] and from_metadata == 1.0
        assert score(stored, f"<answer>{gold}</answer>")["score"] == 1.0
