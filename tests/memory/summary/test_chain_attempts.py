"""What every summarizer attempt records besides its outcome (docs/memory.md §4): the backoff
slept before it, so that a compression's attempts and waits add up to its duration, and how the
summarizer writes (an LLM, or extractive sentences with no language model); no database."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from memory.ports import SummaryRequest
from memory.summary import chain as summarizer_module
from memory.summary.chain import METHOD_EXTRACTIVE, METHOD_LLM, SummarizerChain
from memory.summary.extractive import ExtractiveSummarizer
from memory.summary.prompts import build_summary_prompt
from tests.memory.builders import COUNTER, ScriptedSummarizer


def request() -> SummaryRequest:
    return SummaryRequest(
        previous_summary="",
        messages=[],
        prompt=build_summary_prompt(previous_summary="", transcript="- User: My account is ACC-7731.", max_tokens=200),
        max_tokens=200,
    )


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The chain's clock and sleep, faked: a sleep advances the clock by exactly its seconds and
    returns at once, so the recorded waits are exact and the test never waits."""
    now = [100.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds
        await asyncio.sleep(0)

    fake_asyncio = SimpleNamespace(sleep=sleep, wait_for=asyncio.wait_for, CancelledError=asyncio.CancelledError)
    monkeypatch.setattr(summarizer_module, "asyncio", fake_asyncio)
    monkeypatch.setattr(summarizer_module, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    return slept


async def test_each_retry_records_the_backoff_it_waited_and_a_first_try_none(fake_clock: list[float]):
    chain = SummarizerChain(
        primary=ScriptedSummarizer(default=RuntimeError("HTTP 500"), model="p"),
        failover=ScriptedSummarizer(default=RuntimeError("HTTP 503"), model="f"),
        backoff=0.5,
    )
    result = await chain.run(request())

    assert result.text is None
    assert [(a.phase, a.number, a.wait_ms) for a in result.attempts] == [
        ("primary", 1, 0),
        ("primary", 2, 500),
        ("primary", 3, 1000),
        ("failover", 1, 0),
        ("failover", 2, 500),
        ("failover", 3, 1000),
    ]
    # What was recorded is what was slept, no more.
    assert sum(a.wait_ms for a in result.attempts) == round(1000 * sum(fake_clock)) == 3000
    assert all(a.as_dict()["wait_ms"] == a.wait_ms for a in result.attempts)


async def test_without_backoff_nothing_is_waited_nor_recorded(fake_clock: list[float]):
    chain = SummarizerChain(primary=ScriptedSummarizer([RuntimeError("a"), "good"]), backoff=0)
    result = await chain.run(request())
    assert result.text == "good" and [a.wait_ms for a in result.attempts] == [0, 0] and fake_clock == []


async def test_the_attempt_says_how_its_summarizer_writes():
    extractive = await SummarizerChain(primary=ExtractiveSummarizer(COUNTER), backoff=0).run(request())
    assert extractive.text and "ACC-7731" in extractive.text
    assert [a.as_dict()["method"] for a in extractive.attempts] == [METHOD_EXTRACTIVE]
    # A summarizer that says nothing about its method is taken for an LLM.
    scripted = await SummarizerChain(primary=ScriptedSummarizer(["an LLM's summary"]), backoff=0).run(request())
    assert [a.method for a in scripted.attempts] == [METHOD_LLM]
