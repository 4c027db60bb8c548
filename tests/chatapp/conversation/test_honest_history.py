"""What the model is shown as history (docs/memory.md F-37) and what a deleted chat leaves behind
(docs/memory.md F-41).

F-37: rows the app wrote in place of a reply (error notes, "too large" refusals, interrupted
turns, a stop before any text) are shown but never sent to the model nor summarized; a reply the
user stopped is sent with a cut-off marker. F-41: deleting a chat while a turn or a compression
runs leaves no row of it in any table and logs no traceback.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.apps import apps
from django.utils import timezone

from chatapp.chats import services
from chatapp.chats.memory import memory_key_of
from chatapp.chats.selectors import STOPPED_REPLY_MARKER, message_list_for_context
from chatapp.chats.turns import turn_in_flight_list, turn_interrupted_list
from chatapp.conversation import turn as turn_module
from chatapp.conversation.compress import session_memory_compress
from chatapp.conversation.leases import (
    INTERRUPTED_TEXT,
    turns_interrupted_close,
)
from chatapp.conversation.quick_answer import quick_answer_system_prompt
from chatapp.conversation.runner import ChatSessionDeleted, chat_turn_run, chat_turn_stop
from chatapp.llm.clients import chat_stream
from chatapp.llm.summarizer import OpenAISummarizer
from chatapp.models import ChatSession, Message, ModelCall
from memory.context.builder import ContextBuilder
from memory.storage.summaries import session_summary_get
from tests.chatapp.conftest import chat_session_make, lease_make, message_make
from tests.chatapp.conversation.test_runner import history_make
from tests.fake_openai import FakeOpenAI, chunk, error, stream

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "db_connections_closed"),
]

OK_STREAM = stream(
    chunk({"role": "assistant", "content": "Sure."}),
    chunk({}, finish_reason="stop"),
    chunk(usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}),
)
NO_PASSAGES_PROMPT = quick_answer_system_prompt([])


@pytest.fixture
def fake_chat(fake_openai: FakeOpenAI, settings: Any) -> FakeOpenAI:
    """The chat model is the fake server (the summarizer stays the offline engine)."""
    settings.LLM_CHAT_BASE_URL = fake_openai.base_url
    settings.LLM_CHAT_MODEL = "fake-model"
    return fake_openai


def wire_sent(fake: FakeOpenAI) -> list[dict[str, Any]]:
    """The messages of the last request the fake chat model received, the system prompt's date line
    (docs/memory.md F-52: today's, in the configured zone) checked and left out."""
    messages = fake.requests[-1].json["messages"]
    prompt, line = messages[0]["content"].rsplit("\n\n", 1)
    assert line.startswith(f"Current date: {timezone.localdate().isoformat()} (") and line.endswith("time zone UTC.")
    return [{**messages[0], "content": prompt}, *messages[1:]]


# --- F-37: placeholders are never sent as replies -------------------------------------------


async def test_f37_after_a_failed_turn_the_next_request_has_no_error_note(alice, fake_chat):
    fake_chat.script(error(500, "upstream exploded"), OK_STREAM)
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    first = await sync_to_async(message_make)(session, "user", "My locker code is 4711.")

    failed = await chat_turn_run(session_id=session.pk, user_message_id=first.pk)

    assert failed.status == Message.Status.ERROR and failed.origin == Message.Origin.APP
    assert "could not answer" in (failed.content or "")  # the user still sees why
    # The error reply ends the turn: it is neither in flight nor interrupted.
    assert await sync_to_async(turn_in_flight_list)(session_id=session.pk) == []
    assert await sync_to_async(turn_interrupted_list)(session_id=session.pk) == []

    second = await sync_to_async(message_make)(session, "user", "What is my locker code?")
    final = await chat_turn_run(session_id=session.pk, user_message_id=second.pk)

    assert final.status == Message.Status.COMPLETE
    assert wire_sent(fake_chat) == [
        {"role": "system", "content": NO_PASSAGES_PROMPT},
        {"role": "user", "content": "My locker code is 4711."},
        {"role": "user", "content": "What is my locker code?"},
    ]
    call = await ModelCall.objects.filter(reply_to=second).aget()
    assert [s["kind"] for s in call.context["sources"]] == ["system", "history", "current"]


async def test_f37_app_notes_are_left_out_and_a_stopped_reply_is_marked_cut_off(alice, fake_chat):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)

    def rows() -> Message:
        u1 = message_make(session, "user", "Plan a trip to Paris.")
        message_make(session, "assistant", "Day 1: the Louvre. Day 2: ", reply_to=u1, status=Message.Status.STOPPED)
        u2 = message_make(session, "user", "Here is my whole diary: ...")
        message_make(
            session,
            "assistant",
            "This message is too large for the model's context window (3000 of 2048 tokens).",
            reply_to=u2,
            status=Message.Status.ERROR,
            origin=Message.Origin.APP,
        )
        u3 = message_make(session, "user", "Hello?")
        message_make(
            session,
            "assistant",
            INTERRUPTED_TEXT,
            reply_to=u3,
            status=Message.Status.ERROR,
            origin=Message.Origin.APP,
        )
        u4 = message_make(session, "user", "Again?")
        message_make(
            session,
            "assistant",
            turn_module.STOPPED_PLACEHOLDER,
            reply_to=u4,
            status=Message.Status.STOPPED,
            origin=Message.Origin.APP,
        )
        return message_make(session, "user", "Which day was the Louvre?")

    question = await sync_to_async(rows)()
    fake_chat.script(OK_STREAM)

    await chat_turn_run(session_id=session.pk, user_message_id=question.pk)

    assert wire_sent(fake_chat) == [
        {"role": "system", "content": NO_PASSAGES_PROMPT},
        {"role": "user", "content": "Plan a trip to Paris."},
        {"role": "assistant", "content": "Day 1: the Louvre. Day 2:… [reply stopped by the user]"},
        {"role": "user", "content": "Here is my whole diary: ..."},
        {"role": "user", "content": "Hello?"},
        {"role": "user", "content": "Again?"},
        {"role": "user", "content": "Which day was the Louvre?"},
    ]
    stopped = await Message.objects.aget(session=session, status=Message.Status.STOPPED, origin=Message.Origin.MODEL)
    assert stopped.content == "Day 1: the Louvre. Day 2: "  # the stored row is untouched (I6)


