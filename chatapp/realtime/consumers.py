"""The chat WebSocket, ``/ws/chat/<session id>/``: one socket per open chat session.

Thin: it authorizes the socket, validates each client event (:mod:`chatapp.realtime.protocol`) and calls a
service; the turn itself runs in the background (:mod:`chatapp.conversation.runner`) and reaches every socket
of the session through the channel-layer group.

Server events sent only to this socket::

    chat.ack      {client_message_id, message_id, duplicate, pending}   after chat.send stored (or found) it
    chat.history  {messages: [message...], more, pending: [user message id...]}   answer to chat.sync
    error         {code, message, client_message_id?}                  an invalid client event, or
                  code "busy": a chat.send refused, nothing stored, while the session has
                  CHAT_MAX_PENDING_TURNS turns in flight

``pending`` lists the turns in flight (their lease is fresh, see :mod:`chatapp.conversation.runner`). A turn
interrupted by a restart is closed with an error reply when a socket connects, syncs, sends or
stops after its lease expired, so its transcript ends and it is never pending forever; while a
socket is open on a session with turns in flight that this process does not run, it also checks
when the first of their leases runs out (see ``_lease_watch``), so an open tab learns of it unasked.

Events of the session group: ``chat.message`` for every stored message (user messages carry
their ``client_message_id``) and the turn events listed in :mod:`chatapp.conversation.turn`. A resend of a
known ``client_message_id`` stores nothing: this socket gets the ack (``duplicate: true``), the
stored user message and the stored replies (with ``chat.done`` when the turn has ended); a turn
still running finishes and reaches this socket through the group. Sockets for sessions that are
not the caller's (or do not exist) are closed with code 4404, and so are the sockets of a
session when it is deleted. Any other WebSocket path (:class:`NotFoundConsumer`) is closed with
4404 too.

Events outside turns: ``memory.compression`` and ``memory.summary {summary}`` (both with
``turn_id`` None and ``step`` 0) after the inspector's "compress now".

The chat page opens its socket as ``/ws/chat/<id>/?ui=html`` and then gets no JSON at all: every
event above arrives as server-rendered HTML fragments for htmx's WebSocket extension (see
:mod:`chatapp.ui.page_feed`), a snapshot of the page's state on connect and on ``chat.sync``. Client
events are the same JSON in both forms (extra keys, such as the ``HEADERS`` htmx adds, are
ignored).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import (
    AsyncJsonWebsocketConsumer,
    AsyncWebsocketConsumer,
)
from django.conf import settings
from django.http import Http404
from django.utils import timezone

from chatapp.chats import selectors
from chatapp.chats.access import asession_get_for_owner
from chatapp.conversation import leases
from chatapp.conversation.runner import chat_turn_start, chat_turn_stop
from chatapp.models import ChatSession, Message
from chatapp.realtime.broadcast import session_group_name
from chatapp.realtime.protocol import (
    ChatSend,
    ChatStop,
    ChatSync,
    ProtocolError,
    client_event_parse,
    frame_decode,
)
from chatapp.ui.page_feed import PageFeed

CLOSE_NOT_FOUND = 4404
# ``?ui=html``: the chat page's socket, which gets server-rendered HTML instead of JSON.
UI_PARAMETER = "ui"
UI_HTML = "html"
# How long after a lease runs out the socket's watch closes the turn if it is still pending.
LEASE_WATCH_MARGIN_SECONDS = 1.0


class ChatConsumer(AsyncJsonWebsocketConsumer):
    """One browser tab's socket on one chat session."""

    chat_session: ChatSession | None = None
    feed: PageFeed | None = None
    lease_watch: asyncio.Task[None] | None = None

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
        await database_sync_to_async(leases.turns_interrupted_close)(session_id=self.chat_session.pk)
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        if query.get(UI_PARAMETER) == [UI_HTML]:
            self.feed = PageFeed(session_id=self.chat_session.pk)
        await self.channel_layer.group_add(session_group_name(self.chat_session.pk), self.channel_name)
        await self.accept()
        if self.feed is not None:
            await self.send_snapshot()
        self.lease_watch_ensure()

    async def disconnect(self, code: int) -> None:
        await self.lease_watch_cancel()
        if self.chat_session is not None:
            await self.channel_layer.group_discard(session_group_name(self.chat_session.pk), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        session = self.chat_session
        if session is None:
            return
        try:
            event = client_event_parse(frame_decode(text_data, bytes_data))
        except ProtocolError as exc:
            await self.deliver(exc.as_event())
            return
        if isinstance(event, ChatSend):
            await self.chat_send(session, event)
        elif isinstance(event, ChatSync):
            await self.chat_sync(session, event)
        else:
            await self.chat_stop(session, event)

    async def chat_send(self, session: ChatSession, event: ChatSend) -> None:
        """Store the user message once and start its turn; a resend replays what is stored (an
        interrupted turn is closed first, so its resend gets the error reply and ``chat.done``).
        A new message is refused (``busy``) while the session has its maximum of turns in flight."""
        await database_sync_to_async(leases.turns_interrupted_close)(session_id=session.pk)
        try:
            message, created = await database_sync_to_async(leases.user_message_submit)(
                session=session,
                client_message_id=event.client_message_id,
                text=event.text,
                max_pending=settings.CHAT_MAX_PENDING_TURNS,
            )
        except leases.TurnLimitReached as exc:
            await self.deliver(
                {"type": "error", "code": "busy", "message": str(exc), "client_message_id": event.client_message_id}
            )
            return
        if created:
            await self._ack(message, duplicate=False, pending=True)
            chat_turn_start(session_id=session.pk, user_message_id=message.pk)
            return
        replies = await database_sync_to_async(selectors.turn_replies_get)(user_message=message)
        final = next((reply for reply in replies if reply.is_final_reply), None)
        await self._ack(message, duplicate=True, pending=final is None)
        for stored in [message, *replies]:
            await self.deliver({"type": "chat.message", "message": stored.as_dict()})
        if final is not None:
            await self.deliver(
                {"type": "chat.done", "turn_id": message.pk, "status": final.status, "message_id": final.pk}
            )

    async def chat_sync(self, session: ChatSession, event: ChatSync) -> None:
        """Send every stored message after ``after_message_id`` and the turns still pending (the
        chat page's socket gets a snapshot of the page instead). Interrupted turns are closed
        first, so their error replies are among the messages and they are not pending."""
        await database_sync_to_async(leases.turns_interrupted_close)(session_id=session.pk)
        if self.feed is not None:
            await self.send_snapshot()
            return
        messages, more = await database_sync_to_async(selectors.message_list_after)(
            session_id=session.pk, after_id=event.after_message_id
        )
        pending = await database_sync_to_async(leases.turn_in_flight_list)(session_id=session.pk)
        await self.send_json(
            {"type": "chat.history", "messages": [m.as_dict() for m in messages], "more": more, "pending": pending}
        )

    async def chat_stop(self, session: ChatSession, event: ChatStop) -> None:
        """Stop the session's running turns: the group reaches every worker with a socket open on
        this session, and each stops the turns it runs."""
        await self.channel_layer.group_send(session_group_name(session.pk), {"type": "turn.stop"})
        # A turn no worker runs any more (its lease ran out) is closed now rather than left pending.
        await database_sync_to_async(leases.turns_interrupted_close)(session_id=session.pk)

    async def turn_stop(self, message: dict[str, Any]) -> None:
        """Channel-layer handler: stop the session's turns running in this process."""
        if self.chat_session is not None:
            chat_turn_stop(session_id=self.chat_session.pk)

    async def session_event(self, message: dict[str, Any]) -> None:
        """Channel-layer handler: relay a session event to this socket."""
        if message["event"].get("type") == "chat.turn":
            self.lease_watch_ensure()  # a turn started, maybe by another worker: watch its lease
        await self.deliver(message["event"])

    # --- turns interrupted while this socket is open ------------------------------------------

    def lease_watch_ensure(self) -> None:
        """Start watching the session's turns in flight that this process does not run, unless
        already watching. Nothing else would tell this socket when such a turn's worker died."""
        if self.chat_session is not None and (self.lease_watch is None or self.lease_watch.done()):
            self.lease_watch = asyncio.create_task(self._lease_watch(self.chat_session.pk))

    async def lease_watch_cancel(self) -> None:
        task, self.lease_watch = self.lease_watch, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _lease_watch(self, session_id: int) -> None:
        """While the session has turns in flight run by other workers: sleep until the first
        lease runs out (plus a margin), then close the turns whose lease did
        (``turns_interrupted_close`` tells every socket of the session); a renewed lease just
        moves the next wake-up."""
        while True:
            expiry = await database_sync_to_async(leases.turn_lease_next_expiry)(
                session_id=session_id, exclude=leases.turns_leased_here()
            )
            if expiry is None:
                return
            delay = (expiry - timezone.now()).total_seconds() + LEASE_WATCH_MARGIN_SECONDS
            await asyncio.sleep(max(delay, 0.0))
            await database_sync_to_async(leases.turns_interrupted_close)(session_id=session_id)

    async def session_deleted(self, message: dict[str, Any]) -> None:
        """Channel-layer handler: the session was deleted; stop its turns here and close (4404)."""
        await self.lease_watch_cancel()
        if self.chat_session is not None:
            chat_turn_stop(session_id=self.chat_session.pk)
            await self.channel_layer.group_discard(session_group_name(self.chat_session.pk), self.channel_name)
            self.chat_session = None
        await self.close(code=CLOSE_NOT_FOUND)

    async def deliver(self, event: dict[str, Any]) -> None:
        """Send a server event: as JSON, or on the chat page's socket as the HTML it renders to
        (nothing when the page needs no change)."""
        if self.feed is None:
            await self.send_json(event)
            return
        if event.get("type") == "chat.delta":
            html = self.feed.render_delta(event)
        else:
            html = await database_sync_to_async(self.feed.render)(event)
        if html:
            await self.send(text_data=html)

    async def send_snapshot(self) -> None:
        """Send the chat page's whole state (``PageFeed.snapshot``)."""
        if self.feed is not None:
            html = await database_sync_to_async(self.feed.snapshot)()
            if html:
                await self.send(text_data=html)

    async def _ack(self, message: Message, *, duplicate: bool, pending: bool) -> None:
        await self.deliver(
            {
                "type": "chat.ack",
                "client_message_id": message.client_message_id,
                "message_id": message.pk,
                "duplicate": duplicate,
                "pending": pending,
            }
        )


class NotFoundConsumer(AsyncWebsocketConsumer):
    """Every WebSocket path without a route (``/ws/chat/abc/``, ``/ws/other/``): accepted, then
    closed with 4404 like a session that is not the caller's (a refused handshake would only
    show as 1006 in the browser)."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=CLOSE_NOT_FOUND)
