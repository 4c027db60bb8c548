"""The chat WebSockets (routes in :mod:`chatapp.routing`, events in :mod:`chatapp.realtime.protocol`):
:class:`ChatJsonConsumer` speaks JSON, :class:`ChatPageConsumer` sends htmx fragments. Both authorize (4404
otherwise), validate client events and call a service; turns run in :mod:`chatapp.conversation.runner`, and turns
whose worker died are closed on connect and by a lease watch (:meth:`ChatSocket.leases_check`).
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
from chatapp.chats.limits import RateLimited, arate_limit_take, owner_label
from chatapp.chats.memory import recall_cache_warm
from chatapp.conversation import leases
from chatapp.conversation.regenerate import RegenerateRefused, reply_regenerate_prepare
from chatapp.conversation.runner import chat_turn_start, chat_turn_stop, chat_turn_stop_everywhere
from chatapp.models import ChatSession, Message
from chatapp.orm_threads import orm_async
from chatapp.realtime.broadcast import event_broadcast, session_group_name
from chatapp.realtime.client_frames import client_event_parse, frame_decode
from chatapp.realtime.protocol import (
    BUSY,
    CANNOT_REGENERATE,
    CLOSE_NOT_FOUND,
    ID_REUSED,
    RATE_LIMITED,
    ChatAckEvent,
    ChatDoneEvent,
    ChatHistoryEvent,
    ChatMessageEvent,
    ChatRegenerate,
    ChatRegeneratedEvent,
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

# Extra wait after a lease ran out but its turn was not closed (renewed, or clock resolution).
LEASE_WATCH_MARGIN_SECONDS = 1.0


class ChatSocket(AsyncJsonWebsocketConsumer):
    """One tab's socket on one chat session; subclasses say how events are sent (:meth:`deliver`,
    :meth:`relay`) and what answers ``chat.sync``."""

    chat_session: ChatSession | None = None
    lease_watch: asyncio.Task[None] | None = None
    group_renewal: asyncio.Task[None] | None = None
    recall_warming: asyncio.Task[None] | None = None

    async def deliver(self, event: ServerEvent) -> None:
        raise NotImplementedError

    async def relay(self, payload: dict[str, Any]) -> None:
        """Send a session event from the channel-layer group (``ServerEvent.as_payload()``)."""
        raise NotImplementedError

    async def sync_answer(self, session: ChatSession, event: ChatSync) -> None:
        raise NotImplementedError

    async def opened(self, session: ChatSession) -> None:
        """Called once the socket is accepted and in the session's group."""

    async def deleted(self) -> None:
        """Called when the session was deleted, before the socket closes (4404)."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Call the handler of ``message``; close old database connections only before the socket's own
        ``websocket.*`` messages: relayed events do no database work on that thread (docs/benchmarks.md)."""
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
        # Before joining the group (the snapshot or chat.sync shows it); never this process's own turns.
        await orm_async(leases.turns_interrupted_close)(session_id=session.pk, exclude=leases.turns_leased_here())
        await self.channel_layer.group_add(session_group_name(session.pk), self.channel_name)
        self.group_renewal = asyncio.create_task(self.group_renew(session_group_name(session.pk)))
        await self.accept()
        self.recall_warming = asyncio.create_task(recall_cache_warm(session))
        await self.opened(session)
        self.lease_watch_ensure()

    async def group_renew(self, group: str) -> None:
        """Join ``group`` again every third of ``CHANNEL_GROUP_EXPIRY`` while the socket lives, so that only the
        sockets of a dead worker expire from it."""
        while True:
            await asyncio.sleep(settings.CHANNEL_GROUP_EXPIRY / 3)
            await self.channel_layer.group_add(group, self.channel_name)

    async def group_renewal_cancel(self) -> None:
        task, self.group_renewal = self.group_renewal, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def disconnect(self, code: int) -> None:
        await self.lease_watch_cancel()
        await self.group_renewal_cancel()
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
        elif isinstance(event, ChatRegenerate):
            await self.chat_regenerate(session, event)
        else:
            await self.chat_stop(session)

    async def chat_send(self, session: ChatSession, event: ChatSend) -> None:
        """Store the message once and start its turn, or refuse it (``busy``, ``id_reused``, ``rate_limited``); a
        resend replays what is stored, after closing its turn if that died (docs/memory.md F-27)."""
        client = self.scope.get("client")
        try:
            await arate_limit_take(
                "send",
                owner=owner_label(user_id=session.owner_id, session_key=session.owner_session_key),
                address=client[0] if client else None,
            )
        except RateLimited as exc:
            # A resend of a stored message is answered all the same (one query, on this rare path only).
            resend = Message.objects.filter(session=session, client_message_id=event.client_message_id)
            if not await orm_async(resend.exists)():
                await self.deliver(
                    ErrorEvent(
                        code=RATE_LIMITED,
                        message=str(exc),
                        client_message_id=event.client_message_id,
                        retry_after=exc.retry_after,
                    )
                )
                return
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
        if message.content != event.text:
            text = f"client_message_id {event.client_message_id!r} was used for another message; nothing stored"
            await self.deliver(ErrorEvent(code=ID_REUSED, message=text, client_message_id=event.client_message_id))
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

    async def chat_regenerate(self, session: ChatSession, event: ChatRegenerate) -> None:
        """Keep the last turn's reply as an earlier version and run the turn again, or refuse (``cannot_regenerate``)."""
        try:
            turn, version, removed = await orm_async(reply_regenerate_prepare)(session=session, turn_id=event.turn_id)
        except RegenerateRefused as exc:
            await self.deliver(ErrorEvent(code=CANNOT_REGENERATE, message=str(exc)))
            return
        await event_broadcast(session.pk, ChatRegeneratedEvent(turn_id=turn.pk, version=version, removed=removed))
        chat_turn_start(
            session_id=session.pk,
            user_message_id=turn.pk,
            lease_fresh=True,
            question=turn.content or "",
            version=version,
        )

    async def chat_sync(self, session: ChatSession, event: ChatSync) -> None:
        await self.leases_check(session.pk)
        await self.sync_answer(session, event)

    async def chat_stop(self, session: ChatSession) -> None:
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

    async def session_event(self, message: dict[str, Any]) -> None:
        """Relay a group event; a turn another worker starts gets a lease watch (ours renew their lease)."""
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
        """The group's ``turn.stop`` (sent by older workers on ``chat.stop``): stop this process's turns."""
        if self.chat_session is not None:
            chat_turn_stop(session_id=self.chat_session.pk)

    async def session_deleted(self, message: dict[str, Any]) -> None:
        await self.lease_watch_cancel()
        await self.group_renewal_cancel()
        if self.chat_session is not None:
            chat_turn_stop(session_id=self.chat_session.pk)
            await self.channel_layer.group_discard(session_group_name(self.chat_session.pk), self.channel_name)
            self.chat_session = None
            await self.deleted()
        await self.close(code=CLOSE_NOT_FOUND)

    async def leases_check(self, session_id: int) -> float | None:
        """Close the session's turns whose lease ran out; returns seconds until the next other-process
        lease runs out, or None when there is none. One query when no lease ran out."""
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
                return LEASE_WATCH_MARGIN_SECONDS

    def lease_watch_ensure(self) -> None:
        """Watch other workers' turns of the session (once): nothing else tells this socket they died."""
        if self.chat_session is not None and (self.lease_watch is None or self.lease_watch.done()):
            self.lease_watch = asyncio.create_task(self._lease_watch(self.chat_session.pk))

    async def lease_watch_cancel(self) -> None:
        task, self.lease_watch = self.lease_watch, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _lease_watch(self, session_id: int) -> None:
        while True:
            delay = await self.leases_check(session_id)
            if delay is None:
                return
            await asyncio.sleep(delay + LEASE_WATCH_MARGIN_SECONDS)