def test_f37_the_loader_counts_the_marked_copy_of_a_stopped_reply(alice):
    session = chat_session_make(alice.owner)
    user = message_make(session, "user", "Tell me a story.")
    message_make(session, "assistant", "Once upon", reply_to=user, status=Message.Status.STOPPED)
    question = message_make(session, "user", "Go on.")

    loaded = message_list_for_context(session_id=session.pk, boundary=None, turn_message_id=question.pk)

    assert loaded[1]["content"] == f"Once upon{STOPPED_REPLY_MARKER}"
    assert loaded[1]["token_count"] is None  # the engine counts the marked text, not the stored row's


async def test_f37_every_app_written_reply_is_marked_app(alice, settings, monkeypatch):
    settings.LLM_CHAT_CONTEXT_WINDOW = 256
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    # An interrupted turn (its worker died: an expired lease and no reply), closed by the next look.
    dead = await sync_to_async(message_make)(session, "user", "Are you there?")
    await sync_to_async(lease_make)(dead, age_seconds=settings.CHAT_TURN_LEASE_SECONDS + 1)
    [interrupted] = await sync_to_async(turns_interrupted_close)(session_id=session.pk)
    # A message too large for the window: refused without calling the model.
    huge = await sync_to_async(message_make)(session, "user", "lorem ipsum dolor " * 300)
    refused = await chat_turn_run(session_id=session.pk, user_message_id=huge.pk)
    # A stop before the model sent any text.
    build_context = ContextBuilder.build_context

    async def build_then_stop(self, request):
        context = await build_context(self, request)
        chat_turn_stop(session_id=session.pk)
        return context

    monkeypatch.setattr(ContextBuilder, "build_context", build_then_stop)
    short = await sync_to_async(message_make)(session, "user", "Hi")
    stopped = await chat_turn_run(session_id=session.pk, user_message_id=short.pk)

    assert (interrupted.content, interrupted.origin) == (INTERRUPTED_TEXT, Message.Origin.APP)
    assert refused.content is not None and refused.content.startswith("This message is too large")
    assert (refused.status, refused.origin) == (Message.Status.ERROR, Message.Origin.APP)
    assert (stopped.content, stopped.status) == (turn_module.STOPPED_PLACEHOLDER, Message.Status.STOPPED)
    assert stopped.origin == Message.Origin.APP


