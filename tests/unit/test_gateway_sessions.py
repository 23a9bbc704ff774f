"""Token-exact multi-turn: kept ids are never re-tokenized; session store eviction."""

from __future__ import annotations

from rollmesh.gateway.backends.fake import FakeTokenizer
from rollmesh.gateway.sessions import FreshPromptCache
from rollmesh.gateway.sessions import SessionState
from rollmesh.gateway.sessions import SessionStore
from rollmesh.gateway.sessions import build_prompt
from rollmesh.gateway.sessions import naive_prompt_ids
from rollmesh.gateway.sessions import render
from rollmesh.gateway.sessions import tools_key
from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.chat import ToolSpec

TOK = FakeTokenizer()


def _turn(
    messages: tuple[Message, ...], output_ids: list[int], *, tools: tuple[ToolSpec, ...] = ()
) -> SessionState:
    """The session after the policy answered `messages` with `output_ids`."""
    prompt = build_prompt(TOK, messages, tools, None, model="m")
    eos = TOK.eos_token_id
    body = output_ids[:-1] if output_ids[-1] == eos else output_ids
    reply = Message("assistant", TOK.decode(body))
    return SessionState(
        session_id="s",
        model="m",
        tools_key=tools_key(tools),
        messages=(*messages, reply),
        token_ids=(*prompt.token_ids, *output_ids),
    )


def test_tokenizer_has_a_non_canonical_tokenization() -> None:
    assert TOK.encode("12") != TOK.char_ids("12")
    assert TOK.decode(TOK.encode("12")) == TOK.decode(TOK.char_ids("12")) == "12"


def test_next_prompt_keeps_policy_ids_where_naive_retokenization_changes_them() -> None:
    first = (Message("user", "what is 5+7?"),)
    # The policy spelled "12" one character per token (not the tokenizer's canonical "12" token).
    state = _turn(first, [*TOK.char_ids("12"), TOK.eos_token_id])
    convo = (*state.messages, Message("user", "and 6+6?"))

    prompt = build_prompt(TOK, convo, (), state, model="m")
    naive = naive_prompt_ids(TOK, convo, ())

    assert prompt.token_ids[: len(state.token_ids)] == state.token_ids  # the invariant
    assert prompt.reused_prefix_tokens == len(state.token_ids)
    assert prompt.fresh_reason == ""
    assert list(prompt.token_ids) != naive  # naive re-tokenization rewrote the policy's tokens
    assert TOK.encode("12")[0] in naive and TOK.encode("12")[0] not in prompt.token_ids
    assert TOK.decode(prompt.token_ids) == TOK.decode(naive)  # same text, different ids


def test_canonical_turns_match_a_full_rendering_exactly() -> None:
    first = (Message("system", "be brief"), Message("user", "hi"))
    state = _turn(first, [*TOK.encode("hello"), TOK.eos_token_id])
    convo = (*state.messages, Message("user", "again"))
    prompt = build_prompt(TOK, convo, (), state, model="m")
    assert list(prompt.token_ids) == naive_prompt_ids(TOK, convo, ())


def test_length_stopped_turn_gets_the_whole_closer() -> None:
    first = (Message("user", "count"),)
    state = _turn(first, TOK.encode("1 2 3"))  # no eos: cut by max_tokens
    convo = (*state.messages, Message("user", "go on"))
    prompt = build_prompt(TOK, convo, (), state, model="m")
    assert prompt.token_ids[: len(state.token_ids)] == state.token_ids
    added = TOK.decode(prompt.token_ids[len(state.token_ids) :])
    assert added == "<|end|>\n<|user|>\ngo on<|end|>\n<|assistant|>\n"


def test_tool_turns_extend_with_tools_in_the_system_prompt() -> None:
    tools = (ToolSpec("add", "adds", '{"type": "object"}'),)
    first = (Message("user", "5+7?"),)
    call_text = '<tool_call>{"name": "add", "arguments": {"a": 5, "b": 7}}</tool_call>'
    prompt0 = build_prompt(TOK, first, tools, None, model="m")
    out = [*TOK.char_ids(call_text), TOK.eos_token_id]
    reply = Message("assistant", "", (ToolCall("call_0", "add", '{"a": 5, "b": 7}'),))
    state = SessionState("s", "m", tools_key(tools), (*first, reply), (*prompt0.token_ids, *out))
    # The client echoes the call back with its own spacing and id, then the tool result.
    echoed = Message("assistant", "", (ToolCall("x", "add", '{"b":7,"a":5}'),))
    convo = (*first, echoed, Message("tool", "12", tool_call_id="x"))
    prompt = build_prompt(TOK, convo, tools, state, model="m")
    assert prompt.fresh_reason == ""
    assert prompt.token_ids[: len(state.token_ids)] == state.token_ids
    assert TOK.decode(prompt.token_ids[len(state.token_ids) :]) == "\n<|tool|>\n12<|end|>\n<|assistant|>\n"


