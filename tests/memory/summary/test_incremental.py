"""Incremental summarization: a summarizer's reply never carries a credential of its input, however it
was told, and the raw archive withholds them too (docs/memory.md §3 step 4, §4, F-51)."""

from __future__ import annotations

from asgiref.sync import async_to_sync

from memory.ports import SummaryRequest
from memory.summary.archive import RAW_ARCHIVE_MARKER
from memory.summary.chain import SummarizerChain
from memory.summary.incremental import IncrementalSummarizer
from memory.summary.prompts import SUMMARY_INSTRUCTIONS
from memory.summary.store import Summary
from tests.memory.builders import COUNTER, asst, tool, user

SECRET_TURN = "Reservation ZFA04Y. My password is Blue-Falcon-88 and the verification code is 482913."


class EchoSummarizer:
    """A summarizer that records its prompts and replies ``reply``; by default it ignores its instructions and repeats
    every credential of the raw messages bare."""

    model = "echo"

    def __init__(self, reply: str = "User booked ZFA04Y. Remember: Blue-Falcon-88 then 482913.") -> None:
        self.prompts: list[str] = []
        self.reply = reply

    async def summarize(self, request: SummaryRequest) -> str:
        self.prompts.append(request.prompt[-1]["content"])
        return self.reply


def folder(summarizer) -> IncrementalSummarizer:
    chain = SummarizerChain(primary=summarizer, attempts=1, backoff=0)
    return IncrementalSummarizer(chain=chain, counter=COUNTER, ratio=0.3, window=4096)


def with_ids(*messages):
    return [{**message, "id": number} for number, message in enumerate(messages, 1)]


def test_f51_an_llm_summary_that_echoes_a_secret_is_redacted_before_it_is_stored():
    echo = EchoSummarizer()
    outcome = async_to_sync(folder(echo).fold)(Summary(), with_ids(user(SECRET_TURN), asst("Done.")), cap=300)
    content = outcome.summary.content
    assert outcome.summary.summary_type == "llm"
    assert "Blue-Falcon-88" not in content and "482913" not in content
    assert "[password withheld]" in content and "[one-time code withheld]" in content and "ZFA04Y" in content
    # The summarizer was never shown the secrets, and was told not to write any.
    (prompt,) = echo.prompts
    assert "Blue-Falcon-88" not in prompt and "ZFA04Y" in prompt
    assert "credential" in SUMMARY_INSTRUCTIONS


class FailingSummarizer:
    model = "down"

    async def summarize(self, request: SummaryRequest) -> str:
        raise RuntimeError("provider down")


def test_f51_the_raw_archive_withholds_secrets_of_the_messages_and_of_the_previous_summary():
    previous = Summary(content="- User: my PIN is 4821", summary_type="raw", compressed_count=1, last_message_id=0)
    outcome = async_to_sync(folder(FailingSummarizer()).fold)(
        previous, with_ids(user(SECRET_TURN), asst("Done.")), cap=400
    )
    archive = outcome.summary.content
    assert outcome.degraded and RAW_ARCHIVE_MARKER in archive
    assert "ZFA04Y" in archive and "[password withheld]" in archive and "[PIN withheld]" in archive
    assert not any(secret in archive for secret in ("Blue-Falcon-88", "482913", "4821"))


def test_a_tool_result_that_found_nothing_never_reaches_the_summary():
    """An empty search result is no fact: the summarizer is never shown it, and a fold of nothing else asks no
    model yet moves the boundary past it (docs/memory.md §12, "Results that found nothing")."""
    recorder = EchoSummarizer(reply="The user asked about the Bianchi bicycle; the search found nothing.")
    chain = SummarizerChain(primary=recorder, attempts=1, backoff=0)
    fold = IncrementalSummarizer(
        chain=chain, counter=COUNTER, ratio=0.3, window=4096, empty_results=("no passages found",)
    )
    turn = with_ids(
        user("Who sold me the Bianchi bicycle?"),
        asst(tc=["k1"]),
        tool("k1", "no passages found for 'Bianchi bicycle'"),
        asst("I searched the knowledge base and found nothing."),
    )
    outcome = async_to_sync(fold.fold)(Summary(), turn, cap=300)
    (prompt,) = recorder.prompts
    assert "Bianchi bicycle?" in prompt and "found nothing." in prompt
    assert "no passages found" not in prompt
    assert outcome.summary.last_message_id == 4 and outcome.summary.compressed_count == 4

    before = Summary(
        content="Earlier: the user owns a Bianchi.", summary_type="llm", last_message_id=4, compressed_count=4
    )
    empty_only = [{**tool("k2", "  No passages found for 'x'"), "id": 5}, {**tool("k3", ""), "id": 6}]
    outcome = async_to_sync(fold.fold)(before, empty_only, cap=300)
    assert len(recorder.prompts) == 1 and outcome.attempts == []
    assert outcome.summary.content == before.content and outcome.summary.summary_type == "llm"
    assert outcome.summary.last_message_id == 6 and outcome.summary.compressed_count == 6
