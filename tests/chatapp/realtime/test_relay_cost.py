"""What a chat socket does per relayed event and per turn of its own
(docs/architecture.md): no thread hop to close database connections before a relayed event, and no
lease watch (a query each time) for turns its own process runs; a turn of another worker is still
watched."""

from __future__ import annotations

import channels.consumer
import channels.db
import pytest
from asgiref.sync import sync_to_async

from chatapp.conversation import leases
from chatapp.models import ChatSession
from chatapp.realtime import consumers
from chatapp.realtime.broadcast import event_broadcast
from chatapp.realtime.consumers import ChatSocket
from chatapp.realtime.protocol import ChatDeltaEvent, ChatTurnEvent
from tests.chatapp.conftest import TIMEOUT, chat_session_make, is_done, lease_make, message_make, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("offline_engine", "demo_kb")]


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call of channels' ``aclose_old_connections`` by the chat sockets (a hop to the
    thread-sensitive thread)."""
    calls: list[str] = []
    original = channels.db.aclose_old_connections

    async def counted() -> None:
        calls.append("aclose_old_connections")
        await original()

    monkeypatch.setattr(consumers, "aclose_old_connections", counted)
    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)
    return calls


@pytest.fixture
def watch_starts(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """Every call of ``ChatSocket.lease_watch_ensure`` (each may start a lease watch, which queries),
    by session id: one on connect, then one per relayed event that opens a turn to watch."""
    calls: list[int | None] = []
    original = ChatSocket.lease_watch_ensure

    def counted(self: ChatSocket) -> None:
        calls.append(self.chat_session.pk if self.chat_session else None)
        original(self)

    monkeypatch.setattr(ChatSocket, "lease_watch_ensure", counted)
    # Turns of earlier tests whose loop closed before they ended stay in the process's lease sets;
    # message ids restart with each test's tables, so this test starts from empty ones.
    monkeypatch.setattr(leases, "_leases_kept", set())
    monkeypatch.setattr(leases, "_leases_claimed", set())
    return calls


async def test_relayed_events_skip_the_connection_cleanup_hop_client_frames_keep_it(ws, alice, hops):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to({"type": "chat.sync", "after_message_id": 0})
        await receive_until(communicator, lambda event: event["type"] == "chat.history")
        assert hops == ["aclose_old_connections"] * 2  # websocket.connect, websocket.receive
        for text in ("hel", "lo"):
            await event_broadcast(session.pk, ChatDeltaEvent(turn_id=1, step=1, text=text))
            assert (await communicator.receive_json_from(timeout=TIMEOUT))["text"] == text
        assert len(hops) == 2  # two session.event messages relayed: no hop


async def test_a_socket_does_not_watch_the_leases_of_turns_its_process_runs(ws, alice, watch_starts):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to(
            {"type": "chat.send", "client_message_id": "own-1", "text": "How large can a file be?"}
        )
        events = await receive_until(communicator, is_done)
    assert [event["type"] for event in events if event["type"] in ("chat.message", "chat.turn")][:2] == [
        "chat.message",
        "chat.turn",
    ]
    assert watch_starts == [session.pk]  # on connect only: its own turn's events started none


async def test_a_turn_of_another_worker_is_still_watched(ws, alice, watch_starts):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        # A turn that another worker runs: its lease is fresh, and this process does not keep it.
        other = await sync_to_async(message_make)(session, "user", "a question on worker B")
        await sync_to_async(lease_make)(other)
        await event_broadcast(session.pk, ChatTurnEvent(turn_id=other.pk, status="started", mode="quick-answer"))
        assert (await communicator.receive_json_from(timeout=TIMEOUT))["turn_id"] == other.pk
    assert watch_starts == [session.pk, session.pk]  # on connect, and for the other worker's turn
