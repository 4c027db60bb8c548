"""The offline engine's switches scoped to one task tree (chatapp/llm/offline/faults.py): the demo's
injected summarizer outage and thinking time hold inside their block and in the tasks created
there, never for a request made elsewhere at the same time (docs/demo.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chatapp.llm.clients import Endpoint, LLMError, chat_endpoint, chat_stream
from chatapp.llm.offline.faults import (
    NO_OVERRIDES,
    OfflineOverrides,
    offline_overrides,
    offline_overrides_current,
)
from chatapp.llm.offline.transport import OFFLINE_MODEL
from chatapp.llm.summarizer import OpenAISummarizer
from memory.ports import SummaryRequest
from memory.summary.chain import SummarizerChain
from memory.summary.prompts import build_summary_prompt

pytestmark = pytest.mark.usefixtures("offline_engine")

OUTAGE = "injected summarizer outage (test)"


def summary_request() -> SummaryRequest:
    prompt = build_summary_prompt(previous_summary="", transcript="- User: Code Q-42.", max_tokens=200)
    return SummaryRequest(previous_summary="", messages=[], prompt=prompt, max_tokens=200)


def chain() -> SummarizerChain:
    return SummarizerChain(primary=OpenAISummarizer(endpoint=chat_endpoint()), attempts=3, backoff=0)


async def chat_text(messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return "".join([event["text"] async for event in chat_stream(messages, **kwargs) if event["type"] == "delta"])


async def test_an_outage_fails_the_summaries_of_its_block_and_its_tasks_but_not_chat():
    with offline_overrides(OfflineOverrides(summary_outage=OUTAGE)):
        inside = await chain().run(summary_request())
        in_task = await asyncio.get_running_loop().create_task(chain().run(summary_request()))
        chat = await chat_text([{"role": "user", "content": "Hello"}])
    after = await chain().run(summary_request())

    for result in (inside, in_task):
        assert result.text is None
        assert [(a.number, a.ok) for a in result.attempts] == [(1, False), (2, False), (3, False)]
        assert all("HTTP 500" in a.error and OUTAGE in a.error for a in result.attempts)
    assert chat.startswith("Hello!")
    assert after.text and "Q-42" in after.text
    assert offline_overrides_current() is NO_OVERRIDES


async def test_a_request_running_beside_the_outage_is_not_touched():
    outside_started = asyncio.Event()
    outage_on = asyncio.Event()

    async def outside() -> str | None:
        outside_started.set()
        await outage_on.wait()  # the other task is inside its outage now
        return (await chain().run(summary_request())).text

    # Created before (and outside) the block: it keeps the context it was created in.
    task = asyncio.get_running_loop().create_task(outside())
    await outside_started.wait()
    with offline_overrides(OfflineOverrides(summary_outage=OUTAGE)):
        outage_on.set()
        text = await task
        failed = await chain().run(summary_request())

    assert text and "Q-42" in text
    assert failed.text is None


async def test_thinking_time_delays_chat_requests_only():
    # A client timeout shorter than the thinking time proves the delay without measuring it.
    endpoint = Endpoint(base_url="", api_key="offline", model=OFFLINE_MODEL, context_window=2048, timeout=0.2)
    with offline_overrides(OfflineOverrides(chat_delay_seconds=5.0)):
        with pytest.raises(LLMError) as caught:
            await chat_text([{"role": "user", "content": "Hello"}], endpoint=endpoint)
        summary = await OpenAISummarizer(endpoint=endpoint).summarize(summary_request())

    assert caught.value.kind == "timeout"
    assert "Q-42" in summary.text


def test_blocks_nest_and_restore_the_outer_overrides():
    outer, inner = OfflineOverrides(chat_delay_seconds=1.0), OfflineOverrides(summary_outage=OUTAGE)
    with offline_overrides(outer):
        with offline_overrides(inner):
            assert offline_overrides_current() is inner
        assert offline_overrides_current() is outer
    assert offline_overrides_current() is NO_OVERRIDES


def test_a_negative_thinking_time_is_refused():
    with pytest.raises(ValueError, match="chat_delay_seconds must be at least 0"):
        OfflineOverrides(chat_delay_seconds=-1.0)
