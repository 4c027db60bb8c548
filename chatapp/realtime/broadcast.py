"""Server-to-browser events of a chat session, fanned out through the channel layer.

Every socket open on a session joins the group :func:`session_group_name`; a turn broadcasts its
events there, so a reply streamed while a tab reconnects reaches the new socket, on whichever
worker it landed. Events about stored rows are sent only after the database commit
(:func:`event_broadcast_on_commit`), so no client is told about something that was rolled back.

An event is a JSON-safe dict with a ``type`` key; the types are listed in ``chatapp.realtime.consumers``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

# The channel-layer message type the consumer relays to its socket (handler ``session_event``).
RELAY_TYPE = "session.event"
# The channel-layer message that stops the session's turns and closes its sockets (handler
# ``session_deleted``): the session is gone.
DELETED_TYPE = "session.deleted"


def session_group_name(session_id: int) -> str:
    """The channel-layer group of every socket open on chat session ``session_id``."""
    return f"chat.session.{session_id}"


async def event_broadcast(session_id: int, event: dict[str, Any]) -> None:
    """Send ``event`` now to every socket of the session (use for events about nothing stored)."""
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(session_group_name(session_id), {"type": RELAY_TYPE, "event": event})


def event_broadcast_on_commit(session_id: int, event: dict[str, Any]) -> None:
    """From synchronous ORM code: send ``event`` to the session's sockets once the current
    transaction commits (immediately when none is open), and never if it rolls back."""
    transaction.on_commit(partial(async_to_sync(event_broadcast), session_id, event))


def session_sockets_close_on_commit(session_id: int) -> None:
    """From synchronous ORM code that deletes session ``session_id``: once the transaction
    commits, every socket of the session stops the turns it runs and closes with code 4404."""
    layer = get_channel_layer()
    if layer is not None:
        transaction.on_commit(
            partial(async_to_sync(layer.group_send), session_group_name(session_id), {"type": DELETED_TYPE})
        )
