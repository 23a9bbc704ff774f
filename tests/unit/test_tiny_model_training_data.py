"""The tiny model's reasoning-gym training data (scripts/train_tiny_model.py): no row the
`reasoning_gym_arith` benchmark asks, and no held-out pair, is trained on, and the answer format
it is taught scores full credit through the `reasoning_gym` environment's own extraction."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rollmesh.procedural import ProceduralSpec
from rollmesh.procedural.rows import generate_rows
from rollmesh.procedural.scoring import score

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def train_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "train_tiny_model", REPO / "scripts" / "train_tiny_model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_tiny_model"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_no_benchmark_row_and_no_heldout_pair_is_trained_on(train_script: ModuleType) -> None:
    split = train_script.load_split()
    rg = train_script.make_rg_splits(split, 3000)
    spec_path = train_script.RG_SPEC
    spec = ProceduralSpec.from_json(json.loads(spec_path.read_text()), where=str(spec_path))
    benchmark = list(generate_rows(spec))
    assert [it.question for it in rg.benchmark] == [row["question"] for row in benchmark]
    bench_pairs = {it.pair for it in rg.benchmark}
    assert len(rg.train) > 1500 and len(rg.val) > 100
    for item in rg.train:
        assert item.pair not in bench_pairs and not split.is_heldout(*item.pair), item
        assert item.question != train_script.user_message(*item.pair)  # the arithmetic task's own
    assert {it.question for it in rg.train}.isdisjoint(row["question"] for row in benchmark)
    for item in rg.val:
        assert split.is_heldout(*item.pair) and item.pair not in bench_pairs, item
    # Both generators, both chain_sum operators, in the training rows.
    assert any(it.question.startswith("State the final answer") and " - " in it.question for it in rg.train)
    assert any(it.question.startswith(("Solve", "Compute", "Evaluate")) for it in rg.train)


def test_the_taught_answers_score_as_the_environment_scores_them(train_script: ModuleType) -> None:
    spec_path = train_script.RG_SPEC
    spec = ProceduralSpec.from_json(json.loads(spec_path.read_text()), where=str(spec_path))
    rows = list(generate_rows(spec))
    for row in rows:
        item = train_script.rg_item(row)
        assert score(row, train_script.rg_answer(item.answer))["score"] == 1.0, row["question"]
    # `What is a + b?` rows get the arithmetic task's answer: partial credit, never full credit.
    what_is = [row for row in rows if row["question"].startswith("What is")]
    assert what_is
    for row in what_is:
        a, b = train_script.rg_item(row).pair
        got = score(row, train_script.assistant_message(a, b))["score"]
        assert 0.0 < got < 1.0, (row["question"], got)
