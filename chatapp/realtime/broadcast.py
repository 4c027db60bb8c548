"""Server-to-browser events of a chat session, fanned out through the channel layer.

Every socket open on a session joins the group :func:`session_group_name`; a turn broadcasts its
events there, so a reply streamed while a tab reconnects reaches the new socket, on whichever
worker it landed. Events about stored rows are sent only after the database commit
(:func:`event_broadcast_on_commit`), so no client is told about something that was rolled back.

An event is one of the server events of :mod:`chatapp.realtime.protocol` (docs/protocol.md); it
travels through the channel layer as its JSON object (``as_payload()``), which the JSON socket
sends as is and the chat page's socket turns back into the typed event. This module does not
import the protocol module (they sit side by side in the bottom layer, docs/architecture.md): it
takes anything with an ``as_payload()``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

# The channel-layer message type the consumer relays to its socket (handler ``session_event``).
RELAY_TYPE = "session.event"
# The channel-layer message that stops the session's turns and closes its sockets (handler
# ``session_deleted``): the session is gone.
DELETED_TYPE = "session.deleted"


class SessionEvent(Protocol):
    """A server event (:class:`chatapp.realtime.protocol.ServerEvent`): anything that gives its
    JSON object."""

    def as_payload(self) -> dict[str, Any]: ...


def session_group_name(session_id: int) -> str:
    """The channel-layer group of every socket open on chat session ``session_id``."""
    return f"chat.session.{session_id}"


async def event_broadcast(session_id: int, event: SessionEvent) -> None:
    """Send ``event`` now to every socket of the session (use for events about nothing stored)."""
    await _payload_broadcast(session_id, event.as_payload())


def event_broadcast_on_commit(session_id: int, event: SessionEvent) -> None:
    """From synchronous ORM code: send ``event`` to the session's sockets once the current
    transaction commits (immediately when none is open), and never if it rolls back. The JSON
    object is taken now, so later changes to what the event refers to do not leak into it."""
    transaction.on_commit(partial(async_to_sync(_payload_broadcast), session_id, event.as_payload()))


async def _payload_broadcast(session_id: int, payload: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(session_group_name(session_id), {"type": RELAY_TYPE, "event": payload})


def session_sockets_close_on_commit(session_id: int) -> None:
    """From synchronous ORM code that deletes session ``session_id``: once the transaction
    commits, every socket of the session stops the turns it runs and closes with code 4404."""
    layer = get_channel_layer()
    if layer is not None:
        transaction.on_commit(
            partial(async_to_sync(layer.group_send), session_group_name(session_id), {"type": DELETED_TYPE})
        )
