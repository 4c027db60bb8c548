"""A frame over Daphne's size limit (1 MiB) closes the socket with 1009 and a reason, stores
nothing, and the chat goes on over a new socket (docs/protocol.md "Close codes"). Below the
limit, a frame too long for a message gets ``bad_frame`` on a socket that stays open."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from asgiref.sync import sync_to_async
from websockets.exceptions import ConnectionClosed

from chatapp.models import ChatSession, Message
from chatapp.realtime import protocol
from tests.chatapp.conftest import chat_session_make
from tests.production.conftest import receive_json, receive_until, socket_open

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_connections_closed")]


def send_frame(client_message_id: str, text: str) -> str:
    return json.dumps({"type": "chat.send", "client_message_id": client_message_id, "text": text})


@pytest.mark.timeout(120)
async def test_a_frame_over_the_servers_limit_is_closed_with_1009_and_nothing_is_lost(start_single_worker, owner):
    worker = await sync_to_async(start_single_worker)()
    session = await sync_to_async(chat_session_make)(owner.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    path = f"/ws/chat/{session.pk}/"

    async with socket_open(worker, path, owner.cookie) as socket:
        # Under the server's limit but over a message's: an error event, and the socket stays open.
        await socket.send(send_frame("long", "x" * 200_000))
        async with asyncio.timeout(30):
            error = await receive_json(socket)
        assert (error["type"], error["code"]) == ("error", protocol.BAD_FRAME)

        # The server may close while the client is still writing the frame: that send fails,
        # and the close code and reason are the same either way.
        with contextlib.suppress(ConnectionClosed):
            await socket.send(send_frame("huge", "x" * (5 * 1024 * 1024)))
        async with asyncio.timeout(30):
            await socket.wait_closed()
    assert socket.close_code == protocol.CLOSE_TOO_BIG
    assert "exceeds payload limit" in (socket.close_reason or "")

    async with socket_open(worker, path, owner.cookie) as again:
        await again.send(send_frame("after", "How large can a file be?"))
        async with asyncio.timeout(30):
            events = await receive_until(again, lambda event: event["type"] == "chat.done")
    assert events[-1]["status"] == Message.Status.COMPLETE

    assert await sync_to_async(user_messages)(session) == ["after"]


def user_messages(session: ChatSession) -> list[str | None]:
    return list(
        Message.objects.filter(session=session, role=Message.Role.USER).values_list("client_message_id", flat=True)
    )
