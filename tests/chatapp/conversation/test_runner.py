"""Concurrent turns in one session (docs/memory.md F-26), compression inside a turn, and the loader the
memory engine reads through."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from chatapp.chats.memory import memory_key_of
from chatapp.chats.selectors import message_list_for_context
from chatapp.chats.turns import turn_in_flight_first_id, turn_in_flight_list, turn_interrupted_list
from chatapp.conversation.leases import (
    INTERRUPTED_TEXT,
    turns_interrupted_close,
)
from chatapp.conversation.runner import chat_turn_run, chat_turn_stop
from chatapp.models import ChatSession, Message, ModelCall
from memory.context.builder import ContextBuilder
from memory.models import CompressionEvent
from memory.storage.summaries import session_summary_get
from tests.chatapp.conftest import (
    TIMEOUT,
    chat_session_make,
    is_done,
    lease_make,
    message_make,
    of_type,
    receive_until,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]


def history_make(session: ChatSession, pairs: int) -> list[Message]:
    """``pairs`` finished turns of plain chat, each about 60 tokens."""
    made = []
    for i in range(pairs):
        made.append(message_make(session, "user", f"Fact number {i}: my locker code {i} is {1000 + i}. " * 3))
        made.append(message_make(session, "assistant", f"Noted, locker {i} has code {1000 + i}.", reply_to=made[-1]))
    return made


async def test_two_tabs_sending_at_once_both_get_their_own_reply(ws, alice, settings):
    settings.OFFLINE_DELAY_SECONDS = 0.2
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    path = f"/ws/chat/{session.pk}/"
    questions = {
        "tab-a": "What is the largest file on paid plans?",
        "tab-b": "Which error code means a conflicting copy?",
    }
    async with ws(path, cookie=alice.cookie) as tab_a, ws(path, cookie=alice.cookie) as tab_b:
        await tab_a.connect(timeout=TIMEOUT)
        await tab_b.connect(timeout=TIMEOUT)
        await tab_a.send_json_to({"type": "chat.send", "client_message_id": "tab-a", "text": questions["tab-a"]})
        await tab_b.send_json_to({"type": "chat.send", "client_message_id": "tab-b", "text": questions["tab-b"]})

        async def both_done(tab) -> list[dict]:
            events: list[dict] = []
            while len(of_type(events, "chat.done")) < 2:
                events += await receive_until(tab, is_done)
            return events

        events_a, events_b = await asyncio.gather(both_done(tab_a), both_done(tab_b))

    users = [m async for m in Message.objects.filter(session=session, role="user").order_by("id")]
    assert sorted(m.client_message_id or "" for m in users) == ["tab-a", "tab-b"]
    for user in users:
        assert user.client_message_id is not None
        answer = await Message.objects.aget(reply_to=user)
        assert answer.status == Message.Status.COMPLETE
        # Each turn's model request ended with its own question, not the other tab's.
        call = await ModelCall.objects.aget(reply_to=user)
        assert call.context["messages"][-1] == {"role": "user", "content": questions[user.client_message_id]}
    assert {e["turn_id"] for e in of_type(events_a, "chat.done")} == {u.pk for u in users}
    assert {e["turn_id"] for e in of_type(events_b, "chat.done")} == {u.pk for u in users}
    assert "50 GB" in ((await Message.objects.aget(reply_to__client_message_id="tab-a")).content or "")
    assert "KS-207" in ((await Message.objects.aget(reply_to__client_message_id="tab-b")).content or "")


async def test_concurrent_turns_compressing_at_once_keep_both_replies_and_a_forward_boundary(alice, settings):
    settings.LLM_CHAT_CONTEXT_WINDOW = 1024
    settings.MEMORY_COMPRESSION = "sync"  # compression inside the turn (docs/memory.md §10)
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.AGENT)
    history = await sync_to_async(history_make)(session, 12)
    first = await sync_to_async(message_make)(session, "user", "search the knowledge base for API rate limits")
    second = await sync_to_async(message_make)(session, "user", "calculate 600 * 60")
    # As the consumer stores them: each question with its lease, so each turn sees the other in flight.
    await sync_to_async(lease_make)(first)
    await sync_to_async(lease_make)(second)

    finals = await asyncio.gather(
        chat_turn_run(session_id=session.pk, user_message_id=first.pk),
        chat_turn_run(session_id=session.pk, user_message_id=second.pk),
    )

    assert [f.status for f in finals] == [Message.Status.COMPLETE, Message.Status.COMPLETE]
    assert [f.reply_to_id for f in finals] == [first.pk, second.pk]
    assert "600 requests per minute" in (finals[0].content or "") and "36000" in (finals[1].content or "")
    state = await sync_to_async(session_summary_get)(memory_key=memory_key_of(session.pk))
    assert state.summary_type in ("llm", "raw") and state.last_message_id is not None
    assert history[0].pk <= state.last_message_id < first.pk
    events = [
        e
        async for e in CompressionEvent.objects.filter(
            memory_key=memory_key_of(session.pk), kind="compression"
        ).order_by("id")
    ]
    boundaries = [e.boundary_after for e in events if e.boundary_after is not None]
    assert events and len(boundaries) == len(events)
    assert all(after > (e.boundary_before or 0) for after, e in zip(boundaries, events, strict=True))
    assert boundaries == sorted(boundaries) and boundaries[-1] == state.last_message_id


async def test_compression_inside_a_turn_is_streamed_as_memory_events(ws, alice, settings):
    settings.LLM_CHAT_CONTEXT_WINDOW = 1024
    settings.MEMORY_COMPRESSION = "sync"  # compression inside the turn (docs/memory.md §10)
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    await sync_to_async(history_make)(session, 12)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to(
            {"type": "chat.send", "client_message_id": "m", "text": "What is locker 11's code?"}
        )
        events = await receive_until(communicator, is_done)

    compression = of_type(events, "memory.compression")[0]["event"]
    assert compression["kind"] == "compression" and compression["messages_summarized"] > 0
    assert compression["tokens_after"] < compression["tokens_before"]
    context = of_type(events, "memory.context")[0]
    assert context["summary"]["type"] in ("llm", "raw") and context["tokens"] <= context["trigger_tokens"]
    assert [e["type"] for e in events].index("memory.compression") < [e["type"] for e in events].index("memory.context")


def test_the_loader_leaves_out_later_messages_of_other_turns(alice):
    session = chat_session_make(alice.owner)
    older = message_make(session, "user", "older question")
    mine = message_make(session, "user", "my question")
    theirs = message_make(session, "user", "a question from the other tab")
    their_reply = message_make(session, "assistant", "their answer", reply_to=theirs)
    my_call = message_make(
        session,
        "assistant",
        None,
        reply_to=mine,
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}],
    )
    my_result = message_make(session, "tool", "2", reply_to=mine, tool_call_id="c1", name="calculator")

    loaded = message_list_for_context(session_id=session.pk, boundary=None, turn_message_id=mine.pk)
    assert [m["id"] for m in loaded] == [older.pk, mine.pk, my_call.pk, my_result.pk]
    assert loaded[3] == {
        "id": my_result.pk,
        "role": "tool",
        "content": "2",
        "tool_call_id": "c1",
        "name": "calculator",
        "token_count": my_result.token_count,
        "created_at": my_result.created,
    }
    # The other turn sees everything before its own question, including mine.
    theirs_loaded = message_list_for_context(session_id=session.pk, boundary=older.pk, turn_message_id=theirs.pk)
    assert [m["id"] for m in theirs_loaded] == [mine.pk, theirs.pk, their_reply.pk]
    # Once both turns are over, a new turn sees every message after the boundary.
    later = message_make(session, "user", "next question")
    assert len(message_list_for_context(session_id=session.pk, boundary=None, turn_message_id=later.pk)) == 7


def test_a_turn_keeps_its_own_messages_after_another_turn_folded_them(alice):
    """A concurrent turn may fold an in-flight question when keeping it would overflow the window; the folded
    turn still sends its own question and steps verbatim (I2), never only the summary."""
    session = chat_session_make(alice.owner)
    older = message_make(session, "user", "older question")
    mine = message_make(session, "user", "my question")
    my_call = message_make(
        session, "assistant", "", reply_to=mine, tool_calls=[{"id": "c1", "type": "function", "function": {}}]
    )
    theirs = message_make(session, "user", "their question")

    loaded = message_list_for_context(session_id=session.pk, boundary=theirs.pk, turn_message_id=mine.pk)

    assert [m["id"] for m in loaded] == [mine.pk, my_call.pk]
    assert older.pk not in [m["id"] for m in loaded]


async def test_a_stop_while_the_context_is_built_never_calls_the_model(alice, monkeypatch):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    user = await sync_to_async(message_make)(session, "user", "How large can a file be?")
    build_context = ContextBuilder.build_context

    async def build_then_stop(self, request):
        context = await build_context(self, request)
        chat_turn_stop(session_id=session.pk)
        return context

    monkeypatch.setattr(ContextBuilder, "build_context", build_then_stop)

    final = await chat_turn_run(session_id=session.pk, user_message_id=user.pk)

    assert final.status == Message.Status.STOPPED and final.content == "[stopped by the user]"
    assert not await ModelCall.objects.filter(session=session).aexists()


async def test_a_newer_turn_never_summarizes_the_question_of_an_older_turn_in_flight(alice, settings):
    settings.LLM_CHAT_CONTEXT_WINDOW = 1024
    settings.MEMORY_COMPRESSION = "sync"  # compression inside the turn (docs/memory.md §10)
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.AGENT)
    await sync_to_async(history_make)(session, 6)
    # Turn A asked a long question and has run one tool step (on another worker: its lease is
    # fresh); turn B was sent from another tab.
    older = await sync_to_async(message_make)(session, "user", "search the knowledge base for trash retention " * 40)
    await sync_to_async(lease_make)(older)
    newer = await sync_to_async(message_make)(session, "user", "calculate 180 - 30")
    call = {"id": "a1", "type": "function", "function": {"name": "kb_search", "arguments": '{"query": "trash"}'}}
    await sync_to_async(message_make)(session, "assistant", None, reply_to=older, tool_calls=[call])
    await sync_to_async(message_make)(
        session,
        "tool",
        "Deleted files stay in the trash for 30 days.",
        reply_to=older,
        tool_call_id="a1",
        name="kb_search",
    )

    newer_final = await chat_turn_run(session_id=session.pk, user_message_id=newer.pk)

    state = await sync_to_async(session_summary_get)(memory_key=memory_key_of(session.pk))
    assert newer_final.status == Message.Status.COMPLETE
    assert state.last_message_id is not None and state.last_message_id < older.pk  # compressed, but not A's question
    older_final = await chat_turn_run(session_id=session.pk, user_message_id=older.pk)
    first_call = await ModelCall.objects.filter(reply_to=older).order_by("step").afirst()
    assert first_call is not None
    context = first_call.context
    current = [m for m, s in zip(context["messages"], context["sources"], strict=True) if s["kind"] == "current"]
    assert current[0] == {"role": "user", "content": older.content}
    assert older_final.status == Message.Status.COMPLETE and "30 days" in (older_final.content or "")


async def test_a_turn_interrupted_by_a_restart_pins_nothing_and_is_closed(alice, settings):
    settings.LLM_CHAT_CONTEXT_WINDOW = 1024
    settings.MEMORY_COMPRESSION = "sync"  # compression inside the turn (docs/memory.md §10)
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    # The server restarted while this question was being answered: no final reply, and its lease
    # was last renewed longer ago than the lease period. A long chat followed on the new server.
    dead = await sync_to_async(message_make)(session, "user", "What is the largest file on paid plans?")
    await sync_to_async(lease_make)(dead, age_seconds=settings.CHAT_TURN_LEASE_SECONDS + 1)
    await sync_to_async(history_make)(session, 12)
    question = await sync_to_async(message_make)(session, "user", "What is locker 11's code?")

    assert await sync_to_async(turn_in_flight_first_id)(session_id=session.pk) is None
    final = await chat_turn_run(session_id=session.pk, user_message_id=question.pk)

    assert final.status == Message.Status.COMPLETE and "1011" in (final.content or "")
    state = await sync_to_async(session_summary_get)(memory_key=memory_key_of(session.pk))
    assert state.last_message_id is not None and state.last_message_id > dead.pk  # compressed past it
    closed = await Message.objects.aget(reply_to=dead)
    assert closed.status == Message.Status.ERROR and closed.content == INTERRUPTED_TEXT
    assert await sync_to_async(turn_interrupted_list)(session_id=session.pk) == []


def test_workers_racing_to_close_an_interrupted_turn_close_it_once(alice, settings):
    session = chat_session_make(alice.owner)
    dead = message_make(session, "user", "a question whose worker died")  # no lease at all
    alive = message_make(session, "user", "a question still being answered elsewhere")
    lease_make(alive)
    barrier = threading.Barrier(4)
    closed: list[list[Message]] = []

    def worker() -> None:
        barrier.wait()
        try:
            closed.append(turns_interrupted_close(session_id=session.pk))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=TIMEOUT)

    assert sorted(len(replies) for replies in closed) == [0, 0, 0, 1]
    assert [(m.reply_to_id, m.status) for m in Message.objects.filter(role="assistant")] == [(dead.pk, "error")]
    assert turn_in_flight_list(session_id=session.pk) == [alive.pk]


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        (
            "How much storage does the Free plan include?",
            (
                "From the knowledge base (Kestrel Sync plans and pricing › Free plan): “It includes 5 GB of storage, "
                "up to 3 devices and 30 days of version history.”"
            ),
        ),
        (
            "Hello, what is Kestrel Sync?",
            (
                "From the knowledge base (Kestrel Sync overview): “Kestrel Sync is a fictional file sync and backup "
                "service made for this demo.”"
            ),
        ),
        ("What's my name?", "I don't find anything about “name” in my current context."),
    ],
)
async def test_offline_quick_answers_quote_the_retrieved_passages_never_the_instructions(alice, question, answer):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    user = await sync_to_async(message_make)(session, "user", question)

    final = await chat_turn_run(session_id=session.pk, user_message_id=user.pk)

    assert final.status == Message.Status.COMPLETE and final.content == answer
