"""scheduler/json_encode.py: the encoder made once writes what json's JSONEncoder writes, and fails
as it does."""

from __future__ import annotations

import enum
import json
import math
from typing import Any

import pytest

from rollmesh.scheduler.json_encode import encoder


class _Color(enum.IntEnum):
    RED = 1


VALUES: list[Any] = [
    {"a": 1, "b": [1.5, -0.0, 1e16, 1e-05, 1.5e-07, math.nan, math.inf, -math.inf], "c": None, "d": True},
    {"ünï": 'cödé ☃ \u2028 \x00 \n " \\ \ud800', 1: "int key", 2.5: "float key", None: 0, False: 1},
    [(1, 2), [], {}, "", 10**40, -(10**40), _Color.RED, {"nested": {"deep": [[[]]]}}],
    "a top-level string ☃",
    3.25,
    12,
    None,
    {"responses_create_params": {"input": [{"role": "user", "content": "What is 98 + 39?"}]}},
]


@pytest.mark.parametrize("ensure_ascii", [False, True])
@pytest.mark.parametrize("separators", [None, (",", ":")])
def test_the_same_text_as_json(ensure_ascii: bool, separators: tuple[str, str] | None) -> None:
    mine = encoder(ensure_ascii=ensure_ascii, separators=separators)
    theirs = json.JSONEncoder(ensure_ascii=ensure_ascii, separators=separators, check_circular=False).encode
    for value in VALUES:
        assert mine(value) == theirs(value)
        assert mine(value) == mine(value)  # one encoder, any number of calls


def test_the_same_errors_as_json_and_the_encoder_goes_on_after_one() -> None:
    mine = encoder(ensure_ascii=False, separators=(",", ":"))
    theirs = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode
    for bad in ({"x": {1, 2}}, [b"bytes"], {(1, 2): "tuple key"}, {"x": object()}):
        with pytest.raises(TypeError) as want:
            theirs(bad)
        with pytest.raises(TypeError) as got:
            mine(bad)
        assert str(got.value) == str(want.value)
    assert mine({"ok": [1]}) == '{"ok":[1]}'
