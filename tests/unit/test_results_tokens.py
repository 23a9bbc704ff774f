"""Token records: multi-turn tool-using sequences line up turn by turn; drift fails validation."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rollmesh.cli import build_app
from rollmesh.scheduler.errors import TokenRecordMismatch
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.records import TurnSpan
from rollmesh.scheduler.tokens import build_token_record
from rollmesh.scheduler.tokens import validate_rollout
from rollmesh.scheduler.tokens import validate_token_record


@dataclass(frozen=True)
class TurnOutput:
    """What the gateway returned for one model turn (build_token_record's `TurnLike`)."""

    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    logprobs: Sequence[float] = ()
    policy_version: str = ""
    replica_id: str = ""


MODEL = Path(__file__).resolve().parents[2] / "services/rollmesh/builtin/models/tiny-arith"


def test_three_turns_line_up() -> None:
    turns = [
        TurnOutput([1, 2, 3], [10, 11], [-0.1, -0.2], "3", "r0"),
        TurnOutput([1, 2, 3, 10, 11, 20, 21], [12, 13], [-0.3, -0.4], "3", "r0"),
        TurnOutput([1, 2, 3, 10, 11, 20, 21, 12, 13, 22], [14], [-0.5], "4", "r1"),
    ]
    rec = build_token_record(turns)
    assert rec.token_ids == [1, 2, 3, 10, 11, 20, 21, 12, 13, 22, 14]
    assert rec.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 1]
    assert rec.logprobs == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.3, -0.4, 0, -0.5])
    assert rec.turns == [
        TurnSpan(0, 3, 5, "3", "r0"),
        TurnSpan(5, 7, 9, "3", "r0"),
        TurnSpan(9, 10, 11, "4", "r1"),
    ]
    # Generated ids, turn by turn, are exactly what the gateway returned.
    for span, turn in zip(rec.turns, turns, strict=True):
        assert rec.token_ids[span.output_start : span.output_end] == list(turn.output_token_ids)
    assert validate_token_record(rec, completion_tokens=5) == []


def test_no_logprobs_means_zeros() -> None:
    rec = build_token_record([TurnOutput([1], [2, 3])])
    assert rec.logprobs == [0.0, 0.0, 0.0] and rec.loss_mask == [0, 1, 1]


def test_a_prompt_that_rewrites_earlier_ids_is_a_mismatch() -> None:
    with pytest.raises(TokenRecordMismatch) as info:
        build_token_record([TurnOutput([1, 2, 3], [10, 11]), TurnOutput([1, 2, 3, 10, 99, 20], [12])])
    assert info.value.reason == "TOKEN_RECORD_MISMATCH"
    assert "turn 2" in info.value.message and "position 4" in info.value.message
    with pytest.raises(TokenRecordMismatch, match="2 output ids but 1 logprobs"):
        build_token_record([TurnOutput([1], [2, 3], [-0.1])])


def test_structural_drift_is_reported_with_reasons() -> None:
    rec = build_token_record([TurnOutput([1, 2], [3, 4]), TurnOutput([1, 2, 3, 4, 5], [6])])
    short = TokenRecord(rec.token_ids, rec.loss_mask[:-1], rec.logprobs, rec.turns)
    assert "length mismatch" in validate_token_record(short)[0]
    shifted = TokenRecord(rec.token_ids, [0, 1, 1, 0, 0, 1], rec.logprobs, rec.turns)
    reasons = validate_token_record(shifted)
    assert any("turn 1: generated id at position 3 is masked out" in r for r in reasons)
    assert any("outside the generated spans (first at position 1)" in r for r in reasons)
    gap = TokenRecord(rec.token_ids, rec.loss_mask, rec.logprobs, [rec.turns[0], TurnSpan(5, 5, 6)])
    assert any("prompt_start 5 != previous turn's end 4" in r for r in validate_token_record(gap))
    assert "usage says 9 completion tokens" in validate_token_record(rec, completion_tokens=9)[0]
    for bound in ("4", None, 1.5, [4]):  # a stored row's: was a TypeError out of `rollmesh validate`
        odd = TokenRecord(rec.token_ids, rec.loss_mask, rec.logprobs, [TurnSpan(0, bound, 4)])  # type: ignore[arg-type]
        assert (
            "turn 1: span [0, " in validate_token_record(odd)[0]
            and "not three integers" in validate_token_record(odd)[0]
        )


