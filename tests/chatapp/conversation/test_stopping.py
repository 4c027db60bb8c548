"""``chat.stop`` reaching a turn through the channel layer (chatapp/conversation/stopping.py),
whichever worker runs it: here the worker is this process, reached only through the group of
workers running the session's turns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from chatapp.conversation import stopping
from chatapp.conversation.runner import chat_turn_run, chat_turn_stop_everywhere
from chatapp.models import ChatSession, Message
from chatapp.realtime.broadcast import session_group_name
from tests.chatapp.conftest import chat_session_make, message_make

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]


async def running_turn(
    session: ChatSession, text: str, *, before_start: Callable[[], object] = lambda: None
) -> tuple[Message, asyncio.Task[Message]]:
    """A turn of ``session`` running in the background, waiting for the (slow) model: returns
    once the session's sockets would have heard ``memory.context`` (the model is being called).
    ``before_start`` runs just before the turn starts."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(session_group_name(session.pk), channel)
    before_start()
    user = await sync_to_async(message_make)(session, "user", text)
    task = asyncio.create_task(chat_turn_run(session_id=session.pk, user_message_id=user.pk))
    async with asyncio.timeout(10):
        while (await layer.receive(channel))["event"]["type"] != "memory.context":
            pass
    await layer.group_discard(session_group_name(session.pk), channel)
    return user, task


async def test_a_stop_sent_through_the_channel_layer_stops_the_turn(alice, settings):
    settings.OFFLINE_DELAY_SECONDS = 30
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    other = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    user, task = await running_turn(session, "How large can a file be?")
    _, other_task = await running_turn(other, "Which plans are there?")

    # What another worker sends: only the group of the workers running this session's turns.
    await stopping.turn_stop_broadcast(session_id=session.pk)
    async with asyncio.timeout(5):
        final = await task

    assert final.status == Message.Status.STOPPED and final.reply_to_id == user.pk
    assert not other_task.done()  # the other session's turn runs on
    await chat_turn_stop_everywhere(session_id=other.pk)
    async with asyncio.timeout(5):
        assert (await other_task).status == Message.Status.STOPPED


async def test_a_broken_channel_layer_loses_only_remote_stops(alice, settings, monkeypatch):
    settings.OFFLINE_DELAY_SECONDS = 30
    layer = get_channel_layer()

    async def unreachable(*args, **kwargs):
        raise ConnectionError("the channel layer is down")

    def break_the_layer() -> None:
        # The listener cannot open its channel, and the stop cannot be sent to other workers.
        monkeypatch.setattr(layer, "new_channel", unreachable)
        monkeypatch.setattr(stopping, "turn_stop_broadcast", unreachable)

    await stopping.turn_stop_listener_close()
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    _, task = await running_turn(session, "How large can a file be?", before_start=break_the_layer)

    # The turn runs although it cannot listen; a stop from this process still reaches it.
    assert await chat_turn_stop_everywhere(session_id=session.pk) == 1
    async with asyncio.timeout(5):
        assert (await task).status == Message.Status.STOPPED
    await stopping.turn_stop_listener_close()


async def test_a_worker_leaves_the_sessions_group_when_its_turns_end(alice):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    user = await sync_to_async(message_make)(session, "user", "How large can a file be?")

    final = await chat_turn_run(session_id=session.pk, user_message_id=user.pk)

    assert final.status == Message.Status.COMPLETE
    listener = stopping._listeners[asyncio.get_running_loop()]
    assert session.pk not in listener.sessions
    groups = getattr(get_channel_layer(), "groups", None)
    if groups is not None:  # the in-memory layer shows its groups
        assert listener.channel not in groups.get(stopping.turns_group_name(session.pk), {})
