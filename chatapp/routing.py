"""WebSocket routes (docs/protocol.md): the JSON socket, the page socket (also ``?ui=html`` on the JSON route, for
pages opened before its route existed), and a clean 4404 close for any other path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import parse_qs

from django.urls import path, re_path

from chatapp.realtime.consumers import ChatJsonConsumer, ChatPageConsumer, NotFoundConsumer

UI_PARAMETER = "ui"
UI_HTML = "html"

chat_json_socket = ChatJsonConsumer.as_asgi()
chat_page_socket = ChatPageConsumer.as_asgi()


async def chat_socket(
    scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
) -> None:
    """``ws/chat/<id>/``: the JSON socket, or the page socket for ``?ui=html``."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    application = chat_page_socket if query.get(UI_PARAMETER) == [UI_HTML] else chat_json_socket
    await application(scope, receive, send)


websocket_urlpatterns = [
    path("ws/chat/<int:session_id>/page/", chat_page_socket),
    path("ws/chat/<int:session_id>/", cast(Any, chat_socket)),  # an ASGI application for URLRouter, not a view
    re_path(r"", NotFoundConsumer.as_asgi()),
]
