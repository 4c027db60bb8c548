"""Background memory jobs in the app (docs/memory.md §10): after a reply the session's job
pre-compresses, so the next request finds itself under the trigger and makes no summarizer call
before its first token; a request still over the trigger waits at most ``MEMORY_SYNC_WAIT_MS``
for a running job, then goes on with the degraded context; a deleted session keeps nothing."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chatapp.chats import services
from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.conversation.runner import chat_turn_run
from chatapp.models import ChatSession, Message, ModelCall
from chatapp.ui.inspector.state import inspector_state_get
from memory.models import CompressionEvent
from memory.storage.job_state import memory_job_state_get
from memory.storage.summaries import session_summary_get
from tests.chatapp.conftest import chat_session_make, message_make
from tests.chatapp.conversation.test_honest_history import Gate, held_summarizer, rows_left

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]


def history_make(session: ChatSession, pairs: int) -> None:
    """``pairs`` finished turns of plain chat, each about 60 tokens."""
    for i in range(pairs):
        user = message_make(session, "user", f"Fact number {i}: my locker code {i} is {1000 + i}. " * 3)
        message_make(session, "assistant", f"Noted, locker {i} has code {1000 + i}.", reply_to=user)


async def turn(session: ChatSession, text: str) -> ModelCall:
    """Run one turn of ``session`` and return its first model call."""
    question = await sync_to_async(message_make)(session, "user", text)
    reply = await chat_turn_run(session_id=session.pk, user_message_id=question.pk)
    assert reply.status == Message.Status.COMPLETE
    call = await ModelCall.objects.filter(reply_to=question).order_by("step").afirst()
    assert call is not None
    return call


def summarizer_called(call: ModelCall) -> bool:
    return any(event.get("attempts") for event in call.context["events"])


@pytest.fixture
def small_window(settings: Any) -> None:
    settings.LLM_CHAT_CONTEXT_WINDOW = 1024
    settings.MEMORY_COMPRESSION = "background"


async def session_with_a_job_held_in_the_summarizer(
    alice: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[ChatSession, Gate, asyncio.Task[Any]]:
    """A quick-answer session over the trigger whose memory job is compressing, held in the
    summarizer until the test opens the returned gate; and the job's task."""
    gate = held_summarizer(monkeypatch)
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    await sync_to_async(history_make)(session, 12)
    job = asyncio.create_task(memory_engine().run_jobs(memory_key_of(session.pk)))
    async with asyncio.timeout(10):
        await gate.reached.wait()
    return session, gate, job


@pytest.mark.usefixtures("small_window")
async def test_after_a_reply_the_job_precompresses_so_the_next_turn_calls_no_summarizer(alice):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    await sync_to_async(history_make)(session, 12)

    first = await turn(session, "What is locker 3's code?")
    # Over the trigger with nothing running: the degraded context is sent at once and the
    # compression is left to the job; the request wrote nothing.
    assert first.context["path"] == "deferred"
    assert not summarizer_called(first) and first.estimated_tokens <= 1024
    assert (await sync_to_async(session_summary_get)(memory_key=str(session.pk))).version == 0

    await memory_engine().run_jobs(memory_key_of(session.pk))
    job = await sync_to_async(memory_job_state_get)(memory_key=str(session.pk))
    last_id = await Message.objects.filter(session=session).order_by("-id").values_list("id", flat=True).afirst()
    assert (job.status, job.watermarks, job.runs) == (
        "idle",
        {"extract_facts": last_id, "precompress": last_id, "index": last_id},
        1,
    )
    compressions = [e async for e in CompressionEvent.objects.filter(memory_key=str(session.pk), kind="compression")]
    assert [(e.origin, e.degraded) for e in compressions] == [("job", False)]
    assert compressions[0].attempts, "the job called the summarizer"

    second = await turn(session, "And locker 5?")
    assert second.context["path"] == "under_trigger"
    assert not summarizer_called(second) and second.context["events"] == []
    assert second.context["summary"]["version"] == 1

    state = await sync_to_async(inspector_state_get)(session_id=session.pk)
    assert state.job.status == "queued", "the second reply scheduled a job, still in its debounce pause"
    assert [event.origin for event in state.timeline] == ["job"]


