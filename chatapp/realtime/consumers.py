"""The chat WebSockets, one socket per open chat session and tab (routes in :mod:`chatapp.routing`):

* :class:`ChatJsonConsumer` at ``/ws/chat/<session id>/``: the JSON protocol;
* :class:`ChatPageConsumer` at ``/ws/chat/<session id>/page/``: the chat page's socket, which
  gets every server event as server-rendered HTML fragments for htmx's WebSocket extension
  (:mod:`chatapp.ui.page_feed`) and a snapshot of the page on connect and on ``chat.sync``.

Every event, its fields and the error and close codes are defined in
:mod:`chatapp.realtime.protocol` (reference: docs/protocol.md). Both consumers are thin and share
:class:`ChatSocket`: it authorizes the socket (4404 otherwise), joins the session's channel-layer
group, validates each client event and calls a service; the turn itself runs in the background
(:mod:`chatapp.conversation.runner`) and reaches every socket of the session through the group.
The two differ only in how a server event reaches the socket (:meth:`ChatSocket.deliver`,
:meth:`ChatSocket.relay`) and in what answers ``chat.sync`` (:meth:`ChatSocket.sync_answer`).

Turns interrupted by a restart (their worker died, so their lease is no longer renewed) are
closed with an error reply (``leases.turns_interrupted_close``) so that their transcript ends and
they are never pending forever. The sweep runs on connect, once, before the socket joins the
group, and afterwards in the lease watch only (:meth:`ChatSocket.leases_check`): while the session
has turns in flight that this process does not run, the watch wakes when the first of their
leases runs out, so an open tab learns of it unasked. ``chat.sync``, ``chat.stop`` and a resend of
a message without a final reply look at once (one query when no lease ran out), so that their
answer already reflects a turn that died. A new ``chat.send`` does not sweep: the runner closes
the session's interrupted turns before the turn starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from channels.consumer import get_handler_name
from channels.db import aclose_old_connections
from channels.generic.websocket import AsyncJsonWebsocketConsumer, AsyncWebsocketConsumer
from django.conf import settings
from django.http import Http404
from django.utils import timezone

from chatapp.chats import selectors, turns
from chatapp.chats.access import asession_get_for_owner
from chatapp.conversation import leases
from chatapp.conversation.runner import chat_turn_start, chat_turn_stop, chat_turn_stop_everywhere
from chatapp.models import ChatSession, Message
from chatapp.orm_threads import orm_async
from chatapp.realtime.broadcast import session_group_name
from chatapp.realtime.client_frames import client_event_parse, frame_decode
from chatapp.realtime.protocol import (
    BUSY,
    CLOSE_NOT_FOUND,
    ChatAckEvent,
    ChatDoneEvent,
    ChatHistoryEvent,
    ChatMessageEvent,
    ChatSend,
    ChatSync,
    ChatTurnEvent,
    ErrorEvent,
    ProtocolError,
    ServerEvent,
    server_event_parse,
)
from chatapp.ui.page_feed import PageFeed

logger = logging.getLogger(__name__)

# How long after a lease runs out the watch looks again when the turn was not closed (its lease
# was renewed meanwhile, or the clock's resolution made it look alive a moment longer).
LEASE_WATCH_MARGIN_SECONDS = 1.0


class ChatSocket(AsyncJsonWebsocketConsumer):
    """What both chat sockets share: one browser tab's (or API client's) socket on one chat
    session. Subclasses say how a server event is sent (:meth:`deliver` for one built here,
    :meth:`relay` for one from the session's group) and what answers ``chat.sync``."""

    chat_session: ChatSession | None = None
    lease_watch: asyncio.Task[None] | None = None

    # --- what the two sockets do differently -----------------------------------------------

    async def deliver(self, event: ServerEvent) -> None:
        """Send ``event`` (built by this consumer) to this socket."""
        raise NotImplementedError

    async def relay(self, payload: dict[str, Any]) -> None:
        """Send a session event from the channel-layer group (``ServerEvent.as_payload()``)."""
        raise NotImplementedError

    async def sync_answer(self, session: ChatSession, event: ChatSync) -> None:
        """Answer ``chat.sync`` (the session's interrupted turns are closed already)."""
        raise NotImplementedError

    async def opened(self, session: ChatSession) -> None:
        """Called once the socket is accepted and in the session's group."""

    async def deleted(self) -> None:
        """Called when the session was deleted, before the socket closes (4404)."""

    # --- the socket's life -------------------------------------------------------------------

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Call the handler of ``message``. Channels first hops to the thread-sensitive thread to
        close its obsolete database connections (``aclose_old_connections``) before every
        handler; here only before the socket's own messages (connect, a client frame,
        disconnect), not before the channel-layer messages relayed to it: those do no database
        work on that thread (the page socket's renders go through
        :func:`~chatapp.orm_threads.orm_async`, which cleans its own thread), and the hop cost every
        relayed event a thread round trip (about 5 % of a worker's CPU under
        ``bench/ws_load.py``). The memory engine's reads on that thread still get a cleaned
        connection at each ``chat.send``."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        if str(message["type"]).startswith("websocket."):
            await aclose_old_connections()
        await handler(message)

    async def connect(self) -> None:
        try:
            session = await asession_get_for_owner(self.scope, self.scope["url_route"]["kwargs"]["session_id"])
        except Http404:
            # Accept first so the browser sees 4404 (a refused handshake only shows as 1006).
            await self.accept()
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.chat_session = session
        # Before joining the group, so what this closes is not also sent here as events: the
        # page's snapshot shows it, and a JSON client reads it with chat.sync.
        # Never this process's own turns (alive, whether or not their lease is stored yet).
        await orm_async(leases.turns_interrupted_close)(session_id=session.pk, exclude=leases.turns_leased_here())
        await self.channel_layer.group_add(session_group_name(session.pk), self.channel_name)
        await self.accept()
        await self.opened(session)
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
            await self.chat_stop(session)

    # --- client events -------------------------------------------------------------------------

    async def chat_send(self, session: ChatSession, event: ChatSend) -> None:
        """Store the user message once and start its turn; a resend replays what is stored (a
        turn that died is closed first, so its resend gets the error reply and ``chat.done``).
        A new message is refused (``busy``) while the session has its maximum of turns in flight."""
        try:
            message, created = await orm_async(leases.user_message_submit)(
                session=session,
                client_message_id=event.client_message_id,
                text=event.text,
                max_pending=settings.CHAT_MAX_PENDING_TURNS,
            )
        except leases.TurnLimitReached as exc:
            await self.deliver(ErrorEvent(code=BUSY, message=str(exc), client_message_id=event.client_message_id))
            return
        if created:
            await self._ack(event, message, duplicate=False, pending=True)
            chat_turn_start(
                session_id=session.pk, user_message_id=message.pk, lease_fresh=True, question=message.content or ""
            )
            return
        replies = await orm_async(selectors.turn_replies_get)(user_message=message)
        if not any(reply.is_final_reply for reply in replies):
            await self.leases_check(session.pk)  # its turn may have died: then it is closed now
            replies = await orm_async(selectors.turn_replies_get)(user_message=message)
        final = next((reply for reply in replies if reply.is_final_reply), None)
        await self._ack(event, message, duplicate=True, pending=final is None)
        for stored in [message, *replies]:
            await self.deliver(ChatMessageEvent(message=stored.as_dict()))
        if final is not None:
            await self.deliver(ChatDoneEvent(turn_id=message.pk, status=final.status, message_id=final.pk))

    async def chat_sync(self, session: ChatSession, event: ChatSync) -> None:
        """Answer ``chat.sync`` (:meth:`sync_answer`) once the turns whose lease ran out are
        closed, so their error replies are among the messages and they are not pending."""
        await self.leases_check(session.pk)
        await self.sync_answer(session, event)

    async def chat_stop(self, session: ChatSession) -> None:
        """Stop the session's turns in flight, running or queued, on whichever worker runs them
        (:func:`chatapp.conversation.runner.chat_turn_stop_everywhere`). A turn no worker runs any
        more (its lease ran out) is closed now rather than left pending."""
        await chat_turn_stop_everywhere(session_id=session.pk)
        await self.leases_check(session.pk)

    async def _ack(self, event: ChatSend, message: Message, *, duplicate: bool, pending: bool) -> None:
        await self.deliver(
            ChatAckEvent(
                client_message_id=event.client_message_id,  # the stored message's: it was found by it
                message_id=message.pk,
                duplicate=duplicate,
                pending=pending,
            )
        )

    # --- channel-layer handlers ----------------------------------------------------------------

    async def session_event(self, message: dict[str, Any]) -> None:
        """Channel-layer handler: relay a session event to this socket. A turn that starts, or a
        user message that opens one, on another worker is watched (:meth:`lease_watch_ensure`);
        one this process runs or queues (:func:`~chatapp.conversation.leases.turns_leased_here`)
        is not: it renews its own lease, and the watch would only query to find nothing to watch."""
        payload: dict[str, Any] = message["event"]
        kind = payload.get("type")
        if kind == ChatTurnEvent.type:
            turn_id = payload.get("turn_id")
        elif kind == ChatMessageEvent.type and payload.get("message", {}).get("role") == Message.Role.USER:
            turn_id = payload["message"].get("id")
        else:
            turn_id = None
        if turn_id is not None and not leases.turn_leased_here(turn_id):
            self.lease_watch_ensure()
        await self.relay(payload)

    async def turn_stop(self, message: dict[str, Any]) -> None:
        """Channel-layer handler: stop the session's turns running in this process (the session
        group's ``turn.stop``, which workers of the previous version send on ``chat.stop``)."""
        if self.chat_session is not None:
            chat_turn_stop(session_id=self.chat_session.pk)

    async def session_deleted(self, message: dict[str, Any]) -> None:
        """Channel-layer handler: the session was deleted; stop its turns here and close (4404)."""
        await self.lease_watch_cancel()
        if self.chat_session is not None:
            chat_turn_stop(session_id=self.chat_session.pk)
            await self.channel_layer.group_discard(session_group_name(self.chat_session.pk), self.channel_name)
            self.chat_session = None
            await self.deleted()
        await self.close(code=CLOSE_NOT_FOUND)

    # --- turns interrupted while this socket is open ---------------------------------------------

    async def leases_check(self, session_id: int) -> float | None:
        """Close the session's turns whose lease has run out, if any has; returns the seconds
        until the next lease of a turn in flight that this process does not run runs out (None:
        there is no such turn). Costs one query when no lease ran out. Closing tells every socket
        of the session (``chat.message`` and ``chat.done`` after the commit)."""
        while True:
            expiry = await orm_async(turns.turn_lease_next_expiry)(
                session_id=session_id, exclude=leases.turns_leased_here()
            )
            if expiry is None:
                return None
            delay = (expiry - timezone.now()).total_seconds()
            if delay > 0:
                return delay
            if not await orm_async(leases.turns_interrupted_close)(session_id=session_id):
                # Renewed meanwhile, or alive for a moment longer at the clock's resolution.
                return LEASE_WATCH_MARGIN_SECONDS

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
        lease runs out (plus a margin), then close the turns whose lease did; a renewed lease just
        moves the next wake-up."""
        while True:
            delay = await self.leases_check(session_id)
            if delay is None:
                return
            await asyncio.sleep(delay + LEASE_WATCH_MARGIN_SECONDS)


class ChatJsonConsumer(ChatSocket):
    """``/ws/chat/<session id>/``: the JSON protocol (docs/protocol.md). Silent until asked:
    nothing is sent on connect."""

    async def deliver(self, event: ServerEvent) -> None:
        await self.send_json(event.as_payload())

    async def relay(self, payload: dict[str, Any]) -> None:
        await self.send_json(payload)  # already the JSON object: sent as built, unknown keys included

    async def sync_answer(self, session: ChatSession, event: ChatSync) -> None:
        """``chat.history``: every stored message after ``after_message_id`` (one page) and the
        turns still in flight."""
        messages, more = await orm_async(selectors.message_list_after)(
            session_id=session.pk, after_id=event.after_message_id
        )
        pending = await orm_async(turns.turn_in_flight_list)(session_id=session.pk)
        await self.deliver(ChatHistoryEvent(messages=[m.as_dict() for m in messages], more=more, pending=pending))


class ChatPageConsumer(ChatSocket):
    """``/ws/chat/<session id>/page/`` (and the alias ``/ws/chat/<session id>/?ui=html``): the chat
    page's socket. No JSON is sent: a snapshot of the page on connect and on ``chat.sync``, then
    every server event as the out-of-band HTML fragments :class:`~chatapp.ui.page_feed.PageFeed`
    renders (nothing when the page needs no change). Client events are the JSON ones."""

    feed: PageFeed  # set once accepted (:meth:`opened`), before any event is delivered

    async def opened(self, session: ChatSession) -> None:
        self.feed = PageFeed(session_id=session.pk)
        await self._snapshot_send()

    async def deleted(self) -> None:
        """Tell the page before the close: its composer is disabled and the chat leaves its sidebar."""
        await self.send(text_data=self.feed.deleted())

    async def deliver(self, event: ServerEvent) -> None:
        if self.feed.needs_database(event):
            html = await orm_async(self.feed.render)(event)
        else:
            html = self.feed.render(event)
        if html:
            await self.send(text_data=html)

    async def relay(self, payload: dict[str, Any]) -> None:
        try:
            event = server_event_parse(payload)
        except (KeyError, TypeError):  # an event this version does not know (a newer worker's)
            logger.warning("chat page socket: ignored an unknown session event %r", payload.get("type"))
            return
        await self.deliver(event)

    async def sync_answer(self, session: ChatSession, event: ChatSync) -> None:
        """A fresh snapshot of the page, whatever ``after_message_id`` says."""
        await self._snapshot_send()

    async def _snapshot_send(self) -> None:
        html = await orm_async(self.feed.snapshot)()
        if html:
            await self.send(text_data=html)


class NotFoundConsumer(AsyncWebsocketConsumer):
    """Every WebSocket path without a route (``/ws/chat/abc/``, ``/ws/other/``): accepted, then
    closed with 4404 like a session that is not the caller's (a refused handshake would only
    show as 1006 in the browser)."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=CLOSE_NOT_FOUND)
