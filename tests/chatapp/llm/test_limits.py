"""Requests per server (docs/memory.md §6 "Concurrency"): a single-slot server (llama.cpp's cuts off a running
stream when another request arrives) gets one request at a time from chat turns and memory jobs together, and a
waiting turn goes before any waiting memory job."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from django.core.exceptions import ImproperlyConfigured

from chatapp.llm.clients import Endpoint, LLMError, chat_stream
from chatapp.llm.limits import SlotLimiter, is_local, max_concurrency, server_key
from chatapp.llm.summarizer import OpenAISummarizer
from memory.jobs import runner
from memory.ports import SummaryRequest
from memory.summary.prompts import build_summary_prompt
from tests.chatapp.test_settings import settings_load
from tests.fake_openai import FakeOpenAI, completion, paced, text_stream

REPLY = "One two three four five six seven eight nine ten."


def endpoint_for(fake: FakeOpenAI) -> Endpoint:
    return Endpoint(base_url=fake.base_url, api_key="k", model="m", context_window=8192, timeout=10)


async def as_memory_job(awaitable):
    """``awaitable`` run as a memory job's work (the runner marks its own tasks the same way)."""
    runner._in_memory_job.set(True)
    return await awaitable


async def chat_text(endpoint: Endpoint, streaming: asyncio.Event) -> tuple[str, str | None]:
    """The streamed reply's text and finish reason; ``streaming`` is set at its first piece."""
    text, finish = "", None
    async for event in chat_stream([{"role": "user", "content": "Count to ten."}], endpoint=endpoint):
        if event["type"] == "delta":
            text += event["text"]
            streaming.set()
        elif event["type"] == "finish":
            finish = event["finish_reason"]
    return text, finish


async def summary(endpoint: Endpoint) -> str:
    prompt = build_summary_prompt(previous_summary="", transcript="- User: hello", max_tokens=100)
    request = SummaryRequest(previous_summary="", messages=[], prompt=prompt, max_tokens=100)
    return (await OpenAISummarizer(endpoint=endpoint).summarize(request)).text


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("http://127.0.0.1:8080/v1", True),
        ("http://localhost:11434/v1", True),
        ("http://192.168.1.20:8000/v1", True),
        ("http://ollama:11434/v1", True),
        ("http://host.docker.internal:8080/v1", True),
        ("http://[::1]:8080/v1", True),
        ("https://api.openai.com/v1", False),
        ("https://api.deepseek.com", False),
        ("http://8.8.8.8:8000/v1", False),
    ],
)
def test_a_server_on_this_machine_or_a_private_network_is_local(url: str, local: bool, settings) -> None:
    settings.LLM_MAX_CONCURRENCY = None
    assert is_local(url) is local
    assert max_concurrency(url) == (1 if local else None)


def test_the_setting_overrides_the_default_and_the_offline_engine_has_no_limit(settings) -> None:
    settings.LLM_MAX_CONCURRENCY = 4
    assert max_concurrency("https://api.openai.com/v1") == 4
    settings.LLM_MAX_CONCURRENCY = 0
    assert max_concurrency("http://127.0.0.1:8080/v1") is None
    assert max_concurrency("") is None


def test_every_spelling_of_one_server_shares_its_slots() -> None:
    one = {server_key(url) for url in ("http://127.0.0.1:8080/v1", "http://localhost:8080", "http://[::1]:8080/v1/")}
    assert one == {"loopback:8080"}
    assert server_key("http://127.0.0.1:8081/v1") != server_key("http://127.0.0.1:8080/v1")
    assert server_key("https://api.openai.com/v1") == "api.openai.com:443"


@pytest.mark.parametrize("value", ["²", "٢", "-1", "1.5", "two"])
def test_a_bad_setting_stops_start_up_naming_it(value: str, monkeypatch) -> None:
    with pytest.raises(ImproperlyConfigured, match="LLM_MAX_CONCURRENCY must be 'auto' or an integer >= 0"):
        settings_load(monkeypatch, LLM_MAX_CONCURRENCY=value)


