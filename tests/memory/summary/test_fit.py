"""Summaries that fit with any model (docs/memory.md §4 "Summaries that fit"): the prompt states the budget in
tokens and words, the provider gets room to finish above it, a summary over the cap is rewritten shorter or cut
at a sentence and marked, and a reply the provider cut off still never becomes a summary (F-36)."""

from __future__ import annotations

from asgiref.sync import async_to_sync

from memory.ports import SummaryReply, SummaryRequest
from memory.summary.archive import SUMMARY_SHORTENED
from memory.summary.chain import SummarizerChain
from memory.summary.incremental import IncrementalSummarizer
from memory.summary.prompts import reply_room, stated_budget
from memory.summary.store import Summary
from tests.memory.builders import COUNTER, asst, user

SENTENCE = "The user asked about order W{n:04d} and the agent checked its status in the system. "


class OverrunningSummarizer:
    """A weak model: it writes ``factor`` times the budget its prompt states, in whole sentences, and the
    provider cuts it at the request's output limit with ``finish_reason: "length"``."""

    model = "weak"

    def __init__(self, *factors: float) -> None:
        self.factors = list(factors)
        self.requests: list[SummaryRequest] = []

    async def summarize(self, request: SummaryRequest) -> SummaryReply:
        self.requests.append(request)
        factor = self.factors[min(len(self.requests), len(self.factors)) - 1]
        wanted = int(factor * (stated_budget(request.prompt) or request.max_tokens))
        text, n = "", 0
        while COUNTER.count_text(text) < wanted:
            text += SENTENCE.format(n=n)
            n += 1
        limit = request.reply_tokens or request.max_tokens
        if COUNTER.count_text(text) > limit:
            return SummaryReply(text=COUNTER.truncate_text(text, limit), finish_reason="length")
        return SummaryReply(text=text.strip(), finish_reason="stop")


def budget(request: SummaryRequest) -> int:
    stated = stated_budget(request.prompt)
    assert stated is not None, "the prompt states no budget"
    return stated


def folder(summarizer, attempts: int = 3) -> IncrementalSummarizer:
    chain = SummarizerChain(primary=summarizer, attempts=attempts, backoff=0)
    return IncrementalSummarizer(chain=chain, counter=COUNTER, ratio=0.5, window=8192)


def history(turns: int = 30) -> list[dict]:
    messages = []
    for n in range(turns):
        messages += [user(f"What is the status of order W{n:04d}? " * 3), asst(f"Order W{n:04d} shipped. " * 3)]
    return [{**message, "id": number} for number, message in enumerate(messages, 1)]


def fold(summarizer, cap: int = 200):
    return async_to_sync(folder(summarizer).fold)(Summary(), history(), cap=cap)


def test_the_prompt_states_the_budget_and_the_provider_gets_room_to_finish():
    model = OverrunningSummarizer(0.9)
    outcome = fold(model)
    (request,) = model.requests
    assert stated_budget(request.prompt) == request.max_tokens <= 200
    assert "words" in request.prompt[0]["content"]
    assert request.reply_tokens == reply_room(request.max_tokens) > request.max_tokens
    assert outcome.summary.summary_type == "llm" and not outcome.degraded


def test_a_model_that_overruns_its_budget_finishes_and_is_rewritten_within_the_cap():
    # 1.3 times the budget: under the room, over the cap. The old request cut it and fell back to the archive.
    model = OverrunningSummarizer(1.3, 1.3)
    outcome = fold(model)
    assert (outcome.summary.summary_type, outcome.degraded) == ("llm", False)
    assert COUNTER.count_text(outcome.summary.content) <= 200
    assert SUMMARY_SHORTENED not in outcome.summary.content
    # The second pass rewrote the model's own summary against a tighter stated budget.
    first, second = model.requests
    assert "W0000" in second.prompt[-1]["content"] and budget(second) < budget(first)
    assert len(outcome.attempts) == 2 and all(attempt.ok for attempt in outcome.attempts)


def test_a_model_that_ignores_every_budget_is_cut_at_a_sentence_and_marked():
    model = OverrunningSummarizer(1.45, 3.0, 3.0, 3.0)
    outcome = fold(model)
    content = outcome.summary.content
    assert (outcome.summary.summary_type, outcome.degraded) == ("llm", False)
    assert COUNTER.count_text(content) <= 200
    body, marker = content.rsplit("\n", 1)
    assert marker == SUMMARY_SHORTENED
    assert body.endswith("system.")  # whole sentences only


def test_f36_a_reply_cut_off_by_the_provider_is_retried_with_a_tighter_budget_never_stored():
    model = OverrunningSummarizer(2.0, 1.0)
    outcome = fold(model)
    first, second = model.requests
    assert budget(second) < budget(first)
    assert [attempt.ok for attempt in outcome.attempts] == [False, True]
    assert outcome.attempts[0].error.startswith("TruncatedSummaryError")
    assert outcome.summary.summary_type == "llm" and COUNTER.count_text(outcome.summary.content) <= 200


def test_f36_a_model_always_cut_off_degrades_to_the_raw_archive():
    outcome = fold(OverrunningSummarizer(9.0))
    assert outcome.degraded and outcome.summary.summary_type == "raw"
    assert all(attempt.error.startswith("TruncatedSummaryError") for attempt in outcome.attempts)


def test_a_stored_summary_over_the_cap_is_shrunk_with_room_and_a_stated_budget():
    model = OverrunningSummarizer(1.3, 1.3)
    long = Summary(content=" ".join(SENTENCE.format(n=n) for n in range(60)), summary_type="llm", compressed_count=9)
    outcome = async_to_sync(folder(model).shrink)(long, cap=120)
    assert outcome.summary.summary_type == "llm" and COUNTER.count_text(outcome.summary.content) <= 120
    assert all(request.reply_tokens and request.reply_tokens > request.max_tokens for request in model.requests)
