"""WebSocket routes (mounted by :mod:`chatapp.asgi` behind the origin check and auth); the
protocol is docs/protocol.md.

==============================  ==============================================================
``ws/chat/<id>/``               :class:`~chatapp.realtime.consumers.ChatJsonConsumer` (JSON)
``ws/chat/<id>/page/``          :class:`~chatapp.realtime.consumers.ChatPageConsumer` (the chat
                                page's HTML fragments for htmx)
``ws/chat/<id>/?ui=html``       the page socket too: the address pages opened before the page
                                route existed still use (:func:`chat_socket`)
anything else                   :class:`~chatapp.realtime.consumers.NotFoundConsumer` (4404)
==============================  ==============================================================

The last route takes every other path, so an unknown path is a clean 4404 close, not a server
error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import parse_qs

from django.urls import path, re_path

from chatapp.realtime.consumers import ChatJsonConsumer, ChatPageConsumer, NotFoundConsumer

# The query parameter of the page socket's alias on the JSON route: ``?ui=html``.
UI_PARAMETER = "ui"
UI_HTML = "html"

chat_json_socket = ChatJsonConsumer.as_asgi()
chat_page_socket = ChatPageConsumer.as_asgi()


async def chat_socket(
    scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
) -> None:
    """``ws/chat/<id>/``: the JSON socket, or the page socket when the query string is
    ``ui=html`` (the page route's alias)."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    application = chat_page_socket if query.get(UI_PARAMETER) == [UI_HTML] else chat_json_socket
    await application(scope, receive, send)


websocket_urlpatterns = [
    path("ws/chat/<int:session_id>/page/", chat_page_socket),
    path("ws/chat/<int:session_id>/", cast(Any, chat_socket)),  # an ASGI application for URLRouter, not a view
    re_path(r"", NotFoundConsumer.as_asgi()),
]