class ChatJsonConsumer(ChatSocket):
    """``/ws/chat/<session id>/``: the JSON protocol (docs/protocol.md); nothing is sent on connect."""

    async def deliver(self, event: ServerEvent) -> None:
        await self.send_json(event.as_payload())

    async def relay(self, payload: dict[str, Any]) -> None:
        await self.send_json(payload)  # already the JSON object: sent as built, unknown keys included

    async def sync_answer(self, session: ChatSession, event: ChatSync) -> None:
        messages, more = await orm_async(selectors.message_list_after)(
            session_id=session.pk, after_id=event.after_message_id
        )
        pending = await orm_async(turns.turn_in_flight_list)(session_id=session.pk)
        await self.deliver(ChatHistoryEvent(messages=[m.as_dict() for m in messages], more=more, pending=pending))


class ChatPageConsumer(ChatSocket):
    """``/ws/chat/<id>/page/`` (alias ``?ui=html``): a page snapshot on connect and ``chat.sync``, then
    each event as :class:`~chatapp.ui.page_feed.PageFeed` HTML fragments. Client events are the JSON ones."""

    feed: PageFeed  # set once accepted (:meth:`opened`), before any event is delivered

    async def opened(self, session: ChatSession) -> None:
        self.feed = PageFeed(session_id=session.pk)
        await self._snapshot_send()

    async def deleted(self) -> None:
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
        await self._snapshot_send()

    async def _snapshot_send(self) -> None:
        html = await orm_async(self.feed.snapshot)()
        if html:
            await self.send(text_data=html)


class NotFoundConsumer(AsyncWebsocketConsumer):
    """Any unrouted WebSocket path: accepted, then closed with 4404 (a refused handshake shows only as 1006)."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=CLOSE_NOT_FOUND)
