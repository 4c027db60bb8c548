"""A bare Channels echo server: the floor ``bench/ws_load.py`` compares the chat against.

Same settings and channel layer as the chat (``chatapp.settings``: the in-memory layer, or Redis
with ``REDIS_URL``), none of its work: no origin check, no session or auth middleware, no
database, no model. A socket on ``/ws/echo/<session id>/`` joins the chat's group name for that
session (:func:`chatapp.realtime.broadcast.session_group_name`). For each client message
``{"type": "echo", "client_message_id", "turn_id", "events": K, "delta_at": D}`` it answers
``chat.ack`` on the socket, then sends ``K`` events one after another through the group, as a
chat turn does: event ``D`` (0-based) is a ``chat.delta``, the last is ``chat.done``, the others
``echo``. Each carries ``turn_id`` and ``seq``.

Served by Daphne: ``daphne bench.echo_asgi:application`` (the working directory on ``sys.path``).
"""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
get_asgi_application()  # sets Django up

from channels.generic.websocket import AsyncJsonWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from chatapp.realtime.broadcast import RELAY_TYPE, session_group_name  # noqa: E402

# An echo turn sends at most this many events (a bound on what one client frame may cost).
MAX_EVENTS = 200


class EchoConsumer(AsyncJsonWebsocketConsumer):
    """One socket: joins its session's group and echoes each message as a burst of group events."""

    group = ""

    async def connect(self) -> None:
        self.group = session_group_name(int(self.scope["url_route"]["kwargs"]["session_id"]))
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or content.get("type") != "echo":
            return
        turn_id = content.get("turn_id")
        count = max(1, min(int(content.get("events", 1)), MAX_EVENTS))
        delta_at = int(content.get("delta_at", 0))
        await self.send_json(
            {"type": "chat.ack", "client_message_id": content.get("client_message_id"), "message_id": turn_id}
        )
        for seq in range(count):
            event_type = "chat.done" if seq == count - 1 else "chat.delta" if seq == delta_at else "echo"
            event = {"type": event_type, "turn_id": turn_id, "seq": seq}
            await self.channel_layer.group_send(self.group, {"type": RELAY_TYPE, "event": event})

    async def session_event(self, message: dict[str, Any]) -> None:
        """Channel-layer handler: relay a group event to the socket (as the chat's consumer does)."""
        await self.send_json(message["event"])


application = ProtocolTypeRouter({"websocket": URLRouter([path("ws/echo/<int:session_id>/", EchoConsumer.as_asgi())])})
