"""Server events of a chat session sent as JSON to its sockets' channel-layer group, from any worker."""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

RELAY_TYPE = "session.event"
DELETED_TYPE = "session.deleted"


class SessionEvent(Protocol):
    def as_payload(self) -> dict[str, Any]: ...


def session_group_name(session_id: int) -> str:
    return f"chat.session.{session_id}"


async def event_broadcast(session_id: int, event: SessionEvent) -> None:
    """Send ``event`` now to every socket of the session (use for events about nothing stored)."""
    await _payload_broadcast(session_id, event.as_payload())


def event_broadcast_on_commit(session_id: int, event: SessionEvent) -> None:
    """Send ``event`` once the transaction commits (now without one), never on rollback; its JSON is taken now."""
    transaction.on_commit(partial(async_to_sync(_payload_broadcast), session_id, event.as_payload()))


async def _payload_broadcast(session_id: int, payload: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(session_group_name(session_id), {"type": RELAY_TYPE, "event": payload})


def session_sockets_close_on_commit(session_id: int) -> None:
    layer = get_channel_layer()
    if layer is not None:
        transaction.on_commit(
            partial(async_to_sync(layer.group_send), session_group_name(session_id), {"type": DELETED_TYPE})
        )
