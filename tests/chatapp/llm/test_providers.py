"""The whole LLM surface against every fake-server profile of a real server (docs/configuration.md "Per server"):
chat, agent tools (call and answer), summary, key-fact extraction, embeddings, the usage that calibration needs,
a stopped stream and failover, each with no protocol failure whatever the profile refuses. ``-m providers``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from chatapp.llm.clients import Endpoint, LLMError, chat_stream
from chatapp.llm.embeddings import OpenAIEmbedder
from chatapp.llm.summarizer import OpenAISummarizer
from memory.api import SummaryRequest
from memory.facts.extraction import EXTRACTION_SCHEMA, EXTRACTION_SCHEMA_NAME
from memory.summary.chain import SummarizerChain
from memory.summary.incremental import IncrementalSummarizer
from memory.summary.prompts import build_summary_prompt
from memory.summary.store import Summary
from memory.tokens.counter import get_counter
from tests.fake_openai import FakeOpenAI, chunk, completion, embeddings, stream, text_stream

pytestmark = pytest.mark.providers

PROFILES: dict[str, Callable[[FakeOpenAI], Any]] = {
    "openai": lambda fake: fake,
    "llama.cpp": FakeOpenAI.llama_cpp,
    "deepseek": FakeOpenAI.deepseek,
    "ollama": FakeOpenAI.ollama,
    "streams-no-tools": lambda fake: setattr(fake, "tools_stream_empty", True),
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "17*23"}'}}
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
QUESTION: list[dict[str, Any]] = [{"role": "user", "content": "What is 17 x 23?"}]
AFTER_CALL: list[dict[str, Any]] = [
    *QUESTION,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "391"},
]
FACTS = '{"facts": [{"operation": "add", "kind": "identifier", "key": "user_id", "value": "ACC-7731"}]}'


@pytest.fixture(params=list(PROFILES))
def server(request, fake_openai: FakeOpenAI) -> FakeOpenAI:
    PROFILES[request.param](fake_openai)
    return fake_openai


def endpoint_for(server: FakeOpenAI) -> Endpoint:
    return Endpoint(base_url=server.base_url, api_key="k", model="m", context_window=8192, timeout=5.0)


async def events_of(server: FakeOpenAI, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    """The stream's text, tool calls, usage event and finish reason."""
    got: dict[str, Any] = {"text": "", "tool_calls": None, "usage": None, "finish": None}
    async for event in chat_stream(messages, endpoint=endpoint_for(server), **kwargs):
        if event["type"] == "delta":
            got["text"] += event["text"]
        elif event["type"] == "tool_calls":
            got["tool_calls"] = event["tool_calls"]
        elif event["type"] == "usage":
            got["usage"] = event
        elif event["type"] == "finish":
            got["finish"] = event["finish_reason"]
    return got


async def test_chat_streams_with_usage_or_says_why_there_is_none(server: FakeOpenAI) -> None:
    server.script(text_stream("391."))
    got = await events_of(server, QUESTION)
    assert (got["text"], got["finish"]) == ("391.", "stop")
    usage = got["usage"]
    assert usage["prompt_tokens"] == 11 or usage["missing"] == "not reported"


async def test_an_agent_calls_a_tool_and_answers_with_its_result(server: FakeOpenAI) -> None:
    tool_stream = stream(chunk({"tool_calls": [{"index": 0, **CALL}]}), chunk(finish_reason="tool_calls"))
    whole = server.tools_stream_empty  # such a server answers tool requests only unstreamed
    server.script(completion(None, tool_calls=[CALL]) if whole else tool_stream)
    called = await events_of(server, QUESTION, tools=TOOLS)
    server.script(completion("17 x 23 = 391.") if whole else text_stream("17 x 23 = 391."))
    answered = await events_of(server, AFTER_CALL, tools=TOOLS)

    assert called["tool_calls"] == [CALL]
    assert answered["text"] == "17 x 23 = 391."
    assert all(request.json.get("tool_choice") == "auto" for request in server.requests)


