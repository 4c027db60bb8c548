"""Idle sockets stay open on Redis: the channel layer's blocking receive (5 s) is never cut by
the Redis client's socket timeout (redis-py 8 defaults to 5 s and closed every idle socket with
code 1011 about every 5 s), and a socket idle that long still gets the session's events."""

from __future__ import annotations

import asyncio
import os

import pytest
from asgiref.sync import sync_to_async

from chatapp.models import ChatSession, Message
from tests.chatapp.conftest import chat_session_make
from tests.production.conftest import receive_until, socket_open

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_connections_closed")]

# Real seconds the socket stays idle: four times the failure period seen with redis-py 8.
IDLE_SECONDS = float(os.environ.get("IDLE_SOCKET_SECONDS", "20"))


@pytest.mark.timeout(120 + IDLE_SECONDS)
async def test_an_idle_socket_stays_open_and_still_gets_the_sessions_events(start_worker, owner):
    worker = await sync_to_async(start_worker)()
    session = await sync_to_async(chat_session_make)(owner.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    path = f"/ws/chat/{session.pk}/"

    async with socket_open(worker, path, owner.cookie) as idle:
        # Nothing arrives, and the socket must not close (a close raises ConnectionClosed here).
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(IDLE_SECONDS):
                await idle.recv()
        assert idle.close_code is None

        async with socket_open(worker, path, owner.cookie) as other:
            await other.send(
                '{"type": "chat.send", "client_message_id": "after-idle", "text": "How large can a file be?"}'
            )
            async with asyncio.timeout(30):
                events = await receive_until(idle, lambda event: event["type"] == "chat.done")

    assert next(e["message"]["client_message_id"] for e in events if e["type"] == "chat.message") == "after-idle"
    assert events[-1]["status"] == Message.Status.COMPLETE
    assert "".join(e["text"] for e in events if e["type"] == "chat.delta")
    assert "TimeoutError" not in "".join(worker.log), "".join(worker.log)
