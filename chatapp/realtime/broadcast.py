"""Server-to-browser events of a chat session, sent as JSON to its sockets' channel-layer group, on any worker. Takes
anything with an ``as_payload()``: the protocol module sits beside this one (docs/architecture.md)."""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

# The channel-layer message type the consumer relays to its socket (handler ``session_event``).
RELAY_TYPE = "session.event"
# The channel-layer message that stops the deleted session's turns and closes its sockets (``session_deleted``).
DELETED_TYPE = "session.deleted"


class SessionEvent(Protocol):
    """A server event (:class:`chatapp.realtime.protocol.ServerEvent`): anything that gives its JSON object."""

    def as_payload(self) -> dict[str, Any]: ...


def session_group_name(session_id: int) -> str:
    """The channel-layer group of every socket open on chat session ``session_id``."""
    return f"chat.session.{session_id}"


async def event_broadcast(session_id: int, event: SessionEvent) -> None:
    """Send ``event`` now to every socket of the session (use for events about nothing stored)."""
    await _payload_broadcast(session_id, event.as_payload())


def event_broadcast_on_commit(session_id: int, event: SessionEvent) -> None:
    """Send ``event`` once the current transaction commits (now without one), never if it rolls back; its JSON is
    taken now, so later changes to what it refers to do not leak into it."""
    transaction.on_commit(partial(async_to_sync(_payload_broadcast), session_id, event.as_payload()))


async def _payload_broadcast(session_id: int, payload: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(session_group_name(session_id), {"type": RELAY_TYPE, "event": payload})


def session_sockets_close_on_commit(session_id: int) -> None:
    """Once the deleting transaction commits, every socket of the session stops its turns and closes with 4404."""
    layer = get_channel_layer()
    if layer is not None:
        transaction.on_commit(
            partial(async_to_sync(layer.group_send), session_group_name(session_id), {"type": DELETED_TYPE})
        )