@pytest.mark.usefixtures("small_window")
async def test_a_request_over_the_trigger_uses_the_summary_of_a_job_that_ends_while_it_waits(
    alice, settings, monkeypatch
):
    settings.MEMORY_SYNC_WAIT_MS = 30_000
    session, gate, job = await session_with_a_job_held_in_the_summarizer(alice, monkeypatch)

    runner = memory_engine().jobs()
    real_wait = runner.wait
    waiting = asyncio.Event()

    async def spy_wait(memory_key: str, timeout_seconds: float, **kwargs: Any) -> bool:
        waiting.set()
        return await real_wait(memory_key, timeout_seconds, **kwargs)

    monkeypatch.setattr(runner, "wait", spy_wait)
    asked = asyncio.create_task(turn(session, "What is locker 3's code?"))
    async with asyncio.timeout(10):
        await waiting.wait()
    gate.opened.set()
    async with asyncio.timeout(30):
        call = await asked
        await job
    assert call.context["path"] == "waited"
    assert call.context["summary"]["version"] == 1 and not summarizer_called(call)
    assert call.estimated_tokens <= call.context["trigger_tokens"]


@pytest.mark.usefixtures("small_window")
async def test_a_request_waits_at_most_the_configured_time_then_sends_the_degraded_context(
    alice, settings, monkeypatch
):
    settings.MEMORY_SYNC_WAIT_MS = 200
    session, gate, job = await session_with_a_job_held_in_the_summarizer(alice, monkeypatch)

    async with asyncio.timeout(30):
        call = await turn(session, "What is locker 3's code?")
    assert call.context["path"] == "deferred"
    assert 200 <= call.context["waited_ms"] < 30_000
    assert call.estimated_tokens <= 1024 and not summarizer_called(call)
    assert call.context["summary"]["type"] == "raw", "the overflow went to an in-memory raw archive"
    assert (await sync_to_async(session_summary_get)(memory_key=str(session.pk))).version == 0
    gate.opened.set()
    async with asyncio.timeout(30):
        await job
    assert (await sync_to_async(session_summary_get)(memory_key=str(session.pk))).version == 1


@pytest.mark.usefixtures("small_window")
async def test_a_session_deleted_while_its_job_runs_leaves_no_rows(alice, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    session, gate, job = await session_with_a_job_held_in_the_summarizer(alice, monkeypatch)
    session_id = session.pk  # delete() sets the instance's pk to None
    await sync_to_async(services.chat_session_delete)(session=session)
    gate.opened.set()
    async with asyncio.timeout(30):
        await job
    assert await sync_to_async(rows_left)(session_id, []) == {}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []

    # A job of a session already gone creates nothing either.
    await memory_engine().run_jobs(memory_key_of(session_id))
    assert await sync_to_async(rows_left)(session_id, []) == {}


async def test_in_sync_mode_the_request_compresses_and_the_job_only_extracts_facts(alice, settings):
    settings.LLM_CHAT_CONTEXT_WINDOW = 1024
    settings.MEMORY_COMPRESSION = "sync"
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    await sync_to_async(history_make)(session, 12)
    call = await turn(session, "What is locker 3's code?")
    assert call.context["path"] == "compressed" and summarizer_called(call)
    await memory_engine().run_jobs(memory_key_of(session.pk))
    assert not await CompressionEvent.objects.filter(memory_key=str(session.pk), origin="job").aexists()
    job = await sync_to_async(memory_job_state_get)(memory_key=str(session.pk))
    assert set(job.watermarks) == {"extract_facts", "index"}, "pre-compression was not due"


@pytest.mark.usefixtures("small_window")
async def test_a_turn_far_under_the_trigger_batches_its_job_and_one_near_it_starts_it(alice, settings):
    # docs/memory.md §10 "when the job runs": nothing urgent -> the job waits for idleness. The agent prompt, tools
    # and date line take about 300 tokens: 1,280 leaves a short chat clearly under the trigger.
    settings.LLM_CHAT_CONTEXT_WINDOW = 1280
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.AGENT)
    memory_key = str(session.pk)
    await turn(session, "calculate 6 * 7")
    assert memory_engine().jobs().waits_for_idle(memory_key), "a short chat cannot reach the trigger next time"
    state = await sync_to_async(inspector_state_get)(session_id=session.pk)
    assert state.job.status == "batched" and "idle" in state.job.label
    await sync_to_async(history_make)(session, 6)
    await turn(session, "calculate 6 * 8")
    runner = memory_engine().jobs()
    assert runner.busy(memory_key) and not runner.waits_for_idle(memory_key), "the next request may cross it"
    await memory_engine().jobs().close()