async def test_a_summary_and_a_key_fact_extraction(server: FakeOpenAI) -> None:
    summarizer = OpenAISummarizer(endpoint=endpoint_for(server))
    server.script(completion("- User asked for 17 x 23; the answer is 391."))
    prompt = build_summary_prompt(previous_summary="", transcript="- User: What is 17 x 23?", max_tokens=100)
    summary = await summarizer.summarize(
        SummaryRequest(previous_summary="", messages=[], prompt=prompt, max_tokens=100)
    )

    server.script(completion(FACTS))
    schema = {"name": EXTRACTION_SCHEMA_NAME, "schema": EXTRACTION_SCHEMA, "strict": True}
    extraction = SummaryRequest(
        previous_summary="",
        messages=[],
        prompt=[{"role": "system", "content": "Extract key facts."}, {"role": "user", "content": "1. User: ACC-7731"}],
        max_tokens=200,
        response_format={"type": "json_schema", "json_schema": schema},
    )
    facts = await summarizer.summarize(extraction)

    assert summary.text.startswith("- User asked") and summary.finish_reason == "stop"
    assert json.loads(facts.text)["facts"][0]["value"] == "ACC-7731"


async def test_embeddings(server: FakeOpenAI) -> None:
    server.script(embeddings([[3.0, 4.0], [0.0, 2.0]]))
    embedder = OpenAIEmbedder(base_url=server.base_url, api_key="k", model="e", timeout=5)
    vectors = await embedder.embed(["a", "b"], kind="passage")
    assert vectors.tolist() == [[0.6000000238418579, 0.800000011920929], [0.0, 1.0]]


async def test_a_stream_closed_by_its_reader_ends_cleanly_and_the_next_call_works(server: FakeOpenAI) -> None:
    server.script(text_stream("One two three four five six.", pieces=6), text_stream("Again."))
    stream_events = chat_stream(QUESTION, endpoint=endpoint_for(server))
    first = await anext(stream_events)
    await stream_events.aclose()  # the user pressed Stop
    assert first == {"type": "delta", "text": "One t"}
    assert (await events_of(server, QUESTION))["text"] == "Again."


async def test_failover_takes_over_from_a_dead_primary(server: FakeOpenAI, refused_base_url: str) -> None:
    dead = Endpoint(base_url=refused_base_url, api_key="k", model="m", context_window=8192, timeout=2.0)
    chain = SummarizerChain(
        primary=OpenAISummarizer(endpoint=dead), failover=OpenAISummarizer(endpoint=endpoint_for(server)), backoff=0
    )
    server.script(completion("- User asked for 17 x 23."))
    prompt = build_summary_prompt(previous_summary="", transcript="- User: What is 17 x 23?", max_tokens=100)
    result = await chain.run(SummaryRequest(previous_summary="", messages=[], prompt=prompt, max_tokens=100))
    assert result.text == "- User asked for 17 x 23." and result.phase == "failover"
    assert [attempt.error.startswith("LLMError") for attempt in result.attempts] == [True, True, True, False]


async def test_a_vllm_server_without_a_tool_parser_names_the_flags_and_still_chats(fake_openai: FakeOpenAI) -> None:
    fake_openai.auto_tool_choice_off = True
    fake_openai.script(text_stream("Hello."))
    with pytest.raises(LLMError) as refused:
        await events_of(fake_openai, QUESTION, tools=TOOLS)
    assert refused.value.kind == "status" and "--enable-auto-tool-choice" in refused.value.message
    assert (await events_of(fake_openai, QUESTION))["text"] == "Hello."  # quick-answer mode sends no tools


@pytest.mark.parametrize("stream", [False, True])
async def test_a_model_overrunning_every_budget_still_yields_a_summary_within_the_cap(
    fake_openai: FakeOpenAI, stream: bool
) -> None:
    """Over HTTP, the whole chain (docs/memory.md §4 "Summaries that fit"): a model writing 1.4 times any budget it
    is given finishes inside the room above the budget, and the second pass or the sentence cut fits it."""
    fake_openai.summary_overrun = 1.4
    summarizer = OpenAISummarizer(endpoint=endpoint_for(fake_openai), stream=stream)
    folder = IncrementalSummarizer(
        chain=SummarizerChain(primary=summarizer, backoff=0), counter=get_counter("m"), ratio=0.5, window=8192
    )
    messages = [{"role": "user", "content": f"Where is order W{n:04d}? " * 4, "id": n} for n in range(1, 40)]

    outcome = await folder.fold(Summary(), messages, cap=150)

    assert (outcome.summary.summary_type, outcome.degraded) == ("llm", False)
    assert get_counter("m").count_text(outcome.summary.content) <= 150
    assert all(request.json["max_tokens"] > 100 for request in fake_openai.requests)
