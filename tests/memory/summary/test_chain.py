"""The summarizer chain (layers 1-2), the prompt builder, the 30 % rule and the extractive
summarizer; no database."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync

from memory.context.budget import MemoryBudget
from memory.ports import SummaryRequest
from memory.summary.chain import SummarizerChain
from memory.summary.extractive import ExtractiveSummarizer, extractive_summary
from memory.summary.incremental import summary_output_tokens
from memory.summary.prompts import build_summary_prompt, chunk_messages, split_summary_prompt, transcript_budget
from memory.summary.store import InMemorySummaryStore, Summary
from tests.memory.builders import COUNTER, ScriptedSummarizer, asst, tool, user
from tests.memory.conftest import make_engine


def request(previous: str = "", transcript: str = "- User: hi") -> SummaryRequest:
    return SummaryRequest(
        previous_summary=previous,
        messages=[],
        prompt=build_summary_prompt(previous_summary=previous, transcript=transcript, max_tokens=200),
        max_tokens=200,
    )


async def test_chain_counts_each_attempt_once_and_stops_at_the_first_success():
    primary = ScriptedSummarizer([RuntimeError("a"), "", "good"], model="p")
    result = await SummarizerChain(primary=primary, backoff=0).run(request())
    assert result.text == "good" and result.phase == "primary"
    assert [(a.number, a.ok) for a in result.attempts] == [(1, False), (2, False), (3, True)]
    assert result.attempts[1].error.startswith("EmptySummaryError")


async def test_chain_without_failover_gives_up_after_the_primary_layer():
    result = await SummarizerChain(primary=ScriptedSummarizer(default=ValueError("bad")), attempts=2, backoff=0).run(
        request()
    )
    assert result.text is None and len(result.attempts) == 2 and result.phase is None


async def test_chain_timeout_fires_per_attempt():
    chain = SummarizerChain(primary=ScriptedSummarizer(default="sleep:10"), attempts=2, timeout=0.05, backoff=0)
    started = asyncio.get_running_loop().time()
    result = await chain.run(request())
    assert result.text is None and asyncio.get_running_loop().time() - started < 2
    assert all(a.error.startswith("TimeoutError") for a in result.attempts)


async def test_chain_lets_cancellation_through():
    task = asyncio.ensure_future(SummarizerChain(primary=ScriptedSummarizer(default="sleep:10")).run(request()))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_prompt_round_trips_for_the_offline_engine():
    prompt = build_summary_prompt(previous_summary="old facts", transcript="- User: new", max_tokens=100)
    assert split_summary_prompt(prompt[1]["content"]) == ("old facts", "- User: new")
    first = build_summary_prompt(previous_summary="", transcript="- User: new", max_tokens=100)
    assert "previous_summary" not in first[1]["content"]
    assert split_summary_prompt(first[1]["content"]) == ("", "- User: new")
    assert split_summary_prompt("just a chat message") is None


def test_thirty_percent_rule_and_hard_cap():
    rule = MemoryBudget(context_window=4096).summary_ratio
    assert rule == 0.3
    assert summary_output_tokens(previous_summary_tokens=0, transcript_tokens=1000, cap=2000, ratio=rule) == 300
    assert summary_output_tokens(previous_summary_tokens=100, transcript_tokens=1000, cap=2000, ratio=rule) == 400
    assert summary_output_tokens(previous_summary_tokens=100, transcript_tokens=10_000, cap=500, ratio=rule) == 500
    assert summary_output_tokens(previous_summary_tokens=0, transcript_tokens=10, cap=500, ratio=rule) == 48


def test_the_summary_ratio_is_read_from_the_budget(memory_key):
    """``summary_ratio`` reaches the summarizer's output limit (it was once ignored)."""
    seen = {}
    for ratio in (0.3, 0.1):
        summarizer = ScriptedSummarizer(default="facts")
        engine = make_engine(window=8192, primary=summarizer, summary_ratio=ratio, store=InMemorySummaryStore())
        async_to_sync(engine.summarize)(Summary(), [{"id": 1, **user("x " * 2000)}])
        seen[ratio] = summarizer.requests[0].max_tokens
    assert seen[0.1] < seen[0.3]


def test_chunks_cover_every_message_in_order():
    messages = [user(f"m{i} " + "x " * 300) for i in range(20)]
    budget = transcript_budget(previous_summary_tokens=200, max_output_tokens=200, window=2048, counter=COUNTER)
    chunks = chunk_messages(messages, budget=budget, counter=COUNTER)
    assert len(chunks) > 1 and [m for chunk in chunks for m in chunk] == messages


def test_extractive_keeps_identifiers_requests_and_tool_results_within_the_limit():
    transcript = "\n".join(
        [
            "- User: Hi there. I want to cancel reservation ZFA04Y please.",
            "- Assistant: Sure, let me help you with that today.",
            '- Assistant [tools: get_reservation_details]: get_reservation_details({"reservation_id": "ZFA04Y"})',
            '- Tool[get_reservation_details]: {"price": 312, "status": "confirmed"}',
            "- Assistant: The weather is lovely.",
        ]
    )
    summary = extractive_summary("- User: my user id is ada_1815", transcript, max_tokens=120, counter=COUNTER)
    assert summary.splitlines()[0] == "- User: my user id is ada_1815"
    assert "ZFA04Y" in summary and "312" in summary and "lovely" not in summary
    assert COUNTER.count_text(summary) <= 120
    tight = extractive_summary("- User: my user id is ada_1815", transcript, max_tokens=20, counter=COUNTER)
    assert COUNTER.count_text(tight) <= 20 and "ada_1815" in tight


async def test_extractive_summarizer_reads_the_prompt_like_an_llm_would():
    messages = [user("Book flight HAT123 on 2024-05-20"), asst(None, tc=["c1"]), tool("c1", "booked, total $540")]
    from memory.summary.prompts import render_transcript

    text = await ExtractiveSummarizer(COUNTER).summarize(request("- User: I am Ada.", render_transcript(messages)))
    assert text.startswith("- User: I am Ada.") and "HAT123" in text and "$540" in text


def test_a_full_extractive_summary_still_absorbs_new_facts_and_keeps_the_first():
    previous = "\n".join(f"- User: fact number {i} is code RX{i:04d}." for i in range(60))
    assert COUNTER.count_text(previous) > 300
    summary = extractive_summary(previous, "- User: my dog's name is Biscuit-77.", max_tokens=300, counter=COUNTER)
    assert COUNTER.count_text(summary) <= 300
    assert "RX0000" in summary and "Biscuit-77" in summary
    assert summary.splitlines()[-1] == "- User: my dog's name is Biscuit-77."