# -- with the shipped tiny tokenizer: decoded spans equal the assistant messages ------------------


@pytest.fixture(scope="module")
def tok() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL))


def tool_rollout(tok: Any, final_answer_ids: list[int] | None = None) -> Rollout:
    """user asks, assistant calls a tool, the tool answers, assistant answers: two model turns."""

    def enc(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    call = '{"name": "calculator", "arguments": {"expr": "12+7"}}'
    rendered = tok.apply_chat_template([{"role": "user", "content": "12+7?"}], add_generation_prompt=True)
    prompt1 = enc(rendered) if isinstance(rendered, str) else list(rendered["input_ids"])
    out1 = [*enc("<tool_call>" + call + "</tool_call>"), tok.eos_token_id]
    glue = enc("\n<|tool|>\n19<|end|>\n<|assistant|>\n")
    out2 = final_answer_ids if final_answer_ids is not None else [*enc("The answer is 19"), tok.eos_token_id]
    rec = build_token_record(
        [
            TurnOutput(prompt1, out1, [-0.5] * len(out1), "1", "r0"),
            TurnOutput(prompt1 + out1 + glue, out2, [-0.25] * len(out2), "1", "r0"),
        ]
    )
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expr": "12+7"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "19"},
        {"role": "assistant", "content": "The answer is 19"},
    ]
    return Rollout(
        key=RolloutKey(0, 1),
        job_id="j",
        task={"expected_answer": "19"},
        messages=messages,
        reward=1.0,
        tokens=rec,
        completion_tokens=len(out1) + len(out2),
    )


def test_tool_using_rollout_validates_against_the_tokenizer(tok: Any) -> None:
    r = tool_rollout(tok)
    assert validate_rollout(r, tokenizer=tok) == []
    span = r.tokens.turns[1]
    assert (
        tok.decode(r.tokens.token_ids[span.prompt_start : span.output_start])
        == "\n<|tool|>\n19<|end|>\n<|assistant|>\n"
    )


def test_a_drifted_record_fails_with_a_clear_reason(tok: Any) -> None:
    # The generated ids of turn 2 are not what the message says (e.g. text re-tokenized after an edit).
    drifted = tool_rollout(tok, final_answer_ids=tok.encode("The answer is 91", add_special_tokens=False))
    reasons = validate_rollout(drifted, tokenizer=tok)
    assert reasons == [
        'turn 2: decoded ids "The answer is 91" differ from the assistant content "The answer is 19" '
        "at character 14"
    ]
    no_call = tool_rollout(tok)
    no_call.messages[0]["tool_calls"][0]["function"]["name"] = "search"
    assert "do not mention tool call(s) ['search']" in validate_rollout(no_call, tokenizer=tok)[0]
    # The tool ran with arguments the ids do not hold.
    other_args = tool_rollout(tok)
    other_args.messages[0]["tool_calls"][0]["function"]["arguments"] = '{"expr": "12+8"}'
    assert "do not mention tool call(s) ['12+8']" in validate_rollout(other_args, tokenizer=tok)[0]
    deep = tool_rollout(tok)  # arguments nested too deeply were a RecursionError out of `rollmesh validate`
    deep.messages[0]["tool_calls"][0]["function"]["arguments"] = "[" * 100_000 + "]" * 100_000
    assert validate_rollout(deep, tokenizer=tok) == []  # unreadable arguments: only the name is checked


