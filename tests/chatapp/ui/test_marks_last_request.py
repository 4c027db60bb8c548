"""Transcript marks say where each message sat in the last request, as the inspector's "Last
request" panel shows it, never the summary the memory job wrote since; what the job folded into
the summary after that request carries its own mark, "next request: in summary"."""

from __future__ import annotations

import re
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.conversation.runner import chat_turn_run
from chatapp.models import ChatSession, Message, ModelCall
from chatapp.realtime.protocol import ChatDoneEvent, MemorySummaryEvent
from chatapp.ui.inspector.marks import MARK_FOLDED, MARK_LABELS, MarkBasis, folded_boundary_of
from chatapp.ui.page_feed import PageFeed
from memory.api import MemoryEngine
from memory.storage.summaries import session_summary_get
from tests.chatapp.conftest import Visitor, chat_session_make, message_make
from tests.chatapp.ui.test_page_items import marks_in, page_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]


@pytest.fixture
def small_window(settings: Any) -> None:
    """A window the history outgrows, compressed only by the memory job (pre-compression)."""
    settings.LLM_CHAT_CONTEXT_WINDOW = 1024
    settings.MEMORY_COMPRESSION = "background"


def turn(session: ChatSession, text: str) -> Message:
    question = message_make(session, "user", text)
    reply = async_to_sync(chat_turn_run)(session_id=session.pk, user_message_id=question.pk)
    assert reply.status == Message.Status.COMPLETE
    return question


def turns_until_precompressed(session: ChatSession, monkeypatch: pytest.MonkeyPatch) -> ModelCall:
    """Turns, each followed by its memory job, until a job folds more than the last request's summary
    (which already holds some messages): that request's model call."""
    monkeypatch.setattr(MemoryEngine, "schedule", lambda *args, **kwargs: None)  # the test runs the job
    for i in range(30):
        turn(session, f"Fact number {i}: my locker code {i} is {1000 + i}. " * 3)
        call = ModelCall.objects.filter(session=session).latest("id")
        async_to_sync(memory_engine().run_jobs)(memory_key_of(session.pk))
        stored = session_summary_get(memory_key=memory_key_of(session.pk))
        sent = call.context["summary"]
        if sent.get("last_message_id") is not None and stored.version > sent["version"]:
            return call
    raise AssertionError("no pre-compression after a request that sent a summary")


def request_boundary_shown(html: str) -> int | None:
    """The summary boundary of the last request as the inspector's "Last request" panel shows it."""
    found = re.search(r'data-testid="request-summary" data-boundary="(\d*)"', html)
    assert found, "the Last request panel says which summary it sent"
    return int(found.group(1)) if found.group(1) else None


@pytest.mark.usefixtures("small_window")
def test_after_the_jobs_precompression_the_marks_still_show_the_last_request(
    alice: Visitor, monkeypatch: pytest.MonkeyPatch
):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    last_call = turns_until_precompressed(session, monkeypatch)
    assert last_call.context["path"] == "under_trigger"
    stored = session_summary_get(memory_key=memory_key_of(session.pk))
    sent_boundary: int | None = last_call.context["summary"].get("last_message_id")
    assert stored.last_message_id is not None and stored.last_message_id > (sent_boundary or 0)

    html = page_of(alice, session)
    marks = marks_in(html)
    ids = sorted(marks)
    summarized = [i for i in ids if marks[i] == "summarized"]
    # The bug: every message up to the job's new boundary was badged "in summary".
    assert all(sent_boundary is not None and i <= sent_boundary for i in summarized), (sent_boundary, summarized)
    folded = [i for i in ids if (sent_boundary or 0) < i <= stored.last_message_id]
    assert folded and all(marks[i] == "folded" for i in folded), {i: marks[i] for i in folded}
    assert "next request: in summary" in html
    # Past the new boundary, the marks are the last request's: retained, current, or stored after it.
    sources = last_call.context["sources"]
    history = {s["id"] for s in sources if s.get("kind") == "history"}
    current = {s["id"] for s in sources if s.get("kind") == "current"}
    for i in ids:
        if i > stored.last_message_id:
            expected = "retained" if i in history else "current" if i in current else "next"
            assert marks[i] == expected, (i, marks[i])
    # The inspector's Last request panel shows the boundary the badges follow.
    assert request_boundary_shown(html) == sent_boundary

    # The page's socket agrees: the job's memory.summary and chat.done change nothing back.
    feed = PageFeed(session_id=session.pk)
    feed.snapshot()
    assert feed.marks == marks
    assert 'class="mark"' not in feed.render(MemorySummaryEvent(turn_id=None, step=0, summary={}))
    assert 'class="mark"' not in feed.render(
        ChatDoneEvent(turn_id=last_call.reply_to_id or 0, message_id=ids[-1], status="complete")
    )


@pytest.mark.usefixtures("small_window")
def test_a_page_open_during_the_job_moves_folded_messages_to_their_own_mark(
    alice: Visitor, monkeypatch: pytest.MonkeyPatch
):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    feed = PageFeed(session_id=session.pk)
    real_run_jobs = MemoryEngine.run_jobs
    seen: dict[int, str] = {}

    async def run_jobs_seen_by_an_open_page(self: MemoryEngine, memory_key: str) -> Any:
        # A page opened before the job: its marks then, and the frame of the job's memory.summary after.
        await sync_to_async(feed.snapshot)()
        seen.clear()
        seen.update(feed.marks)
        return await real_run_jobs(self, memory_key)

    monkeypatch.setattr(MemoryEngine, "run_jobs", run_jobs_seen_by_an_open_page)
    last_call = turns_until_precompressed(session, monkeypatch)
    sent_boundary = last_call.context["summary"]["last_message_id"]
    stored = session_summary_get(memory_key=memory_key_of(session.pk))
    assert stored.last_message_id is not None
    assert {i for i, mark in seen.items() if mark == "summarized"} == {i for i in seen if i <= sent_boundary}
    html = feed.render(MemorySummaryEvent(turn_id=None, step=0, summary={}))
    changed = {int(i): mark for i, mark in re.findall(r'id="mark-(\d+)" class="mark" data-mark="([\w-]*)"', html)}
    assert changed == {i: "folded" for i in seen if sent_boundary < i <= stored.last_message_id}
    # The next request sends that summary: its messages are then plainly "in summary".
    question = turn(session, "What is locker 3's code?")
    marks = marks_in(page_of(alice, session))
    assert "folded" not in marks.values()
    assert all(marks[i] == "summarized" for i in marks if i <= stored.last_message_id)
    assert marks[question.pk] == "current"


def test_a_basis_marks_what_was_folded_since_the_last_request_for_the_next_one():
    basis = MarkBasis(
        boundary=2,
        history_ids=frozenset({3, 4, 5}),
        current_ids=frozenset({6}),
        folded_boundary=folded_boundary_of(sent=2, stored=4),
    )
    assert [basis.mark(i) for i in range(1, 8)] == [
        "summarized",
        "summarized",
        MARK_FOLDED,
        MARK_FOLDED,
        "retained",
        "current",
        "next",
    ]
    assert MARK_LABELS[MARK_FOLDED] == "next request: in summary"
    # Nothing folded since: no such mark; before any request, a stored summary is for the next one.
    assert folded_boundary_of(sent=4, stored=4) is None and folded_boundary_of(sent=None, stored=None) is None
    assert MarkBasis(folded_boundary=folded_boundary_of(sent=None, stored=3)).mark(3) == MARK_FOLDED
