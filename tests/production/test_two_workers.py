"""Two Daphne workers sharing PostgreSQL and Redis, as behind a load balancer: a chat's sockets
on either worker see the same stream and the same stored messages, a stop reaches a turn
running on the other worker (even after the socket that started it closed), and a worker killed
mid-turn leaves a turn the other worker closes within the lease time."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from asgiref.sync import sync_to_async

from chatapp.conversation.leases import INTERRUPTED_TEXT
from chatapp.models import ChatSession, Message, TurnLease
from tests.chatapp.conftest import chat_session_make
from tests.production.conftest import postgres_required, receive_until, socket_open

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("db_connections_closed"),
    pytest.mark.timeout(180),
]

# The shortest lease settings allow: a dead worker's turn is closed about this long after it died.
LEASE_SECONDS = 10
# Room for a loaded two-core machine on top of the lease (seconds).
SLACK_SECONDS = 8


def send(client_message_id: str, text: str) -> str:
    return json.dumps({"type": "chat.send", "client_message_id": client_message_id, "text": text})


def is_done(event: dict) -> bool:
    return event["type"] == "chat.done"


@pytest.fixture
def workers(start_worker):
    """``workers(a_env, b_env)``: two workers, A and B, with their extra variables (dicts)."""

    def start(a_env: dict[str, str] | None = None, b_env: dict[str, str] | None = None):
        postgres_required()
        return start_worker(**(a_env or {})), start_worker(**(b_env or {}))

    return start


async def quick_answer_session(owner) -> ChatSession:
    return await sync_to_async(chat_session_make)(owner.owner, mode=ChatSession.Mode.QUICK_ANSWER)


async def test_a_turn_sent_on_one_worker_streams_to_a_socket_on_the_other(workers, owner):
    worker_a, worker_b = await sync_to_async(workers)()
    session = await quick_answer_session(owner)
    path = f"/ws/chat/{session.pk}/"

    async with socket_open(worker_a, path, owner.cookie) as on_a, socket_open(worker_b, path, owner.cookie) as on_b:
        await on_a.send(send("two-workers", "How much storage does the Free plan include?"))
        async with asyncio.timeout(30):
            seen_on_a = await receive_until(on_a, is_done)
            seen_on_b = await receive_until(on_b, is_done)
            await on_b.send(json.dumps({"type": "chat.sync", "after_message_id": 0}))
            history = await receive_until(on_b, lambda event: event["type"] == "chat.history")

    streamed = "".join(event["text"] for event in seen_on_b if event["type"] == "chat.delta")
    kinds_on_b = [event["type"] for event in seen_on_b]
    assert kinds_on_b[0] == "chat.message" and "chat.turn" in kinds_on_b and "chat.delta" in kinds_on_b
    assert [e for e in seen_on_a if e["type"] != "chat.ack"] == seen_on_b  # the same stream, in order
    user, reply = [m async for m in Message.objects.filter(session=session).order_by("id")]
    assert (user.client_message_id, reply.reply_to_id, reply.status) == ("two-workers", user.pk, "complete")
    assert streamed == reply.content
    assert [m["id"] for m in history[-1]["messages"]] == [user.pk, reply.pk] and history[-1]["pending"] == []


async def test_a_stop_from_the_other_worker_stops_a_turn_whose_socket_closed(workers, owner):
    # The offline engine waits a minute before answering: the turn is still running when stopped.
    worker_a, worker_b = await sync_to_async(workers)({"OFFLINE_DELAY": "60"})
    session = await quick_answer_session(owner)
    path = f"/ws/chat/{session.pk}/"

    async with socket_open(worker_a, path, owner.cookie) as on_a:
        await on_a.send(send("stop-me", "How large can a file be?"))
        async with asyncio.timeout(30):
            await receive_until(on_a, lambda event: event["type"] == "memory.context")  # the model is called
    async with socket_open(worker_b, path, owner.cookie) as on_b:
        started = time.monotonic()
        await on_b.send(json.dumps({"type": "chat.stop"}))
        async with asyncio.timeout(15):
            events = await receive_until(on_b, is_done)
        stopped_after = time.monotonic() - started

    assert events[-1]["status"] == Message.Status.STOPPED, events
    assert stopped_after < 10
    reply = await Message.objects.aget(session=session, role=Message.Role.ASSISTANT)
    user = await Message.objects.aget(session=session, role=Message.Role.USER)
    assert (reply.status, reply.reply_to_id, user.client_message_id) == (Message.Status.STOPPED, user.pk, "stop-me")
    assert not await TurnLease.objects.filter(user_message__session=session).aexists()


async def test_a_turn_of_a_killed_worker_is_closed_by_the_other_within_the_lease(workers, owner):
    lease = {"CHAT_TURN_LEASE_SECONDS": str(LEASE_SECONDS)}
    worker_a, worker_b = await sync_to_async(workers)({"OFFLINE_DELAY": "60", **lease}, lease)
    session = await quick_answer_session(owner)
    path = f"/ws/chat/{session.pk}/"

    async with socket_open(worker_b, path, owner.cookie) as on_b:
        async with socket_open(worker_a, path, owner.cookie) as on_a:
            await on_a.send(send("doomed", "How large can a file be?"))
            async with asyncio.timeout(30):
                await receive_until(on_b, lambda event: event["type"] == "memory.context")
            await sync_to_async(worker_a.kill)()
            killed = time.monotonic()
        async with asyncio.timeout(LEASE_SECONDS + SLACK_SECONDS):
            events = await receive_until(on_b, is_done)
        closed_after = time.monotonic() - killed
        # The interrupted turn is closed, and the chat goes on on the surviving worker.
        await on_b.send(send("after", "How much storage does the Free plan include?"))
        async with asyncio.timeout(30):
            after = await receive_until(on_b, is_done)

    assert events[-1]["status"] == Message.Status.ERROR and closed_after <= LEASE_SECONDS + SLACK_SECONDS
    closed = await Message.objects.aget(session=session, reply_to__client_message_id="doomed")
    assert closed.content == INTERRUPTED_TEXT and closed.status == Message.Status.ERROR
    assert after[-1]["status"] == Message.Status.COMPLETE
    assert not await TurnLease.objects.filter(user_message__session=session).aexists()
    assert [e["turn_id"] for e in events + after if is_done(e)] == [closed.reply_to_id, after[-1]["turn_id"]]