def test_validate_cli(tok: Any, tmp_path: Path) -> None:
    good, bad = tool_rollout(tok), tool_rollout(tok, tok.encode("The answer is 91", add_special_tokens=False))
    bad.key = RolloutKey(3, 0)
    (tmp_path / "good.jsonl").write_text(json.dumps(good.to_row()) + "\n")
    (tmp_path / "mixed.jsonl").write_text(json.dumps(good.to_row()) + "\n" + json.dumps(bad.to_row()) + "\n")
    runner = CliRunner()
    ok = runner.invoke(build_app(), ["validate", str(tmp_path / "good.jsonl"), "--tokenizer", str(MODEL)])
    assert ok.exit_code == 0, ok.output
    res = runner.invoke(build_app(), ["validate", str(tmp_path / "mixed.jsonl"), "--tokenizer", str(MODEL)])
    assert res.exit_code == 1
    assert f"{tmp_path / 'mixed.jsonl'}:2 rollout 3:0: turn 2: decoded ids" in res.stdout
    missing = runner.invoke(build_app(), ["validate", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2 and "no such file" in missing.stderr


# -- what the record holds when the server's answer cannot be trained on --------------------------


def test_a_server_that_returns_no_token_ids_gives_no_record_not_empty_spans() -> None:
    # A plain OpenAI server: no ids; some send logprobs anyway (they cannot be placed on any id).
    plain = [TurnOutput([], [], [-0.1, -0.2]), TurnOutput([], [])]
    rec = build_token_record(plain)
    assert rec == TokenRecord()
    rollout = Rollout(RolloutKey(0, 0), "j", {}, [{"role": "assistant", "content": "hi"}], 1.0, tokens=rec)
    assert validate_rollout(rollout) == [
        "no token record (token_ids empty: the model server returned no token ids)"
    ]
    with pytest.raises(TokenRecordMismatch, match="turn 2 came back without token ids"):
        build_token_record([TurnOutput([1], [2]), TurnOutput([], [3])])


def test_logprobs_the_job_asked_for_and_did_not_get_are_a_mismatch_not_zeros() -> None:
    turns = [TurnOutput([1], [2, 3], [-0.1, -0.2]), TurnOutput([1, 2, 3, 4], [5])]
    assert build_token_record(turns).logprobs == pytest.approx([0, -0.1, -0.2, 0, 0])
    with pytest.raises(TokenRecordMismatch, match="asked for logprobs but turn 2 came back with 1 generated"):
        build_token_record(turns, logprobs_wanted=True)
    # A turn that generated nothing has nothing to miss.
    assert build_token_record([TurnOutput([1], [])], logprobs_wanted=True).token_ids == [1]


def test_a_turn_that_ended_on_eos_decodes_to_exactly_its_content(tok: Any) -> None:
    # The ids say 190, the message (and so the reward) says 19: not a stop string, a different answer.
    longer = tool_rollout(tok, [*tok.encode("The answer is 190", add_special_tokens=False), tok.eos_token_id])
    assert validate_rollout(longer, tokenizer=tok) == [
        'turn 2: decoded ids "The answer is 190" differ from the assistant content "The answer is 19" '
        "at character 16"
    ]
    # Without an eos the turn may have been cut by a stop string, which the content leaves out.
    cut = tool_rollout(tok, tok.encode("The answer is 19 STOP", add_special_tokens=False))
    assert validate_rollout(cut, tokenizer=tok) == []


def test_values_on_generated_ids_that_are_no_logprobs_are_reported() -> None:
    rec = build_token_record([TurnOutput([1], [2, 3, 4], [-0.5, 1.25, float("nan")])])
    assert validate_token_record(rec) == [
        "logprobs of 2 generated ids are not log-probabilities (> 0, infinite or NaN; first at 2: 1.25)"
    ]
    assert validate_token_record(build_token_record([TurnOutput([1], [2], [0.0])])) == []  # p = 1


def test_a_record_says_whether_it_holds_logprobs_and_old_rows_still_load() -> None:
    without = build_token_record([TurnOutput([1], [2, 3])])
    with_them = build_token_record([TurnOutput([1], [2, 3], [-0.1, 0.0])])
    assert (without.logprobs_recorded, with_them.logprobs_recorded) == (False, True)
    for rec in (without, with_them):
        row = Rollout(RolloutKey(0, 0), "j", {}, [], 1.0, tokens=rec).to_row()
        assert row["tokens"]["logprobs_recorded"] is rec.logprobs_recorded
        assert Rollout.from_row(row).tokens == rec
        # A row written before the field: recorded when a generated id has a non-zero logprob.
        del row["tokens"]["logprobs_recorded"]
        assert Rollout.from_row(row).tokens == rec
    # Turns of which only some brought logprobs: the zeros of the others are not the policy's.
    assert not build_token_record(
        [TurnOutput([1], [2], [-0.1]), TurnOutput([1, 2, 3], [4])]
    ).logprobs_recorded
