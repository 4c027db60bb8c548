"""WebSocket routes (mounted by :mod:`chatapp.asgi` behind the origin check and auth). The last
route takes every other path, so an unknown path is a clean 4404 close, not a server error."""

from __future__ import annotations

from django.urls import path, re_path

from chatapp.realtime.consumers import ChatConsumer, NotFoundConsumer

websocket_urlpatterns = [
    path("ws/chat/<int:session_id>/", ChatConsumer.as_asgi()),
    re_path(r"", NotFoundConsumer.as_asgi()),
]
