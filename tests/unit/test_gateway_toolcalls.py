"""Tool-call parsing out of generated text, and the streaming content filter."""

from __future__ import annotations

import json

from rollmesh.gateway.toolcalls import ContentStreamFilter
from rollmesh.gateway.toolcalls import call_id_prefix
from rollmesh.gateway.toolcalls import parse_tool_calls


def test_one_call_is_parsed_and_removed_from_content() -> None:
    p = parse_tool_calls('Let me add.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    assert p.content == "Let me add."
    assert [(c.id, c.name, json.loads(c.arguments_json)) for c in p.tool_calls] == [
        ("call_0", "add", {"a": 1, "b": 2})
    ]


def test_several_calls_keep_order_and_ids() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call> and '
        '<tool_call>{"name": "b", "arguments": {"x": "y"}}</tool_call>'
    )
    p = parse_tool_calls(text, id_prefix="call_r1_")
    assert [c.name for c in p.tool_calls] == ["a", "b"]
    assert [c.id for c in p.tool_calls] == ["call_r1_0", "call_r1_1"]
    assert p.content == " and "


def test_call_ids_digest_the_whole_request_id() -> None:
    """Request ids of one job share their start (`<job>/<task>/<rollout>/<n>`): the id prefix must
    differ when any of it does, and stay the same for the same request id (re-runs, both drivers)."""
    rids = [f"a-long-job-id/{t}/{r}/{n}" for t in range(3) for r in range(3) for n in range(3)]
    prefixes = [call_id_prefix(rid) for rid in rids]
    assert len(set(prefixes)) == len(rids)
    assert call_id_prefix(rids[0]) == prefixes[0] and prefixes[0].startswith("call_")
    assert call_id_prefix("\udc80") != call_id_prefix("")  # a lone surrogate is still an id


def test_malformed_json_stays_in_content_and_is_not_a_call() -> None:
    text = 'x<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>y'
    p = parse_tool_calls(text)
    assert p.tool_calls == ()
    assert p.content == text


def test_json_nested_past_the_recursion_limit_stays_in_content() -> None:
    text = "<tool_call>" + "[" * 100_000 + "</tool_call>"  # json.loads raises RecursionError here
    parsed = parse_tool_calls(text)
    assert parsed.content == text and parsed.tool_calls == ()


def test_malformed_block_does_not_hide_a_later_valid_one() -> None:
    bad = "<tool_call>not json</tool_call>"
    good = '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    p = parse_tool_calls(bad + good)
    assert [c.name for c in p.tool_calls] == ["ok"]
    assert p.content == bad


def test_missing_name_unclosed_block_and_non_object_arguments_are_not_calls() -> None:
    for text in (
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {}}',
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>',
        '<tool_call>["add"]</tool_call>',
    ):
        p = parse_tool_calls(text)
        assert p.tool_calls == (), text
        assert p.content == text


def test_arguments_missing_means_empty_object_and_text_arguments_pass_through() -> None:
    p = parse_tool_calls('<tool_call>{"name": "now"}</tool_call>')
    assert p.tool_calls[0].arguments_json == "{}"
    p = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert p.tool_calls[0].arguments_json == '{"a": 1}'


def test_plain_text_is_untouched() -> None:
    p = parse_tool_calls("  the answer is 12\n")
    assert p == parse_tool_calls("  the answer is 12\n")
    assert p.content == "  the answer is 12\n" and p.tool_calls == ()


def test_stream_filter_never_shows_markup_and_ends_with_the_parsed_content() -> None:
    text = 'I will call <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    f = ContentStreamFilter()
    shown = "".join(f.feed(ch) for ch in text)  # one character at a time: partial tags are held back
    assert "<" not in shown
    parsed = parse_tool_calls(text)
    assert shown + f.finish(parsed.content) == parsed.content == "I will call "


def test_stream_filter_passes_plain_text_and_releases_a_false_alarm() -> None:
    f = ContentStreamFilter()
    assert f.feed("a <tool") == "a "
    assert f.feed("box") == "<toolbox"
    assert f.finish("a <toolbox") == ""