async def test_f37_app_notes_are_never_summarized(alice):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)

    def rows() -> tuple[Message, Message]:
        u1 = message_make(session, "user", "My locker number is 4711.")
        message_make(
            session,
            "assistant",
            "[The assistant could not answer: HTTP 500 upstream exploded]",
            reply_to=u1,
            status=Message.Status.ERROR,
            origin=Message.Origin.APP,
        )
        u2 = message_make(session, "user", "Thanks, note that my dog is called Biscuit.")
        a2 = message_make(session, "assistant", "Noted: your dog Biscuit.", reply_to=u2)
        return a2, message_make(session, "user", "What do you know about me?")

    last_reply, question = await sync_to_async(rows)()

    await session_memory_compress(session_id=session.pk)  # fold everything before the question

    state = await sync_to_async(session_summary_get)(memory_key=memory_key_of(session.pk))
    assert "4711" in state.content and "Biscuit" in state.content
    assert "could not answer" not in state.content and "500" not in state.content
    assert state.compressed_count == 3  # u1, u2, a2: the error note is not one of them
    assert state.last_message_id == last_reply.pk
    after = await sync_to_async(message_list_for_context)(
        session_id=session.pk, boundary=state.last_message_id, turn_message_id=question.pk
    )
    assert [m["id"] for m in after] == [question.pk]


def test_f37_the_migration_marks_existing_placeholders_as_app(alice):
    migration = importlib.import_module("chatapp.migrations.0005_message_origin")
    session = chat_session_make(alice.owner)
    user = message_make(session, "user", "hi")
    error_reply = message_make(
        session, "assistant", "[The assistant could not answer: x]", reply_to=user, status="error"
    )
    empty_stop = message_make(session, "assistant", "[stopped by the user]", reply_to=user, status="stopped")
    partial_stop = message_make(session, "assistant", "Once upon", reply_to=user, status="stopped")
    answer = message_make(session, "assistant", "Hello!", reply_to=user)

    migration.backfill(apps, None)

    origins = dict(Message.objects.filter(session=session).values_list("pk", "origin"))
    assert origins == {
        user.pk: "model",
        error_reply.pk: "app",
        empty_stop.pk: "app",
        partial_stop.pk: "model",
        answer.pk: "model",
    }


# --- F-41: deleting a chat while it works ----------------------------------------------------


def rows_left(session_id: int, message_ids: list[int]) -> dict[str, int]:
    """``{model label: rows}`` of every table still holding something of the chat: its session
    row, rows pointing at it or at its messages, and rows under its memory key."""
    memory_key = memory_key_of(session_id)
    left: dict[str, int] = {}
    for model in [*apps.get_app_config("chatapp").get_models(), *apps.get_app_config("memory").get_models()]:
        names = {field.name for field in model._meta.get_fields()}
        queries = []
        if model is ChatSession:
            queries.append(model._default_manager.filter(pk=session_id))
        if "session" in names:
            queries.append(model._default_manager.filter(session_id=session_id))
        if "memory_key" in names:
            queries.append(model._default_manager.filter(memory_key=memory_key))
        if "user_message" in names:
            queries.append(model._default_manager.filter(user_message_id__in=message_ids))
        count = sum(query.count() for query in queries)
        if count:
            left[model._meta.label] = count
    return left


