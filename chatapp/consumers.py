"""The chat WebSocket, ``/ws/chat/<session id>/``: one socket per open chat session.

Thin: it authorizes the socket, validates each client event (:mod:`chatapp.protocol`) and calls a
service; the turn itself runs in the background (:mod:`chatapp.turns`) and reaches every socket
of the session through the channel-layer group.

Server events sent only to this socket::

    chat.ack      {client_message_id, message_id, duplicate, pending}   after chat.send stored (or found) it
    chat.history  {messages: [message...], more, pending: [user message id...]}   answer to chat.sync
    error         {code, message, client_message_id?}                  an invalid client event

Events of the session group: ``chat.message`` for every stored message (user messages carry
their ``client_message_id``) and the turn events listed in :mod:`chatapp.turn`. A resend of a
known ``client_message_id`` stores nothing: this socket gets the ack (``duplicate: true``), the
stored user message and the stored replies (with ``chat.done`` when the turn has ended); a turn
still running finishes and reaches this socket through the group. Sockets for sessions that are
not the caller's (or do not exist) are closed with code 4404.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import Http404

from chatapp import selectors, services
from chatapp.access import asession_get_for_owner
from chatapp.models import ChatSession, Message
from chatapp.protocol import ChatSend, ChatStop, ChatSync, ProtocolError, client_event_parse, frame_decode
from chatapp.realtime import session_group_name
from chatapp.turns import chat_turn_start, chat_turn_stop

CLOSE_NOT_FOUND = 4404


class ChatConsumer(AsyncJsonWebsocketConsumer):
    """One browser tab's socket on one chat session."""

    chat_session: ChatSession | None = None

    async def connect(self) -> None:
        try:
            self.chat_session = await asession_get_for_owner(
                self.scope, self.scope["url_route"]["kwargs"]["session_id"]
            )
        except Http404:
            # Accept first so the browser sees 4404 (a refused handshake only shows as 1006).
            await self.accept()
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.channel_layer.group_add(session_group_name(self.chat_session.pk), self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.chat_session is not None:
            await self.channel_layer.group_discard(session_group_name(self.chat_session.pk), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        session = self.chat_session
        if session is None:
            return
        try:
            event = client_event_parse(frame_decode(text_data, bytes_data))
        except ProtocolError as exc:
            await self.send_json(exc.as_event())
            return
        if isinstance(event, ChatSend):
            await self.chat_send(session, event)
        elif isinstance(event, ChatSync):
            await self.chat_sync(session, event)
        else:
            await self.chat_stop(session, event)

    async def chat_send(self, session: ChatSession, event: ChatSend) -> None:
        """Store the user message once and start its turn; a resend replays what is stored."""
        message, created = await database_sync_to_async(services.user_message_submit)(
            session=session, client_message_id=event.client_message_id, text=event.text
        )
        if created:
            await self._ack(message, duplicate=False, pending=True)
            chat_turn_start(session_id=session.pk, user_message_id=message.pk)
            return
        replies = await database_sync_to_async(selectors.turn_replies_get)(user_message=message)
        final = next((reply for reply in replies if reply.is_final_reply), None)
        await self._ack(message, duplicate=True, pending=final is None)
        for stored in [message, *replies]:
            await self.send_json({"type": "chat.message", "message": stored.as_dict()})
        if final is not None:
            await self.send_json(
                {"type": "chat.done", "turn_id": message.pk, "status": final.status, "message_id": final.pk}
            )

    async def chat_sync(self, session: ChatSession, event: ChatSync) -> None:
        """Send every stored message after ``after_message_id`` and the turns still pending."""
        messages, more = await database_sync_to_async(selectors.message_list_after)(
            session_id=session.pk, after_id=event.after_message_id
        )
        pending = await database_sync_to_async(selectors.turn_pending_list)(session_id=session.pk)
        await self.send_json(
            {"type": "chat.history", "messages": [m.as_dict() for m in messages], "more": more, "pending": pending}
        )

    async def chat_stop(self, session: ChatSession, event: ChatStop) -> None:
        """Stop the session's running turns: the group reaches every worker with a socket open on
        this session, and each stops the turns it runs."""
        await self.channel_layer.group_send(session_group_name(session.pk), {"type": "turn.stop"})

    async def turn_stop(self, message: dict[str, Any]) -> None:
        """Channel-layer handler: stop the session's turns running in this process."""
        if self.chat_session is not None:
            chat_turn_stop(session_id=self.chat_session.pk)

    async def session_event(self, message: dict[str, Any]) -> None:
        """Channel-layer handler: relay a session event to this socket."""
        await self.send_json(message["event"])

    async def _ack(self, message: Message, *, duplicate: bool, pending: bool) -> None:
        await self.send_json(
            {
                "type": "chat.ack",
                "client_message_id": message.client_message_id,
                "message_id": message.pk,
                "duplicate": duplicate,
                "pending": pending,
            }
        )
