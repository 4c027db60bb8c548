"""chat_stream, OpenAISummarizer and the summarizer chain over real HTTP (tests/fake_openai.py)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from chatapp.chats.memory import memory_engine
from chatapp.llm.clients import ChatEvent, Endpoint, LLMError, chat_stream, failover_endpoint, summary_endpoint
from chatapp.llm.summarizer import OpenAISummarizer
from memory.ports import SummaryRequest
from memory.summary.chain import SummarizerChain
from memory.summary.prompts import build_summary_prompt
from tests.fake_openai import MALFORMED_JSON, FakeOpenAI, Reply, chunk, completion, error, slow, stream, text_stream

MESSAGES = [
    {"role": "system", "content": "You are terse.", "id": 1, "token_count": 5},
    {"role": "user", "content": "Hi", "id": 2, "token_count": 1},
]
USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
TEXT_STREAM = stream(
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo there"}),
    chunk(finish_reason="stop"),
    chunk(usage=USAGE),
)


def endpoint_for(server: FakeOpenAI | str, *, model: str = "fake-model", timeout: float = 5.0) -> Endpoint:
    base_url = server if isinstance(server, str) else server.base_url
    return Endpoint(base_url=base_url, api_key="test-key", model=model, context_window=8192, timeout=timeout)


async def collect(endpoint: Endpoint, **kwargs: Any) -> list[ChatEvent]:
    return [event async for event in chat_stream(MESSAGES, endpoint=endpoint, **kwargs)]


async def collect_into(received: list[ChatEvent], endpoint: Endpoint) -> None:
    """Append each event to ``received`` as it arrives (kept if the stream fails later)."""
    async for event in chat_stream(MESSAGES, endpoint=endpoint):
        received.append(event)


async def stream_error(endpoint: Endpoint) -> LLMError:
    with pytest.raises(LLMError) as caught:
        await collect(endpoint)
    return caught.value


def summary_request(max_tokens: int = 200) -> SummaryRequest:
    prompt = build_summary_prompt(previous_summary="", transcript="- User: My code is Q-42.", max_tokens=max_tokens)
    return SummaryRequest(previous_summary="", messages=[], prompt=prompt, max_tokens=max_tokens)


# --- chat_stream ----------------------------------------------------------------------------


async def test_streams_text_then_usage_then_finish(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(TEXT_STREAM)

    events = await collect(endpoint_for(fake_openai))

    assert events == [
        {"type": "delta", "text": "Hel"},
        {"type": "delta", "text": "lo there"},
        {"type": "usage", "prompt_tokens": 12, "completion_tokens": 3},
        {"type": "finish", "finish_reason": "stop"},
    ]


async def test_sends_only_wire_keys_and_asks_for_usage(fake_openai: FakeOpenAI, settings: Any) -> None:
    settings.LLM_CHAT_MAX_OUTPUT_TOKENS = 321
    fake_openai.script(TEXT_STREAM)

    await collect(endpoint_for(fake_openai))

    (request,) = fake_openai.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["authorization"] == "Bearer test-key"
    assert request.json["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
    ]
    assert request.json["model"] == "fake-model"
    assert request.json["stream"] is True
    assert request.json["stream_options"] == {"include_usage": True}
    assert request.json["max_tokens"] == 321
    assert "tools" not in request.json


async def test_assembles_parallel_tool_calls_from_deltas(fake_openai: FakeOpenAI) -> None:
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
        for name in ("kb_search", "calculator")
    ]
    fake_openai.script(
        stream(
            chunk({"role": "assistant", "content": None}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "kb_search", "arguments": ""},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"query": '}}]}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "call_b",
                            "type": "function",
                            "function": {"name": "calculator", "arguments": '{"ex'},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"refunds"}'}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"arguments": 'pression": "2*3"}'}}]}),
            chunk(finish_reason="tool_calls"),
            chunk(usage=USAGE),
        )
    )

    events = await collect(endpoint_for(fake_openai), tools=tools)

    assert events[0] == {
        "type": "tool_calls",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "kb_search", "arguments": '{"query": "refunds"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "2*3"}'},
            },
        ],
    }
    assert events[-1] == {"type": "finish", "finish_reason": "tool_calls"}
    assert fake_openai.requests[0].json["tools"] == tools


async def test_tool_call_without_an_id_gets_one(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(
        stream(
            chunk(
                {"tool_calls": [{"index": 0, "type": "function", "function": {"name": "kb_search", "arguments": "{}"}}]}
            ),
            chunk(finish_reason="tool_calls"),
        )
    )

    events = await collect(endpoint_for(fake_openai))

    (call,) = events[0]["tool_calls"]  # type: ignore[typeddict-item]
    assert call["id"].startswith("call_") and len(call["id"]) > len("call_")
    assert [event["type"] for event in events] == ["tool_calls", "usage", "finish"]
    assert events[1] == {"type": "usage", "prompt_tokens": None, "completion_tokens": None, "missing": "not reported"}


async def test_http_500_is_one_request_and_a_server_error(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(error(500, "model crashed"))

    exc = await stream_error(endpoint_for(fake_openai))

    assert exc.kind == "server"
    assert str(exc) == f"The model endpoint at {fake_openai.base_url} failed with HTTP 500: model crashed."
    assert len(fake_openai.requests) == 1


async def test_http_429_is_one_request_and_a_rate_limit_error(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(error(429, "slow down"))

    exc = await stream_error(endpoint_for(fake_openai))

    assert exc.kind == "rate_limit"
    assert str(exc) == f"The model endpoint at {fake_openai.base_url} is rate limiting requests (HTTP 429): slow down."
    assert len(fake_openai.requests) == 1


async def test_other_http_errors_are_status_errors(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(error(404, "The model `nope` does not exist"))

    exc = await stream_error(endpoint_for(fake_openai, model="nope"))

    assert exc.kind == "status"
    assert "HTTP 404: The model `nope` does not exist" in str(exc)


async def test_a_slow_server_times_out_on_the_endpoint_timeout(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(slow(5.0, TEXT_STREAM))

    started = time.perf_counter()
    exc = await stream_error(endpoint_for(fake_openai, timeout=0.3))

    assert exc.kind == "timeout"
    assert str(exc) == f"The model endpoint at {fake_openai.base_url} did not answer within 0.3 s."
    assert 0.3 <= time.perf_counter() - started < 2.0
    assert len(fake_openai.requests) == 1


async def test_a_stream_without_text_or_tool_calls_is_empty(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(
        stream(chunk({"role": "assistant", "content": ""}), chunk(finish_reason="stop"), chunk(usage=USAGE))
    )

    exc = await stream_error(endpoint_for(fake_openai))

    assert exc.kind == "empty"
    assert str(exc) == f"The model endpoint at {fake_openai.base_url} returned an empty reply from model fake-model."


async def test_malformed_json_in_a_stream_after_text(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(stream(chunk({"content": "Hel"}), '{"choices": [', chunk(finish_reason="stop")))
    received: list[ChatEvent] = []

    with pytest.raises(LLMError) as caught:
        await collect_into(received, endpoint_for(fake_openai))

    assert caught.value.kind == "malformed"
    assert "not valid JSON" in str(caught.value)
    assert received == [{"type": "delta", "text": "Hel"}]


async def test_connection_refused(refused_base_url: str) -> None:
    exc = await stream_error(endpoint_for(refused_base_url))

    assert exc.kind == "connection"
    assert str(exc) == f"The model endpoint at {refused_base_url} refused the connection (is the server running?)."


async def test_an_invalid_url_error_is_one_sentence_with_one_full_stop() -> None:
    # httpx's own text ends with a full stop ("... 'https://' protocol."); ours must not add a second.
    exc = await stream_error(endpoint_for("notaurl"))

    assert exc.kind == "connection"
    assert str(exc).startswith("The model endpoint at notaurl could not be reached: ")
    assert str(exc).endswith("protocol.") and ".." not in str(exc)


# --- OpenAISummarizer -----------------------------------------------------------------------


async def test_summarizer_sends_the_prompt_non_streaming(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(completion("- User: code Q-42."))
    request = summary_request(max_tokens=123)

    reply = await OpenAISummarizer(endpoint=endpoint_for(fake_openai, model="sum-model"), temperature=0.3).summarize(
        request
    )

    assert (reply.text, reply.finish_reason) == ("- User: code Q-42.", "stop")
    (sent,) = fake_openai.requests
    assert sent.json["messages"] == request.prompt
    assert sent.json["model"] == "sum-model"
    assert sent.json["max_tokens"] == 123
    assert sent.json["temperature"] == 0.3
    assert not sent.json.get("stream")


@pytest.mark.parametrize("stream", [False, True])
async def test_summarizer_gives_the_provider_room_above_the_stated_budget(
    fake_openai: FakeOpenAI, stream: bool
) -> None:
    fake_openai.script(text_stream("- User: code Q-42.") if stream else completion("- User: code Q-42."))
    request = dataclasses.replace(summary_request(max_tokens=100), reply_tokens=150)

    await OpenAISummarizer(endpoint=endpoint_for(fake_openai), stream=stream).summarize(request)

    (sent,) = fake_openai.requests
    assert sent.json["max_tokens"] == 150
    assert "At most 100 tokens (about 75 words)" in sent.json["messages"][0]["content"]


async def test_summarizer_returns_empty_text_as_is(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(completion(None))

    assert (await OpenAISummarizer(endpoint=endpoint_for(fake_openai)).summarize(summary_request())).text == ""


@pytest.mark.parametrize(
    ("reply", "kind", "fragment"),
    [
        (error(500, "boom"), "server", "HTTP 500: boom"),
        (error(429, "quota"), "rate_limit", "HTTP 429): quota"),
        (MALFORMED_JSON, "malformed", "not valid JSON"),
        (Reply(body=b"<html>bad gateway</html>", content_type="text/html"), "malformed", "not a chat completion"),
    ],
)
async def test_summarizer_failures_raise_llm_error(
    fake_openai: FakeOpenAI, reply: Reply, kind: str, fragment: str
) -> None:
    fake_openai.script(reply)

    with pytest.raises(LLMError) as caught:
        await OpenAISummarizer(endpoint=endpoint_for(fake_openai)).summarize(summary_request())

    assert caught.value.kind == kind
    assert fragment in str(caught.value)
    assert len(fake_openai.requests) == 1


async def test_summarizer_times_out_on_the_client_timeout(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(slow(5.0, completion("late")))

    with pytest.raises(LLMError) as caught:
        await OpenAISummarizer(endpoint=endpoint_for(fake_openai, timeout=0.3)).summarize(summary_request())

    assert caught.value.kind == "timeout"


# --- the degradation chain over HTTP --------------------------------------------------------


def chain(primary: Endpoint, failover: Endpoint | None, *, attempts: int = 3, timeout: float = 5.0) -> SummarizerChain:
    return SummarizerChain(
        primary=OpenAISummarizer(endpoint=primary),
        failover=OpenAISummarizer(endpoint=failover) if failover else None,
        attempts=attempts,
        timeout=timeout,
        backoff=0,
    )


@pytest.mark.parametrize(
    ("reply", "error_fragment"),
    [
        (error(500, "boom"), "LLMError: The model endpoint at"),
        (error(429, "quota"), "(HTTP 429): quota"),
        (completion("   "), "EmptySummaryError"),
        (MALFORMED_JSON, "not valid JSON"),
    ],
)
async def test_chain_counts_exactly_one_request_per_attempt_then_fails_over(
    fake_openai: FakeOpenAI, fake_openai_failover: FakeOpenAI, reply: Reply, error_fragment: str
) -> None:
    fake_openai.script(reply)
    fake_openai_failover.script(completion("- User: code Q-42."))

    primary, backup = endpoint_for(fake_openai, model="primary"), endpoint_for(fake_openai_failover, model="backup")

    result = await chain(primary, backup).run(summary_request())

    assert result.text == "- User: code Q-42."
    assert result.phase == "failover"
    assert [(a.model, a.phase, a.number, a.ok) for a in result.attempts] == [
        ("primary", "primary", 1, False),
        ("primary", "primary", 2, False),
        ("primary", "primary", 3, False),
        ("backup", "failover", 1, True),
    ]
    assert all(error_fragment in a.error for a in result.attempts[:3])
    assert len(fake_openai.requests) == 3
    assert len(fake_openai_failover.requests) == 1


async def test_chain_recovers_on_a_retry(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(error(500, "hiccup"), completion("- User: code Q-42."))

    result = await chain(endpoint_for(fake_openai), None).run(summary_request())

    assert result.text == "- User: code Q-42."
    assert [(a.number, a.ok) for a in result.attempts] == [(1, False), (2, True)]
    assert len(fake_openai.requests) == 2


async def test_chain_with_every_layer_failing_records_every_attempt(
    fake_openai: FakeOpenAI, fake_openai_failover: FakeOpenAI
) -> None:
    fake_openai.script(slow(5.0, completion("late")))
    fake_openai_failover.script(error(429, "quota"))

    started = time.perf_counter()
    result = await chain(
        endpoint_for(fake_openai, timeout=0.2), endpoint_for(fake_openai_failover), attempts=2, timeout=5.0
    ).run(summary_request())

    assert result.text is None
    assert [(a.phase, a.number, a.ok) for a in result.attempts] == [
        ("primary", 1, False),
        ("primary", 2, False),
        ("failover", 1, False),
        ("failover", 2, False),
    ]
    assert all("did not answer within 0.2 s" in a.error for a in result.attempts[:2])
    assert all("HTTP 429" in a.error for a in result.attempts[2:])
    assert (len(fake_openai.requests), len(fake_openai_failover.requests)) == (2, 2)
    assert time.perf_counter() - started < 3.0


async def test_chain_fails_over_from_a_refused_connection(
    refused_base_url: str, fake_openai_failover: FakeOpenAI
) -> None:
    fake_openai_failover.script(completion("- User: code Q-42."))

    result = await chain(endpoint_for(refused_base_url), endpoint_for(fake_openai_failover)).run(summary_request())

    assert result.text == "- User: code Q-42."
    assert [a.ok for a in result.attempts] == [False, False, False, True]
    assert all("refused the connection" in a.error for a in result.attempts[:3])


# --- endpoints and the chain from settings --------------------------------------------------


async def test_the_summarizer_chain_from_settings(
    fake_openai: FakeOpenAI, fake_openai_failover: FakeOpenAI, settings: Any
) -> None:
    settings.LLM_SUMMARY_BASE_URL = fake_openai.base_url
    settings.LLM_SUMMARY_MODEL = "sum-model"
    settings.LLM_SUMMARY_TEMPERATURE = 0.2
    settings.LLM_SUMMARY_TIMEOUT = 7.0
    settings.LLM_FAILOVER_BASE_URL = fake_openai_failover.base_url
    settings.LLM_FAILOVER_MODEL = "backup-model"
    settings.MEMORY_SUMMARY_ATTEMPTS = 2
    fake_openai.script(error(500, "down"))
    fake_openai_failover.script(completion("- User: code Q-42."))

    built = memory_engine().chain
    result = await dataclasses.replace(built, backoff=0).run(summary_request())

    assert (built.attempts, built.timeout) == (2, 7.0)
    assert [(a.model, a.ok) for a in result.attempts] == [
        ("sum-model", False),
        ("sum-model", False),
        ("backup-model", True),
    ]
    assert (len(fake_openai.requests), len(fake_openai_failover.requests)) == (2, 1)
    assert fake_openai.requests[0].json["temperature"] == 0.2
    assert fake_openai_failover.requests[0].json["model"] == "backup-model"


def test_no_failover_without_a_failover_model(settings: Any) -> None:
    settings.LLM_FAILOVER_MODEL = ""

    assert failover_endpoint() is None
    assert memory_engine().chain.failover is None


def test_failover_defaults_to_the_summary_server(settings: Any) -> None:
    settings.LLM_SUMMARY_BASE_URL = "http://models.example:8000/v1"
    settings.LLM_FAILOVER_BASE_URL = ""
    settings.LLM_FAILOVER_MODEL = "small-model"
    settings.LLM_SUMMARY_TIMEOUT = 9.0

    failover = failover_endpoint()

    assert failover is not None
    assert (failover.base_url, failover.model, failover.timeout) == (
        "http://models.example:8000/v1",
        "small-model",
        9.0,
    )
    assert summary_endpoint().base_url == failover.base_url


def test_endpoint_repr_hides_the_api_key() -> None:
    endpoint = Endpoint(
        base_url="https://api.example/v1", api_key="sk-secret", model="m", context_window=1000, timeout=1.0
    )

    assert "sk-secret" not in repr(endpoint)
    assert (
        not endpoint.offline and Endpoint(base_url="", api_key="", model="m", context_window=1000, timeout=1.0).offline
    )