class Gate:
    """Holds an awaited call at its start until the test opens the gate."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()

    async def wait(self) -> None:
        self.reached.set()
        await self.opened.wait()


def held_summarizer(monkeypatch: pytest.MonkeyPatch) -> Gate:
    """Every summarizer call waits at the returned gate until the test opens it."""
    gate = Gate()
    real = OpenAISummarizer.summarize

    async def held(self: OpenAISummarizer, request: Any) -> Any:
        await gate.wait()
        return await real(self, request)

    monkeypatch.setattr(OpenAISummarizer, "summarize", held)
    return gate


async def delete_while_held(session: ChatSession, gate: Gate, work: asyncio.Task[Any], *, stop: bool) -> None:
    """Once ``work`` is held at ``gate``, delete ``session`` (as the sidebar's Delete does; with
    ``stop``, also stop its turns as its open socket would), then let ``work`` go on."""
    session_id = session.pk  # delete() sets the instance's pk to None
    async with asyncio.timeout(10):
        await gate.reached.wait()
    assert await sync_to_async(rows_left)(session_id, [])  # the check sees the chat while it exists
    await sync_to_async(services.chat_session_delete)(session=session)
    if stop:
        assert chat_turn_stop(session_id=session_id) == 1
    gate.opened.set()


@pytest.mark.parametrize("stop", [False, True], ids=["model-finishes", "socket-stops-it"])
@pytest.mark.parametrize("mode", [ChatSession.Mode.AGENT, ChatSession.Mode.QUICK_ANSWER])
async def test_f41_deleting_a_chat_while_the_model_answers_leaves_nothing(alice, monkeypatch, caplog, mode, stop):
    caplog.set_level(logging.INFO)
    gate = Gate()

    async def held_stream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        await gate.wait()
        async for event in chat_stream(*args, **kwargs):
            yield event

    monkeypatch.setattr("chatapp.conversation.turn.chat_stream", held_stream)
    session = await sync_to_async(chat_session_make)(alice.owner, mode=mode)
    question = await sync_to_async(message_make)(session, "user", "calculate 6 * 7")
    task = asyncio.create_task(chat_turn_run(session_id=session.pk, user_message_id=question.pk))

    await delete_while_held(session, gate, task, stop=stop)
    with pytest.raises(ChatSessionDeleted):
        async with asyncio.timeout(10):
            await task

    assert await sync_to_async(rows_left)(question.session_id, [question.pk]) == {}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("mode", [ChatSession.Mode.AGENT, ChatSession.Mode.QUICK_ANSWER])
async def test_f41_deleting_a_chat_while_it_compresses_leaves_nothing(alice, settings, monkeypatch, caplog, mode):
    caplog.set_level(logging.INFO)
    settings.LLM_CHAT_CONTEXT_WINDOW = 1024
    settings.MEMORY_COMPRESSION = "sync"  # compression inside the turn (docs/memory.md §10)
    gate = held_summarizer(monkeypatch)
    session = await sync_to_async(chat_session_make)(alice.owner, mode=mode)
    history = await sync_to_async(history_make)(session, 12)
    question = await sync_to_async(message_make)(session, "user", "What is locker 3's code?")
    task = asyncio.create_task(chat_turn_run(session_id=session.pk, user_message_id=question.pk))

    await delete_while_held(session, gate, task, stop=False)
    with pytest.raises(ChatSessionDeleted):
        async with asyncio.timeout(10):
            await task

    ids = [message.pk for message in [*history, question]]
    assert await sync_to_async(rows_left)(question.session_id, ids) == {}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_f41_deleting_a_chat_during_compress_now_leaves_nothing(alice, settings, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    settings.LLM_CHAT_CONTEXT_WINDOW = 1024
    gate = held_summarizer(monkeypatch)
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    history = await sync_to_async(history_make)(session, 4)
    question = await sync_to_async(message_make)(session, "user", "And now?")
    task = asyncio.create_task(session_memory_compress(session_id=session.pk))

    await delete_while_held(session, gate, task, stop=False)
    async with asyncio.timeout(10):
        events = await task

    assert all(event.id is None for event in events)  # reported, never stored
    ids = [message.pk for message in [*history, question]]
    assert await sync_to_async(rows_left)(question.session_id, ids) == {}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
