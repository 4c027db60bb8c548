"""WebSocket routes (mounted by :mod:`chatapp.asgi` behind the origin check and auth)."""

from __future__ import annotations

from django.urls import path

from chatapp.consumers import ChatConsumer

websocket_urlpatterns = [
    path("ws/chat/<int:session_id>/", ChatConsumer.as_asgi()),
]
