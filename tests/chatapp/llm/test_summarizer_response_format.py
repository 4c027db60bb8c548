"""OpenAISummarizer's ``response_format`` for key-fact extraction (docs/memory.md §11) over real
HTTP (tests/fake_openai.py): the JSON schema first, then ``json_object``, then none, each only
after the endpoint rejected the previous one with HTTP 400, within one call; what was rejected is
remembered, so later calls skip it."""

from __future__ import annotations

from typing import Any

import pytest

from chatapp.llm.clients import Endpoint, LLMError
from chatapp.llm.summarizer import OpenAISummarizer, response_format_levels
from memory.api import SummaryRequest
from memory.facts.extraction import EXTRACTION_SCHEMA, EXTRACTION_SCHEMA_NAME
from tests.fake_openai import FakeOpenAI, completion, error, text_stream

SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": EXTRACTION_SCHEMA_NAME, "schema": EXTRACTION_SCHEMA, "strict": True},
}
FACTS = '{"facts": []}'


def endpoint_for(server: FakeOpenAI) -> Endpoint:
    return Endpoint(base_url=server.base_url, api_key="k", model="m", context_window=8192, timeout=5.0)


def request(response_format: dict[str, Any] | None = SCHEMA_FORMAT) -> SummaryRequest:
    prompt = [{"role": "system", "content": "extract"}, {"role": "user", "content": "<new_messages>\n1. User: hi"}]
    return SummaryRequest(
        previous_summary="", messages=[], prompt=prompt, max_tokens=800, response_format=response_format
    )


def sent_formats(server: FakeOpenAI) -> list[Any]:
    return [recorded.json.get("response_format") for recorded in server.requests]


async def test_the_schema_is_sent_as_given_when_the_endpoint_accepts_it(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(completion(FACTS))
    reply = await OpenAISummarizer(endpoint=endpoint_for(fake_openai)).summarize(request())
    assert reply.text == FACTS
    assert sent_formats(fake_openai) == [SCHEMA_FORMAT]


async def test_a_rejected_schema_falls_back_to_json_object_and_is_skipped_afterwards(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(error(400, "response_format json_schema is not supported"), completion(FACTS))
    summarizer = OpenAISummarizer(endpoint=endpoint_for(fake_openai))

    assert (await summarizer.summarize(request())).text == FACTS
    assert sent_formats(fake_openai) == [SCHEMA_FORMAT, {"type": "json_object"}]

    await summarizer.summarize(request())
    assert sent_formats(fake_openai)[2:] == [{"type": "json_object"}], "the rejected schema is not tried again"


async def test_an_endpoint_rejecting_both_formats_gets_the_request_without_one(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(error(400, "unknown field response_format"), error(422, "nope"), completion(FACTS))
    summarizer = OpenAISummarizer(endpoint=endpoint_for(fake_openai))

    assert (await summarizer.summarize(request())).text == FACTS
    assert sent_formats(fake_openai) == [SCHEMA_FORMAT, {"type": "json_object"}, None]

    await summarizer.summarize(request())
    assert sent_formats(fake_openai)[3:] == [None]


async def test_a_400_at_every_level_raises_and_marks_nothing_as_unsupported(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(error(400, "prompt too long"))
    summarizer = OpenAISummarizer(endpoint=endpoint_for(fake_openai))

    with pytest.raises(LLMError) as caught:
        await summarizer.summarize(request())
    assert caught.value.kind == "status"
    assert sent_formats(fake_openai) == [SCHEMA_FORMAT, {"type": "json_object"}, None]

    fake_openai.script(completion(FACTS))
    await summarizer.summarize(request())
    assert sent_formats(fake_openai)[3:] == [SCHEMA_FORMAT], "the schema is still tried first"


async def test_a_server_error_is_not_a_rejected_format(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(error(500, "boom"))
    with pytest.raises(LLMError):
        await OpenAISummarizer(endpoint=endpoint_for(fake_openai)).summarize(request())
    assert sent_formats(fake_openai) == [SCHEMA_FORMAT], "one request: the chain counts the retry"


async def test_a_summary_request_sends_no_response_format(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(completion("- User: hi."))
    await OpenAISummarizer(endpoint=endpoint_for(fake_openai)).summarize(request(None))
    assert "response_format" not in fake_openai.requests[0].json


async def test_the_streamed_path_sends_no_response_format(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(text_stream(FACTS))
    reply = await OpenAISummarizer(endpoint=endpoint_for(fake_openai), stream=True).summarize(request())
    assert reply.text == FACTS
    assert "response_format" not in fake_openai.requests[0].json


def test_fallback_levels():
    assert response_format_levels(None) == [None]
    assert response_format_levels({"type": "json_object"}) == [{"type": "json_object"}, None]
    assert response_format_levels(SCHEMA_FORMAT) == [SCHEMA_FORMAT, {"type": "json_object"}, None]