def test_the_setting_reads_auto_and_whole_numbers(monkeypatch) -> None:
    assert settings_load(monkeypatch)["LLM_MAX_CONCURRENCY"] is None
    assert settings_load(monkeypatch, LLM_MAX_CONCURRENCY="AUTO")["LLM_MAX_CONCURRENCY"] is None
    assert settings_load(monkeypatch, LLM_MAX_CONCURRENCY=" 2")["LLM_MAX_CONCURRENCY"] == 2


async def test_a_free_slot_goes_to_a_waiting_turn_before_waiting_memory_jobs() -> None:
    limiter, order = SlotLimiter(1), []
    release = asyncio.Event()

    async def take(name: str, *, background: bool) -> None:
        async with limiter.slot(background=background):
            order.append(name)
            if name == "job-1":
                await release.wait()

    first = asyncio.create_task(take("job-1", background=True))
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(take("job-2", background=True))]
    await asyncio.sleep(0)
    waiting.append(asyncio.create_task(take("turn", background=False)))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, *waiting)
    assert order == ["job-1", "turn", "job-2"]


async def test_a_cancelled_waiting_turn_lets_memory_jobs_go_on() -> None:
    limiter, done = SlotLimiter(1), []
    release = asyncio.Event()

    async def hold() -> None:
        async with limiter.slot(background=False):
            await release.wait()

    async def job() -> None:
        async with limiter.slot(background=True):
            done.append("job")

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    turn = asyncio.create_task(hold())
    jobs = asyncio.create_task(job())
    await asyncio.sleep(0)
    turn.cancel()
    release.set()
    await asyncio.wait_for(asyncio.gather(holder, jobs), timeout=5)
    assert done == ["job"] and limiter.busy == 0


@pytest.mark.parametrize("summary_host", ["127.0.0.1", "localhost"])
async def test_a_memory_job_never_interrupts_a_stream_on_a_single_slot_server(
    fake_openai: FakeOpenAI, settings, summary_host: str
) -> None:
    settings.LLM_MAX_CONCURRENCY = None  # the default: 1 for a server on this machine
    fake_openai.single_slot = True
    fake_openai.script(paced(0.05, text_stream(REPLY, pieces=10)), completion("- User said hello."))
    endpoint = endpoint_for(fake_openai)
    # The summary URL may name the same server otherwise: it still shares the chat's slot.
    summary_endpoint = dataclasses.replace(endpoint, base_url=endpoint.base_url.replace("127.0.0.1", summary_host))

    streaming = asyncio.Event()
    chat = asyncio.create_task(chat_text(endpoint, streaming))
    await asyncio.wait_for(streaming.wait(), timeout=10)
    job = asyncio.create_task(as_memory_job(summary(summary_endpoint)))

    assert await asyncio.wait_for(chat, timeout=10) == (REPLY, "stop")
    assert await asyncio.wait_for(job, timeout=10) == "- User said hello."
    assert fake_openai.most_at_once == 1
    assert [bool(request.json.get("stream")) for request in fake_openai.requests] == [True, False]


async def test_without_the_limit_the_single_slot_server_cuts_the_stream(fake_openai: FakeOpenAI, settings) -> None:
    # What the limit prevents: llama.cpp's server ends the running stream for the memory job's request.
    settings.LLM_MAX_CONCURRENCY = 0
    fake_openai.single_slot = True
    fake_openai.script(paced(0.2, text_stream(REPLY, pieces=10)), completion("- User said hello."))
    endpoint = endpoint_for(fake_openai)

    streaming = asyncio.Event()
    chat = asyncio.create_task(chat_text(endpoint, streaming))
    await asyncio.wait_for(streaming.wait(), timeout=10)
    await as_memory_job(summary(endpoint))

    with pytest.raises(LLMError) as cut:
        await asyncio.wait_for(chat, timeout=10)
    assert cut.value.kind == "connection" and fake_openai.most_at_once == 2
