"""Request shapes every common OpenAI-compatible server accepts, over real HTTP against the fake
server's llama.cpp-like quirks (tests/fake_openai.py): ``tool_choice`` with tools, ``content: ""``
where null is refused, ``stream_options`` refused with HTTP 500, the structured-output chain for
servers that answer ``json_schema`` with HTTP 500, usage that never comes, and a connection lost
before the first token. What an endpoint refused is remembered per base URL and model."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from chatapp.llm.clients import (
    JSON_SCHEMA,
    NULL_CONTENT,
    STREAM_OPTIONS,
    STREAMED_TOOLS,
    ChatEvent,
    Endpoint,
    LLMError,
    chat_stream,
    refused_shapes,
    shape_refused,
)
from chatapp.llm.summarizer import JSON_ONLY_INSTRUCTION, OpenAISummarizer, first_json_object, json_only_prompt
from memory.api import SummaryRequest
from memory.facts.extraction import EXTRACTION_SCHEMA, EXTRACTION_SCHEMA_NAME
from tests.fake_openai import FakeOpenAI, chunk, completion, dropped, error, stream, text_stream

CALL: dict[str, Any] = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "calculator", "arguments": '{"expression": "17*23"}'},
}
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
QUESTION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 17 x 23?"},
]
AFTER_CALL: list[dict[str, Any]] = [
    *QUESTION,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "391"},
]
CALL_STREAM = stream(
    chunk({"role": "assistant", "content": None}),
    chunk({"tool_calls": [{"index": 0, **CALL}]}),
    chunk(finish_reason="tool_calls"),
    chunk(usage={"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}),
)
SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": EXTRACTION_SCHEMA_NAME, "schema": EXTRACTION_SCHEMA, "strict": True},
}
FACTS = '{"facts": []}'


def endpoint_for(server: FakeOpenAI, *, model: str = "fake-model") -> Endpoint:
    return Endpoint(base_url=server.base_url, api_key="k", model=model, context_window=8192, timeout=5.0)


async def collect(endpoint: Endpoint, messages: list[dict[str, Any]], **kwargs: Any) -> list[ChatEvent]:
    return [event async for event in chat_stream(messages, endpoint=endpoint, **kwargs)]


def extraction_request(response_format: dict[str, Any] | None = SCHEMA_FORMAT) -> SummaryRequest:
    prompt = [{"role": "system", "content": "extract"}, {"role": "user", "content": "<new_messages>\n1. User: hi"}]
    return SummaryRequest(
        previous_summary="", messages=[], prompt=prompt, max_tokens=800, response_format=response_format
    )


def sent(server: FakeOpenAI, key: str) -> list[Any]:
    return [recorded.json.get(key) for recorded in server.requests]


# --- tools ------------------------------------------------------------------------------------


async def test_tools_go_with_tool_choice_auto_so_a_llama_cpp_server_calls_them(fake_openai: FakeOpenAI) -> None:
    fake_openai.llama_cpp().script(CALL_STREAM)

    events = await collect(endpoint_for(fake_openai), QUESTION, tools=TOOLS)

    assert events[0] == {"type": "tool_calls", "tool_calls": [CALL]}
    assert sent(fake_openai, "tool_choice") == ["auto"]


async def test_a_tool_request_streamed_empty_is_asked_again_whole_and_remembered(fake_openai: FakeOpenAI) -> None:
    fake_openai.tools_stream_empty = True
    fake_openai.script(completion(None, tool_calls=[CALL]))
    endpoint = endpoint_for(fake_openai)

    events = await collect(endpoint, QUESTION, tools=TOOLS)

    assert events[0] == {"type": "tool_calls", "tool_calls": [CALL]}
    assert events[1] == {"type": "usage", "prompt_tokens": 11, "completion_tokens": 7}
    assert events[-1] == {"type": "finish", "finish_reason": "tool_calls"}
    assert sent(fake_openai, "stream") == [True, None] and sent(fake_openai, "tools") == [TOOLS, TOOLS]
    assert "stream_options" not in fake_openai.requests[1].json
    assert STREAMED_TOOLS in refused_shapes(endpoint)

    # From then on a request with tools goes whole at once; one without tools still streams.
    fake_openai.script(completion("391 it is."))
    assert [e for e in await collect(endpoint, AFTER_CALL, tools=TOOLS) if e["type"] == "delta"] == [
        {"type": "delta", "text": "391 it is."}
    ]
    fake_openai.script(text_stream("Hi."))
    await collect(endpoint, QUESTION)
    assert sent(fake_openai, "stream")[2:] == [None, True]


async def test_a_stream_that_ends_without_a_finish_reason_is_an_error_keeping_its_text(fake_openai: FakeOpenAI) -> None:
    # llama.cpp's server ends a running stream this way when another request arrives.
    fake_openai.script(stream(chunk({"role": "assistant", "content": ""}), chunk({"content": "Kestrel Sync is"})))
    texts: list[str] = []

    async def read() -> None:
        async for event in chat_stream(QUESTION, endpoint=endpoint_for(fake_openai)):
            if event["type"] == "delta":
                texts.append(event["text"])

    with pytest.raises(LLMError) as ended:
        await read()
    assert texts == ["Kestrel Sync is"]
    assert ended.value.kind == "connection" and "before the reply was finished" in ended.value.message


async def test_an_empty_stream_without_tools_is_still_an_empty_reply(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(stream(chunk({"role": "assistant", "content": ""}), chunk(finish_reason="stop")))
    with pytest.raises(LLMError) as caught:
        await collect(endpoint_for(fake_openai), QUESTION)
    assert caught.value.kind == "empty" and len(fake_openai.requests) == 1


async def test_no_tool_choice_without_tools(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(text_stream("Hi."))
    await collect(endpoint_for(fake_openai), QUESTION)
    assert "tool_choice" not in fake_openai.requests[0].json


# --- content null beside tool calls -------------------------------------------------------------


async def test_null_content_refused_with_a_500_is_sent_as_empty_text_and_remembered(fake_openai: FakeOpenAI) -> None:
    fake_openai.llama_cpp().script(text_stream("391."))
    endpoint = endpoint_for(fake_openai)

    events = await collect(endpoint, AFTER_CALL, tools=TOOLS)

    assert "".join(event["text"] for event in events if event["type"] == "delta") == "391."
    contents = [recorded.json["messages"][2]["content"] for recorded in fake_openai.requests]
    assert contents == [None, ""], "refused once, asked again with content ''"
    assert NULL_CONTENT in refused_shapes(endpoint)

    await collect(endpoint, AFTER_CALL, tools=TOOLS)
    assert fake_openai.requests[2].json["messages"][2]["content"] == "", "no second refusal"
    assert len(fake_openai.requests) == 3
    assert NULL_CONTENT not in refused_shapes(endpoint_for(fake_openai, model="other-model"))


async def test_null_content_is_sent_as_null_by_default(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(text_stream("391."))
    await collect(endpoint_for(fake_openai), AFTER_CALL, tools=TOOLS)
    assert [recorded.json["messages"][2]["content"] for recorded in fake_openai.requests] == [None]


async def test_a_500_that_names_nothing_is_not_a_refused_shape(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(error(500, "model crashed"))
    endpoint = endpoint_for(fake_openai)

    with pytest.raises(LLMError) as caught:
        await collect(endpoint, AFTER_CALL, tools=TOOLS)

    assert caught.value.kind == "server"
    assert len(fake_openai.requests) == 1
    assert refused_shapes(endpoint) == frozenset()


# --- usage ----------------------------------------------------------------------------------------


async def test_stream_options_refused_with_a_500_naming_it_is_dropped_and_remembered(fake_openai: FakeOpenAI) -> None:
    fake_openai.stream_options_error = fake_openai.stream_usage_ignored = True
    fake_openai.script(text_stream("Hi."))
    endpoint = endpoint_for(fake_openai)

    first = await collect(endpoint, QUESTION)
    second = await collect(endpoint, QUESTION)

    assert ["stream_options" in recorded.json for recorded in fake_openai.requests] == [True, False, False]
    assert STREAM_OPTIONS in refused_shapes(endpoint)
    usage = {"type": "usage", "prompt_tokens": None, "completion_tokens": None, "missing": "not asked"}
    assert usage in first and usage in second


async def test_a_stream_without_a_usage_chunk_says_usage_was_not_reported(fake_openai: FakeOpenAI) -> None:
    fake_openai.llama_cpp().script(text_stream("Hi."))

    events = await collect(endpoint_for(fake_openai), QUESTION)

    assert events[-2:] == [
        {"type": "usage", "prompt_tokens": None, "completion_tokens": None, "missing": "not reported"},
        {"type": "finish", "finish_reason": "stop"},
    ]
    assert fake_openai.requests[0].json["stream_options"] == {"include_usage": True}


# --- a connection lost before the first token ------------------------------------------------------


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_connection_lost_before_the_first_token_is_a_connection_error(
    fake_openai: FakeOpenAI, how: str
) -> None:
    fake_openai.script(dropped(how))

    with pytest.raises(LLMError) as caught:
        await collect(endpoint_for(fake_openai), QUESTION)

    assert caught.value.kind == "connection"
    verb = "closed" if how == "close" else "reset"
    assert (
        str(caught.value)
        == f"The model endpoint at {fake_openai.base_url} {verb} the connection before the first token."
    )
    assert len(fake_openai.requests) == 1


# --- structured output: json_schema, json_object, then a plain instruction ---------------------------


async def test_json_schema_refused_with_a_500_falls_back_to_json_object_and_is_remembered(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.llama_cpp().script(completion(FACTS))
    endpoint = endpoint_for(fake_openai)

    assert (await OpenAISummarizer(endpoint=endpoint).summarize(extraction_request())).text == FACTS
    assert sent(fake_openai, "response_format") == [SCHEMA_FORMAT, {"type": "json_object"}]

    # Another summarizer of the same endpoint (base URL and model) skips the schema at once.
    await OpenAISummarizer(endpoint=endpoint).summarize(extraction_request())
    assert sent(fake_openai, "response_format")[2:] == [{"type": "json_object"}]
    await OpenAISummarizer(endpoint=endpoint_for(fake_openai, model="other")).summarize(extraction_request())
    assert sent(fake_openai, "response_format")[3:] == [SCHEMA_FORMAT, {"type": "json_object"}], "asked afresh"


async def test_both_formats_refused_ask_for_json_in_words_and_take_the_first_json_object(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.llama_cpp().json_object_error = True
    fake_openai.script(completion(f"Sure! Here it is:\n```json\n{FACTS}\n```\nAnything else?"))
    endpoint = endpoint_for(fake_openai)

    reply = await OpenAISummarizer(endpoint=endpoint).summarize(extraction_request())

    assert reply.text == FACTS
    assert sent(fake_openai, "response_format") == [SCHEMA_FORMAT, {"type": "json_object"}, None]
    system = [recorded.json["messages"][0]["content"] for recorded in fake_openai.requests]
    assert system == ["extract", "extract", f"extract\n\n{JSON_ONLY_INSTRUCTION}"]

    await OpenAISummarizer(endpoint=endpoint).summarize(extraction_request())
    assert sent(fake_openai, "response_format")[3:] == [None], "both formats are skipped from now on"


async def test_a_summary_request_gets_neither_the_instruction_nor_the_json_cut(fake_openai: FakeOpenAI) -> None:
    text = 'The user said {"a": 1} once.'
    fake_openai.llama_cpp().script(completion(text))

    reply = await OpenAISummarizer(endpoint=endpoint_for(fake_openai)).summarize(extraction_request(None))

    assert reply.text == text
    assert fake_openai.requests[0].json["messages"][0]["content"] == "extract"


async def test_the_streamed_path_asks_for_json_in_words(fake_openai: FakeOpenAI) -> None:
    fake_openai.llama_cpp().script(text_stream(f"Facts: {FACTS} done"))

    reply = await OpenAISummarizer(endpoint=endpoint_for(fake_openai), stream=True).summarize(extraction_request())

    assert reply.text == FACTS
    (request,) = fake_openai.requests
    assert "response_format" not in request.json
    assert request.json["messages"][0]["content"].endswith(JSON_ONLY_INSTRUCTION)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (FACTS, FACTS),
        (f"```json\n{FACTS}\n```", FACTS),
        (f"```\n{FACTS}\n```", FACTS),
        (f'Here: {FACTS} and {{"x": 2}}', FACTS),
        ('Not {json} but {"facts": [{"kind": "fact"}]}.', '{"facts": [{"kind": "fact"}]}'),
        ("no object [1, 2]", None),
        ('{"facts": [{"kind": "fact"}, {"kind"', None),
        ("", None),
    ],
)
def test_first_json_object(text: str, found: str | None) -> None:
    assert first_json_object(text) == found
    if found is not None:
        assert isinstance(json.loads(found), dict)


def test_json_only_prompt_appends_to_the_system_message_or_adds_one() -> None:
    prompt = [{"role": "system", "content": "extract"}, {"role": "user", "content": "hi"}]
    assert json_only_prompt(prompt) == [
        {"role": "system", "content": f"extract\n\n{JSON_ONLY_INSTRUCTION}"},
        {"role": "user", "content": "hi"},
    ]
    assert prompt[0]["content"] == "extract", "the request's prompt is not changed"
    assert json_only_prompt(prompt[1:]) == [{"role": "system", "content": JSON_ONLY_INSTRUCTION}, prompt[1]]


def test_refused_shapes_are_per_base_url_and_model() -> None:
    a = Endpoint(base_url="http://a/v1", api_key="", model="m", context_window=1, timeout=1.0)
    shape_refused(a, JSON_SCHEMA)
    assert refused_shapes(a) == {JSON_SCHEMA}
    assert refused_shapes(dataclasses.replace(a, timeout=2.0)) == {JSON_SCHEMA}
    assert refused_shapes(dataclasses.replace(a, base_url="http://b/v1")) == frozenset()
    assert refused_shapes(dataclasses.replace(a, model="n")) == frozenset()
