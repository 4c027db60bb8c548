"""The chat page's socket (``/ws/chat/<id>/page/``, and its alias ``?ui=html``): server-rendered
out-of-band HTML instead of JSON, against the real ASGI application with the offline engine; the
feed rendering from the events themselves (no query for most of them); and the JSON events added
for the page (``memory.summary`` after "compress now", 4404 when a session is deleted)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chatapp.chats.memory import memory_key_of
from chatapp.chats.services import chat_session_delete
from chatapp.conversation.compress import session_memory_compress
from chatapp.conversation.demo import DEMO_SCRIPT
from chatapp.models import ChatSession, Message
from chatapp.realtime.protocol import (
    ChatDeltaEvent,
    ChatDoneEvent,
    ChatMessageEvent,
    ChatTurnEvent,
    ErrorEvent,
    MemoryContextEvent,
    MemorySummaryEvent,
)
from chatapp.ui.page_feed import CHAT_DELETED_TEXT, PageFeed, compression_sentence, partial_render
from memory.api import CompressionRecord, Summary
from memory.storage import summaries as memory_services
from tests.chatapp.conftest import (
    TIMEOUT,
    Visitor,
    chat_session_make,
    is_done,
    message_make,
    of_type,
    receive_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("offline_engine", "demo_kb")]


def page_path(session: ChatSession) -> str:
    return f"/ws/chat/{session.pk}/page/"


async def frames_until(communicator: WebsocketCommunicator, needle: str) -> list[str]:
    """Every HTML frame received up to and including the first that contains ``needle``."""
    frames: list[str] = []
    while True:
        frame = await communicator.receive_from(timeout=TIMEOUT)
        assert frame.lstrip().startswith("<"), f"not HTML: {frame[:80]!r}"
        frames.append(frame)
        if needle in frame:
            return frames


def send(client_message_id: str, text: str) -> dict[str, Any]:
    return {"type": "chat.send", "client_message_id": client_message_id, "text": text}


def history_make(session: ChatSession, pairs: int) -> None:
    for i in range(pairs):
        user = message_make(session, "user", f"Fact number {i}: my locker code {i} is {1000 + i}. " * 3)
        message_make(session, "assistant", f"Noted, locker {i} has code {1000 + i}.", reply_to=user)


async def test_the_page_socket_gets_a_snapshot_then_html_for_a_whole_turn(ws, alice: Visitor):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.AGENT)
    async with ws(page_path(session), cookie=alice.cookie) as page:
        connected, _ = await page.connect(timeout=TIMEOUT)
        assert connected
        snapshot = await page.receive_from(timeout=TIMEOUT)
        assert 'hx-swap-oob="innerHTML:#messages"' in snapshot and 'hx-swap-oob="innerHTML:#live"' in snapshot
        assert '<aside id="inspector"' in snapshot and 'id="turn-status"' in snapshot
        await page.send_json_to(send("c-1", "search the knowledge base for Team plan price"))
        context_frames = await frames_until(page, 'id="ins-request-panel"')  # memory.context of step 1
        frames = list(context_frames)
        frames += await frames_until(page, "delete:#stream-")  # the final reply ends the live reply
        frames += await frames_until(page, "Enter sends")  # the turn status after chat.done
        assert await page.receive_nothing(timeout=0.2)

    # memory.context updates the "Last request" panel from the event, not the whole inspector,
    # which is rebuilt once, at chat.done.
    assert '<aside id="inspector"' not in context_frames[-1]
    assert 'data-testid="context-used">' in context_frames[-1] and "shows when the reply ends" in context_frames[-1]
    assert sum(frame.count('<aside id="inspector"') for frame in frames) == 1
    assert (
        sum(
            frame.count('id="ins-request-panel" class="panel" aria-labelledby="ins-request" hx-swap')
            for frame in frames
        )
        == 2
    )

    user = await Message.objects.aget(session=session, client_message_id="c-1")
    html = "".join(frames)
    assert f'<div hx-swap-oob="beforeend:#messages">\n<article id="message-{user.pk}"' in html
    assert f'id="stream-{user.pk}"' in html and "Thinking…" in html
    assert f"beforeend:#stream-{user.pk} .stream-text" in html  # streamed text
    assert "Calls <code>kb_search</code>" in html and "Result of <code>kb_search</code>" in html
    assert "12 euros" in html
    # Every stored message was appended exactly once.
    ids = [m.pk async for m in Message.objects.filter(session=session)]
    for message_id in ids:
        assert html.count(f'<article id="message-{message_id}"') == 1
    assert '<h1 id="chat-title" hx-swap-oob="true">search the knowledge base' in html
    assert "{" not in html.split("<", 1)[0]  # no JSON anywhere before the first tag


async def test_a_compressing_turn_refreshes_the_inspector_and_the_marks(ws, alice: Visitor, settings):
    settings.LLM_CHAT_CONTEXT_WINDOW = 1024
    settings.MEMORY_COMPRESSION = "sync"  # compression inside the turn (docs/memory.md §10)
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    await sync_to_async(history_make)(session, 12)
    async with ws(page_path(session), cookie=alice.cookie) as page:
        await page.connect(timeout=TIMEOUT)
        snapshot = await page.receive_from(timeout=TIMEOUT)
        assert 'data-mark="summarized"' not in snapshot
        await page.send_json_to(send("c-1", "What is locker 11's code?"))
        frames = await frames_until(page, "Enter sends")  # the turn status after chat.done
    html = "".join(frames)
    first = await Message.objects.filter(session=session).order_by("id").afirst()
    assert first is not None
    assert "Memory compressed:" in html and 'id="announce"' in html
    assert 'data-health="ok"' in html and 'data-summary-version="1"' in html
    # The first message's mark changed to "summarized" without re-sending the message.
    mark = f'<span id="mark-{first.pk}" class="mark" data-mark="summarized" hx-swap-oob="true">in summary</span>'
    assert mark in html
    assert html.count(f'<article id="message-{first.pk}"') == 0


async def test_a_resend_after_reconnect_appends_nothing_twice(ws, alice: Visitor):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(page_path(session), cookie=alice.cookie) as page:
        await page.connect(timeout=TIMEOUT)
        await page.receive_from(timeout=TIMEOUT)
        await page.send_json_to(send("c-1", "What is the largest file on paid plans?"))
        await frames_until(page, "Enter sends")
        await page.send_json_to(send("c-1", "What is the largest file on paid plans?"))  # duplicate
        frames = await frames_until(page, '<aside id="inspector"')  # its chat.done refreshes the inspector
    assert not any('<article id="message-' in frame for frame in frames)
    assert await Message.objects.filter(session=session, role="user").acount() == 1


async def test_an_invalid_message_marks_the_pending_bubble_rejected(ws, alice: Visitor, settings):
    settings.CHAT_MAX_MESSAGE_CHARS = 10
    session = await sync_to_async(chat_session_make)(alice.owner)
    async with ws(page_path(session), cookie=alice.cookie) as page:
        await page.connect(timeout=TIMEOUT)
        await page.receive_from(timeout=TIMEOUT)
        await page.send_json_to(send("c-9", "far too long for the limit"))
        frame = await page.receive_from(timeout=TIMEOUT)
    assert '<div id="errors" class="errors" role="alert" hx-swap-oob="true"><p>The message is 26 characters' in frame
    assert 'hx-swap-oob="beforeend:#outbox [data-client-id=&quot;c-9&quot;]"' in frame and "Not sent:" in frame


@pytest.mark.parametrize("stranger", ["bob", "anonymous"])
async def test_strangers_cannot_open_the_page_socket(ws, alice: Visitor, bob: Visitor, anon: Visitor, stranger: str):
    session = await sync_to_async(chat_session_make)(alice.owner)
    cookie = bob.cookie if stranger == "bob" else anon.cookie
    async with ws(page_path(session), cookie=cookie) as page:
        connected, _ = await page.connect(timeout=TIMEOUT)
        assert connected
        assert await page.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4404}


@pytest.mark.parametrize("path_suffix", ["", "page/", "?ui=html"])
async def test_deleting_a_session_closes_its_sockets_with_4404(ws, alice: Visitor, path_suffix: str):
    session = await sync_to_async(chat_session_make)(alice.owner)
    async with ws(f"/ws/chat/{session.pk}/{path_suffix}", cookie=alice.cookie) as socket:
        await socket.connect(timeout=TIMEOUT)
        if path_suffix:
            await socket.receive_from(timeout=TIMEOUT)
        session_id = session.pk
        await sync_to_async(chat_session_delete)(session=session)
        if path_suffix:  # the page is told first: its composer disabled, the chat gone from its sidebar
            told = await socket.receive_from(timeout=TIMEOUT)
            assert 'id="composer"' in told and "data-gone" in told and "disabled" in told
            assert CHAT_DELETED_TEXT in told and f'hx-swap-oob="delete:#session-item-{session_id}"' in told
        assert await socket.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4404}


async def test_compress_now_tells_json_sockets_about_the_new_summary(ws, alice: Visitor):
    session = await sync_to_async(chat_session_make)(alice.owner)
    await sync_to_async(history_make)(session, 2)
    await sync_to_async(message_make)(session, "user", "And locker 0?")
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as socket:
        await socket.connect(timeout=TIMEOUT)
        events = await session_memory_compress(session_id=session.pk)
        received = await receive_until(socket, lambda e: e["type"] == "memory.summary")
    assert [e.kind for e in events] == ["compression"]
    compression = of_type(received, "memory.compression")[0]
    assert compression["turn_id"] is None and compression["event"]["messages_summarized"] == 4
    summary = of_type(received, "memory.summary")[0]["summary"]
    assert summary["version"] == 1 and summary["compressed_count"] == 4


async def test_a_json_socket_still_gets_json(ws, alice: Visitor):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as socket:
        await socket.connect(timeout=TIMEOUT)
        assert await socket.receive_nothing(timeout=0.2)  # no snapshot for API clients
        await socket.send_json_to(send("c-1", "What is the largest file on paid plans?"))
        events = await receive_until(socket, is_done)
    assert events[0]["type"] == "chat.ack" and of_type(events, "memory.context")


def summary_move(session: ChatSession, boundary: int, version: int = 0) -> None:
    """Store a summary covering every message up to ``boundary`` (as a compression would)."""
    saved = memory_services.session_summary_save(
        memory_key=memory_key_of(session.pk),
        expected_version=version,
        new=Summary(content="s", summary_type="raw", last_message_id=boundary, compressed_count=2),
        token_count=1,
    )
    assert saved


def context_event(turn_id: int, **fields: Any) -> MemoryContextEvent:
    values: dict[str, Any] = {
        "turn_id": turn_id,
        "step": 1,
        "model_call_id": 7,
        "sources": [],
        "tokens": 600,
        "sections": {"system": 100, "summary": 50, "retained": 200, "current": 150, "tools": 40},
        "context_window": 2048,
        "trigger_tokens": 1024,
        "target_tokens": 614,
        "summary": {"type": "none", "content": "", "last_message_id": None, "compressed_count": 0, "version": 0},
        "elisions": [],
        "repairs": [],
        "overflow": False,
    }
    return MemoryContextEvent(**{**values, **fields})


def test_the_feed_sends_only_the_marks_that_changed(alice: Visitor):
    session = chat_session_make(alice.owner)
    history_make(session, 2)
    feed = PageFeed(session_id=session.pk)
    feed.snapshot()
    summary_event = MemorySummaryEvent(turn_id=None, step=0, summary={})
    assert feed.render(summary_event).count('class="mark"') == 0
    # Move the boundary past the first two messages: exactly their marks are sent, and since no
    # request sent that summary yet, they are in it for the next request.
    ids = list(Message.objects.filter(session=session).order_by("id").values_list("id", flat=True))
    summary_move(session, ids[1])
    html = feed.render(summary_event)
    assert re.findall(r'id="mark-(\d+)" class="mark" data-mark="folded"', html) == [str(ids[0]), str(ids[1])]
    assert 'data-summary-version="1"' in html and "raw archive" in html
    assert feed.render(summary_event).count('class="mark"') == 0


def test_a_new_turn_clears_the_last_announcement(alice: Visitor):
    session = chat_session_make(alice.owner)
    user = message_make(session, "user", "Hello?")
    feed = PageFeed(session_id=session.pk)
    feed.snapshot()
    frame = feed.render(ChatTurnEvent(turn_id=user.pk, status="started", mode="agent"))
    assert '<p id="announce" class="announce" role="status" hx-swap-oob="true"></p>' in frame


def test_a_degraded_compression_is_announced_as_archived_not_summarized():
    event = {
        "kind": "compression",
        "mode": "agent",
        "context_window": 2048,
        "trigger_tokens": 1024,
        "target_tokens": 614,
        "tokens_before": 1029,
        "tokens_after": 772,
        "messages_summarized": 8,
    }
    assert compression_sentence(CompressionRecord.from_dict({**event, "degraded": True})) == (
        "Memory compressed: 8 messages archived verbatim (raw archive: the summarizer failed); "
        "request 1,029 → 772 tokens."
    )
    assert compression_sentence(CompressionRecord.from_dict({**event, "degraded": False, "result_type": "llm"})) == (
        "Memory compressed: 8 messages folded into the summary (LLM summary); request 1,029 → 772 tokens."
    )


def test_f37_an_app_written_reply_is_marked_not_sent_and_keeps_that_mark(alice: Visitor):
    session = chat_session_make(alice.owner)
    question = message_make(session, "user", "Hello?")
    note = message_make(
        session, "assistant", "[Interrupted]", reply_to=question, status="error", origin=Message.Origin.APP
    )
    feed = PageFeed(session_id=session.pk)
    snapshot = feed.snapshot()
    assert f'id="mark-{note.pk}" class="mark" data-mark="not-sent"' in snapshot
    assert "not sent to the model" in snapshot
    # The boundary passes both rows: the question is in the summary (for the next request), the note
    # still is not.
    summary_move(session, note.pk)
    html = feed.render(MemorySummaryEvent(turn_id=None, step=0, summary={}))
    assert re.findall(r'id="mark-(\d+)" class="mark" data-mark="(\w[\w-]*)"', html) == [(str(question.pk), "folded")]
    # A note stored while the page is open is marked the same way.
    later = message_make(session, "user", "Again?")
    refusal = message_make(session, "assistant", "too large", reply_to=later, status="error", origin="app")
    html = feed.render(ChatMessageEvent(message=refusal.as_dict()))
    assert f'id="mark-{refusal.pk}" class="mark" data-mark="not-sent"' in html


def test_memory_context_renders_the_request_and_the_marks_from_the_event_alone(alice: Visitor):
    session = chat_session_make(alice.owner)
    history_make(session, 2)
    ids = list(Message.objects.filter(session=session).order_by("id").values_list("id", flat=True))
    question = message_make(session, "user", "And locker 1?")
    feed = PageFeed(session_id=session.pk)
    feed.snapshot()
    event = context_event(
        question.pk,
        sources=[
            {"id": None, "kind": "system"},
            {"id": None, "kind": "summary"},
            *({"id": message_id, "kind": "history"} for message_id in ids[2:]),
            {"id": question.pk, "kind": "current"},
        ],
        summary={"type": "llm", "content": "s", "last_message_id": ids[1], "compressed_count": 2, "version": 1},
        elisions=[{"id": question.pk, "role": "user", "tokens_before": 90, "tokens_after": 40}],
    )
    with CaptureQueriesContext(connection) as queries:
        assert not feed.needs_database(event)
        html = feed.render(event)
    assert len(queries) == 0
    marks = dict(re.findall(r'id="mark-(\d+)" class="mark" data-mark="(\w*)" hx-swap-oob="true"', html))
    assert marks == {
        **{str(message_id): "summarized" for message_id in ids[:2]},
        **{str(message_id): "retained" for message_id in ids[2:]},
        str(question.pk): "current",
    }
    assert '<section id="ins-request-panel" class="panel" aria-labelledby="ins-request" hx-swap-oob="true">' in html
    assert '<aside id="inspector"' not in html
    assert 'data-testid="context-used">600 / 2,048</strong>' in html
    assert 'data-section="overhead"' in html and ">60</td>" in html  # 600 - (100 + 50 + 200 + 150 + 40)
    assert f"message #{question.pk} (90 → 40 tokens)" in html
    assert feed.render(event).count('class="mark"') == 0  # nothing changed since
    # A request that overflowed was not sent: the panel and the last request's marks stay, and what
    # its compression folded is in the summary for the next request.
    overflow = context_event(question.pk, model_call_id=None, overflow=True, summary={"last_message_id": ids[2]})
    html = feed.render(overflow)
    assert "ins-request-panel" not in html
    assert re.findall(r'id="mark-(\d+)" class="mark" data-mark="([\w-]*)"', html) == [(str(ids[2]), "folded")]


def test_stored_messages_render_from_the_event_like_the_page_renders_the_row(alice: Visitor):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.AGENT)
    user = message_make(session, "user", "What does **Team** cost?", client_message_id="c-1")
    call = {"id": "call_1", "type": "function", "function": {"name": "kb_search", "arguments": '{"query": "Team"}'}}
    calling = message_make(session, "assistant", None, reply_to=user, tool_calls=[call])
    result = message_make(
        session, "tool", "12 euros <b>per</b> user", reply_to=user, tool_call_id="call_1", name="kb_search"
    )
    answer = message_make(session, "assistant", "It costs *12 euros*.", reply_to=user, status=Message.Status.STOPPED)
    for message in (user, calling, result, answer):
        from_row = partial_render("message", {"message": message, "mark": "retained"})
        from_event = partial_render("message", {"message": message.as_dict(), "mark": "retained"})
        assert from_event == from_row
        assert f'<article id="message-{message.pk}"' in from_event


def test_only_user_messages_and_turn_ends_query_the_database(alice: Visitor):
    session = chat_session_make(alice.owner)
    user = message_make(session, "user", "Hello?")
    feed = PageFeed(session_id=session.pk)
    feed.snapshot()
    reply = message_make(session, "assistant", "Hi.", reply_to=user)
    with CaptureQueriesContext(connection) as queries:
        frames = [
            feed.render(ChatDeltaEvent(turn_id=user.pk, step=1, text="Hi")),
            feed.render(ChatMessageEvent(message=reply.as_dict(), step=1)),
            feed.render(ErrorEvent(code="bad_field", message="no", client_message_id="c-2")),
        ]
    assert len(queries) == 0
    assert f'<article id="message-{reply.pk}"' in frames[1] and f"delete:#stream-{user.pk}" in frames[1]
    assert feed.needs_database(ChatMessageEvent(message=user.as_dict()))
    assert feed.needs_database(ChatDoneEvent(turn_id=user.pk, status="complete", message_id=reply.pk))
    assert not feed.needs_database(ChatMessageEvent(message=reply.as_dict(), step=1))
    done = feed.render(ChatDoneEvent(turn_id=user.pk, status="complete", message_id=reply.pk))
    assert done.count('<aside id="inspector"') == 1


def test_the_demos_last_or_stopped_step_says_the_demo_ended(alice: Visitor):
    session = chat_session_make(alice.owner)
    first = message_make(session, "user", DEMO_SCRIPT[0].text, client_message_id="demo-1")
    feed = PageFeed(session_id=session.pk)
    feed.snapshot()  # the first step is on the page already; the last one arrives as chat.message
    last = message_make(session, "user", DEMO_SCRIPT[-1].text, client_message_id=f"demo-{len(DEMO_SCRIPT)}")
    own = message_make(session, "user", "A question of mine.", client_message_id="c-1")
    for message in (last, own):
        feed.render(ChatMessageEvent(message=message.as_dict()))

    def note(turn: Message, status: str) -> str:
        frame = feed.render(ChatDoneEvent(turn_id=turn.pk, status=status, message_id=turn.pk + 100))
        found = re.search(r'<p id="thread-note"[^>]*>([^<]*)</p>', frame)
        return found.group(1) if found else ""

    assert note(first, "complete") == "" and note(own, "stopped") == ""
    assert (
        note(first, "stopped") == f"The demo stopped at step 1 of {len(DEMO_SCRIPT)}. This chat is yours to go on with."
    )
    assert note(last, "complete").startswith(f"The demo has ended: all {len(DEMO_SCRIPT)} steps ran.")


async def test_the_json_route_with_ui_html_is_the_page_socket(ws, alice: Visitor):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/?ui=html", cookie=alice.cookie) as page:
        await page.connect(timeout=TIMEOUT)
        snapshot = await page.receive_from(timeout=TIMEOUT)
        assert 'hx-swap-oob="innerHTML:#messages"' in snapshot
        await page.send_json_to(send("u-1", "How large can a file be?"))
        frames = await frames_until(page, "Enter sends")
    assert '<aside id="inspector"' in "".join(frames)


async def test_the_first_message_removes_the_empty_state_line_and_later_ones_do_not(ws, alice: Visitor):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(page_path(session), cookie=alice.cookie) as page:
        await page.connect(timeout=TIMEOUT)
        snapshot = await page.receive_from(timeout=TIMEOUT)
        assert 'class="empty-chat"' in snapshot
        await page.send_json_to(send("e-1", "How large can a file be?"))
        first = await frames_until(page, "Enter sends")  # the turn ended
        await page.send_json_to(send("e-2", "Where are the data centres?"))
        second = await frames_until(page, "e-2")

    removals = [frame for frame in first if 'hx-swap-oob="delete:#messages .empty-chat"' in frame]
    assert len(removals) == 1 and 'data-client-id="e-1"' in removals[0]
    assert not any("empty-chat" in frame for frame in second)