def test_rewritten_history_model_or_tools_change_start_fresh() -> None:
    first = (Message("user", "what is 5+7?"),)
    state = _turn(first, [*TOK.char_ids("12"), TOK.eos_token_id])
    rewritten = (Message("user", "what is 5+8?"), Message("assistant", "12"), Message("user", "sure?"))
    cases = [
        (build_prompt(TOK, rewritten, (), state, model="m"), "history_rewritten"),
        (
            build_prompt(TOK, (*state.messages, Message("user", "x")), (), state, model="other"),
            "model_changed",
        ),
        (
            build_prompt(TOK, (*state.messages, Message("user", "x")), (ToolSpec("t"),), state, model="m"),
            "tools_changed",
        ),
    ]
    for prompt, reason in cases:
        assert prompt.fresh_reason == reason
        assert prompt.reused_prefix_tokens == 0
    full = build_prompt(TOK, rewritten, (), state, model="m")
    assert list(full.token_ids) == TOK.encode(render(TOK, rewritten, [], add_generation_prompt=True))


def test_store_ttl_lru_cap_and_close() -> None:
    now = [0.0]
    store = SessionStore(ttl_s=10, max_sessions=2, clock=lambda: now[0])

    def st(sid: str, replica: str = "r0") -> SessionState:
        return SessionState(sid, "m", "[]", (), (1,), replica)

    store.put(st("a"))
    store.put(st("b", "r1"))
    assert store.get("a") is not None  # a is now most recently used
    store.put(st("c"))  # cap 2: evicts b, the least recently used
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None
    assert store.sessions_per_replica("m") == {"r0": 2}
    now[0] = 5.0
    assert store.get("a") is not None  # refreshes a
    now[0] = 12.0  # c idle 12s > ttl; a idle 7s
    assert store.get("c") is None and store.get("a") is not None
    assert store.close("a") is True and store.close("a") is False
    assert len(store) == 0


def test_fresh_prompts_render_once_per_conversation_and_the_cache_is_bounded() -> None:
    rendered: list[int] = []

    class CountingTokenizer(FakeTokenizer):
        def apply_chat_template(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
            rendered.append(1)
            return super().apply_chat_template(*args, **kwargs)  # type: ignore[arg-type]

    tok = CountingTokenizer()
    cache = FreshPromptCache(max_entries=2)
    ask = (Message("user", "What is 2 + 3?"),)
    tool = (ToolSpec.of("add", "adds", {"type": "object"}),)
    first = build_prompt(tok, ask, (), None, model="m", fresh_cache=cache)
    again = build_prompt(tok, ask, (), None, model="m", fresh_cache=cache)
    assert again.token_ids == first.token_ids == build_prompt(tok, ask, (), None, model="m").token_ids
    assert len(rendered) == 2  # once through the cache, once without it
    with_tools = build_prompt(tok, ask, tool, None, model="m", fresh_cache=cache)
    other_model = build_prompt(tok, ask, (), None, model="n", fresh_cache=cache)
    assert with_tools.token_ids != first.token_ids and other_model.token_ids == first.token_ids
    assert len(rendered) == 4 and len(cache) == 2  # the oldest entry was evicted
    build_prompt(tok, ask, (), None, model="m", fresh_cache=cache)
    assert len(rendered) == 5


def test_a_turn_cut_after_a_character_the_closer_starts_with_still_gets_the_closer_token() -> None:
    """The closer's text was matched character by character: a turn cut by max_tokens right after a
    literal "<" counted as having emitted the closer's first character, so the next prompt went on
    with the text "|end|>" (plain-character ids) instead of the end-of-turn token."""
    first = (Message("user", "is 1 < 2?"),)
    state = _turn(first, TOK.encode("yes, 1 <"))  # no eos: cut by max_tokens
    convo = (*state.messages, Message("user", "go on"))
    prompt = build_prompt(TOK, convo, (), state, model="m")
    added = list(prompt.token_ids[len(state.token_ids) :])
    assert prompt.token_ids[: len(state.token_ids)] == state.token_ids
    assert added[0] == TOK.eos_token_id
    assert added == TOK.encode("<|end|>\n<|user|>\ngo on<|end|>\n<|assistant|>\n")


def test_an_echoed_tool_call_with_arguments_nested_too_deeply_compares_as_text() -> None:
    """A client echoing a session's history with such arguments made the gateway answer 500 / INTERNAL
    (RecursionError out of the comparison of turns); unparsable arguments compare as their text."""
    deep = "[" * 100_000 + "]" * 100_000
    turn = Message("assistant", "", tool_calls=(ToolCall("c1", "f", deep),))
    assert turn.same_turn(Message("assistant", "", tool_calls=(ToolCall("c2", "f", deep),)))
    assert not turn.same_turn(Message("assistant", "", tool_calls=(ToolCall("c1", "f", deep + " "),)))
