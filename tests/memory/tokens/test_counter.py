"""Token estimation (docs/memory.md §5; docs/memory.md F-19 .. F-22)."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory.tokens.counter import FALLBACK_ENCODING, get_counter
from tests.memory.builders import COUNTER, asst, user


def test_f19_cjk_is_counted_per_token_not_chars_over_four():
    text = "我们今天讨论记忆管理系统的压缩策略和工具调用的配对规则" * 72
    text = text[:2000]
    tokens = COUNTER.count_text(text)
    assert 1500 <= tokens <= 2600, tokens
    assert tokens > 2 * (len(text) // 4)


def test_f20_tool_schemas_and_tool_call_arguments_count():
    plain = COUNTER.count_message(asst("x"))
    with_call = COUNTER.count_message(
        {
            **asst("x", tc=["call_1"]),
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "kb_search", "arguments": '{"query": "' + "refund policy " * 50 + '"}'},
                }
            ],
        }
    )
    assert with_call > plain + 100
    schema = [
        {
            "type": "function",
            "function": {
                "name": "kb_search",
                "description": "Search the knowledge base " * 10,
                "parameters": {"type": "object"},
            },
        }
    ]
    assert COUNTER.count_request([user("hi")], schema) > COUNTER.count_request([user("hi")]) + 50


def test_f21_special_token_strings_are_text():
    assert COUNTER.count_text("before <|endoftext|> after <|fim_prefix|>") > 5
    assert COUNTER.count_message(user("<|endoftext|>")) > 3


def test_f22_unknown_model_uses_the_shipped_encoding_without_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("token counting tried to reach the network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    get_counter.cache_clear()
    counter = get_counter("my-local-model")
    assert counter.name == FALLBACK_ENCODING
    assert counter.count_text("hello world") == 2


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4", "deepseek-chat", "llama3.1:8b"])
def test_known_and_unknown_models_get_a_working_offline_counter(model):
    assert get_counter(model).count_text("hello world") == 2


def test_message_overhead_and_names_are_counted():
    bare = COUNTER.count_text("hello")
    assert COUNTER.count_message(user("hello")) == bare + 3 + COUNTER.count_text("user")
    named = {"role": "tool", "content": "hello", "name": "kb_search", "tool_call_id": "c1"}
    assert COUNTER.count_message(named) > COUNTER.count_message({"role": "tool", "content": "hello"})


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=300)
    | st.sampled_from(["<|endoftext|>", "<|fim_prefix|>x", "你好" * 50])
)
def test_counting_any_text_never_raises_and_matches_the_encoding(text):
    assert COUNTER.count_text(text) == len(COUNTER.encoding.encode(text, disallowed_special=()))
    assert COUNTER.truncate_text(text, 5) == text or COUNTER.count_text(COUNTER.truncate_text(text, 5)) <= 6
