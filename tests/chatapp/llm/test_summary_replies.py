"""Cut-off, empty and marker-only summarizer replies over real HTTP (docs/memory.md F-36).

A reply with ``finish_reason: "length"`` arrives with HTTP 200 and plausible text, yet it is
incomplete: it must fail its attempt like an HTTP 500 would, so the chain goes on to the next
attempt, the failover, then the raw archive; it is never stored. Same for empty text and for a
reply that is only a trimming marker, streamed or not.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from chatapp.llm.clients import Endpoint, chat_endpoint
from chatapp.llm.summarizer import OpenAISummarizer
from memory.context.budget import MemoryBudget
from memory.context.builder import ContextBuilder
from memory.context.request import ContextRequest
from memory.models import CompressionEvent, SessionSummary
from memory.ports import SummaryRequest
from memory.storage.summaries import OrmSummaryStore, summarizer_health_get
from memory.summary.chain import SummarizerChain
from memory.summary.prompts import TRIM_MARKER, build_summary_prompt
from tests.fake_openai import FakeOpenAI, Reply, completion, text_stream
from tests.memory.builders import COUNTER, Store, asst, user

CUT = "- User: my order number is A-12"  # the provider stopped here: the "345" never came
GOOD = "- User: my order number is A-12345."


def endpoint_for(server: FakeOpenAI, *, model: str) -> Endpoint:
    return Endpoint(base_url=server.base_url, api_key="test-key", model=model, context_window=8192, timeout=5.0)


def summary_request() -> SummaryRequest:
    transcript = "- User: my order number is A-12345."
    prompt = build_summary_prompt(previous_summary="", transcript=transcript, max_tokens=64)
    return SummaryRequest(previous_summary="", messages=[], prompt=prompt, max_tokens=64)


def chain(primary: FakeOpenAI, failover: FakeOpenAI | None, *, stream: bool, attempts: int = 2) -> SummarizerChain:
    def summarizer(server: FakeOpenAI, model: str) -> OpenAISummarizer:
        return OpenAISummarizer(endpoint=endpoint_for(server, model=model), stream=stream)

    return SummarizerChain(
        primary=summarizer(primary, "primary"),
        failover=summarizer(failover, "backup") if failover else None,
        attempts=attempts,
        backoff=0,
    )


def reply(text: str | None, *, finish_reason: str, stream: bool) -> Reply:
    if stream:
        return text_stream(text or "", finish_reason=finish_reason)
    return completion(text, finish_reason=finish_reason)


@pytest.mark.parametrize("stream", [False, True], ids=["completion", "streamed"])
@pytest.mark.parametrize(
    ("text", "finish_reason", "error"),
    [
        (CUT, "length", "TruncatedSummaryError: reply cut off by the provider (finish_reason 'length'"),
        ("", "stop", "EmptySummaryError"),
        (TRIM_MARKER, "stop", "MarkerOnlySummaryError"),
        (f"{TRIM_MARKER}\n\n[Raw archive of newly added messages]\n…", "stop", "MarkerOnlySummaryError"),
    ],
    ids=["length", "empty", "marker", "markers"],
)
async def test_f36_an_unusable_reply_fails_its_attempt_and_the_chain_fails_over(
    fake_openai: FakeOpenAI,
    fake_openai_failover: FakeOpenAI,
    stream: bool,
    text: str,
    finish_reason: str,
    error: str,
) -> None:
    fake_openai.script(reply(text, finish_reason=finish_reason, stream=stream))
    fake_openai_failover.script(reply(GOOD, finish_reason="stop", stream=stream))

    result = await chain(fake_openai, fake_openai_failover, stream=stream).run(summary_request())

    assert result.text == GOOD and result.phase == "failover"
    assert [(a.phase, a.number, a.ok) for a in result.attempts] == [
        ("primary", 1, False),
        ("primary", 2, False),
        ("failover", 1, True),
    ]
    # An empty stream is refused by the client itself ("returned an empty reply").
    expected = "returned an empty reply" if stream and not text else error
    assert all(expected in a.error for a in result.attempts[:2]), result.attempts
    assert len(fake_openai.requests) == 2 and len(fake_openai_failover.requests) == 1
    assert bool(fake_openai.requests[0].json.get("stream")) is stream


@pytest.mark.parametrize("stream", [False, True], ids=["completion", "streamed"])
async def test_f36_a_cut_off_reply_is_refused_then_a_retry_succeeds(fake_openai: FakeOpenAI, stream: bool) -> None:
    fake_openai.script(
        reply(CUT, finish_reason="length", stream=stream), reply(GOOD, finish_reason="stop", stream=stream)
    )

    result = await chain(fake_openai, None, stream=stream).run(summary_request())

    assert result.text == GOOD
    assert [(a.number, a.ok) for a in result.attempts] == [(1, False), (2, True)]
    assert result.attempts[0].error.startswith("TruncatedSummaryError")


async def test_streamed_summarizer_sends_the_prompt_with_its_cap_and_temperature(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(text_stream(GOOD))
    request = summary_request()

    got = await OpenAISummarizer(
        endpoint=endpoint_for(fake_openai, model="sum"), temperature=0.2, stream=True
    ).summarize(request)

    assert (got.text, got.finish_reason) == (GOOD, "stop")
    (sent,) = fake_openai.requests
    assert sent.json["stream"] is True and sent.json["messages"] == request.prompt
    assert (sent.json["max_tokens"], sent.json["temperature"], sent.json["model"]) == (64, 0.2, "sum")


@pytest.mark.django_db
def test_f36_a_cut_off_summary_is_never_stored_and_the_failure_is_on_the_record(fake_openai: FakeOpenAI) -> None:
    """The whole path: engine, chain, HTTP, database. The provider cuts every summary off; the old
    summary survives (raw archive appended, layer 3) and the compression record and summarizer
    health (what the inspector shows) name the cut-off attempts."""
    memory_key = "f36-cut-off"
    store = Store()
    engine = ContextBuilder(
        budget=MemoryBudget(context_window=2048),
        chain=SummarizerChain(primary=OpenAISummarizer(endpoint=endpoint_for(fake_openai, model="sum")), backoff=0),
        counter=COUNTER,
        store=OrmSummaryStore(),
    )
    request = ContextRequest(
        memory_key=memory_key, system_prompt="Be brief.", load_increment=store.load_increment, mode="quick-answer"
    )

    def chat(turns: int, start: int) -> None:
        for i in range(start, start + turns):
            store.add(user(f"Question {i}: " + "lorem " * 40), asst(f"Answer {i}: " + "ipsum " * 40))
        store.add(user("and now?"))

    chat(12, 0)
    fake_openai.script(completion("- User: my name is Ada."))
    async_to_sync(engine.build_context)(request)
    assert SessionSummary.objects.get(memory_key=memory_key).content == "- User: my name is Ada."
    chat(12, 100)
    fake_openai.script(completion(CUT, finish_reason="length"))
    asked = len(fake_openai.requests)

    context = async_to_sync(engine.build_context)(request)

    row = SessionSummary.objects.get(memory_key=memory_key)
    assert row.summary_type == "raw" and row.content.startswith("- User: my name is Ada.")
    assert CUT not in row.content
    event = CompressionEvent.objects.filter(memory_key=memory_key, kind="compression").latest("id")
    assert event.degraded and len(event.attempts) == 3 == len(fake_openai.requests) - asked
    assert all(not a["ok"] and a["error"].startswith("TruncatedSummaryError") for a in event.attempts)
    health = summarizer_health_get(memory_key=memory_key)
    assert health["status"] == "raw_archive" and health["last_error"].startswith("TruncatedSummaryError")
    assert any(e.kind == "compression" for e in context.events)


async def test_the_offline_engine_serves_a_streamed_summary_too() -> None:
    got = await OpenAISummarizer(endpoint=chat_endpoint(), stream=True).summarize(summary_request())

    assert got.finish_reason == "stop" and "A-12345" in got.text
