"""Turns in flight: a new turn is stored with its lease (:class:`chatapp.models.TurnLease`), renewed every third of
``CHAT_TURN_LEASE_SECONDS`` while it waits or runs (:func:`turn_lease_kept`); a turn whose lease ran out is closed
with an error reply (:func:`turns_interrupted_close`). Synchronous ORM code except :func:`turn_lease_kept`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from chatapp.chats.memory import session_scope_key
from chatapp.chats.services import (
    chat_session_title_from_text,
    message_facts_store,
    message_token_count,
    reply_message_store,
)
from chatapp.chats.turns import lease_alive, lease_cutoff, pending_turns, turn_in_flight_list, turn_interrupted_list
from chatapp.models import ChatSession, Message, TurnLease
from chatapp.orm_threads import orm_async
from chatapp.realtime.broadcast import event_broadcast_on_commit
from chatapp.realtime.protocol import ChatDoneEvent, ChatMessageEvent

logger = logging.getLogger(__name__)

INTERRUPTED_TEXT = "[Interrupted: the server stopped before this reply finished. Please send your message again.]"


class TurnLimitReached(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"This chat already has {limit} messages waiting for a reply. "
            "Wait for an answer, then send your message again."
        )
        self.limit = limit


def _without_final_reply(messages: QuerySet[Message]) -> QuerySet[Message]:
    """User messages whose turn has no final reply (an assistant message without ``tool_calls``) yet."""
    final_reply = Message.objects.filter(reply_to=OuterRef("pk"), role=Message.Role.ASSISTANT, tool_calls__isnull=True)
    return messages.exclude(Exists(final_reply))


def user_message_submit(
    *,
    session: ChatSession,
    client_message_id: str,
    text: str,
    max_pending: int | None = None,
    name: str = "",
    created: datetime | None = None,
) -> tuple[Message, bool]:
    """Store the user message once per ``client_message_id`` with its turn's lease, key facts and the session's title;
    returns ``(message, created)``: a resend (docs/memory.md F-27) stores nothing. ``name``: the speaker's, ``created``:
    the recorded time of a replayed message (docs/replay.md).
    Raises :class:`TurnLimitReached` when ``max_pending`` turns are in flight, counted under a lock on the session."""
    # A resend is rare: the unique constraint finds it, not a query before every new message.
    wire = {"role": Message.Role.USER, "content": text, **({"name": name} if name else {})}
    try:
        with transaction.atomic():
            if max_pending is not None:
                # SQLite transactions begin IMMEDIATE (settings.py): writers are serialized already.
                if connection.features.has_select_for_update:
                    ChatSession.objects.select_for_update().filter(pk=session.pk).exists()
                if len(turn_in_flight_list(session_id=session.pk)) >= max_pending:
                    raise TurnLimitReached(max_pending)
            message = Message.objects.create(
                session=session,
                role=Message.Role.USER,
                content=text,
                name=name,
                client_message_id=client_message_id,
                token_count=message_token_count(wire),
            )
            if created is not None:
                Message.objects.filter(pk=message.pk).update(created=created)
                message.created = created
            TurnLease.objects.create(user_message=message, heartbeat=timezone.now())
            ChatSession.objects.filter(pk=session.pk).update(updated=timezone.now())
            if not session.title:  # as loaded; the filter re-checks the stored title
                title = chat_session_title_from_text(text=text, session_id=session.pk)
                if ChatSession.objects.filter(pk=session.pk, title="").update(title=title):
                    session.title = title
            message_facts_store(
                message=message,
                scope_key=session_scope_key(session),
            )
            event_broadcast_on_commit(session.pk, ChatMessageEvent(message=message.as_dict()))
    except TurnLimitReached:
        resent = Message.objects.filter(session=session, client_message_id=client_message_id).first()
        if resent is None:
            raise
        return resent, False
    except IntegrityError:
        return Message.objects.get(session=session, client_message_id=client_message_id), False
    return message, True


def turn_lease_renew(*, user_message_id: int) -> None:
    """Record a heartbeat of the turn, creating a missing lease, but never once the turn has ended or its message is
    gone: a late beat must not bring the lease back."""
    now = timezone.now()
    if TurnLease.objects.filter(user_message_id=user_message_id).update(heartbeat=now):
        return
    if _without_final_reply(Message.objects.filter(pk=user_message_id, role=Message.Role.USER)).exists():
        TurnLease.objects.get_or_create(user_message_id=user_message_id, defaults={"heartbeat": now})


def turns_interrupted_close(*, session_id: int, exclude: Collection[int] = ()) -> list[Message]:
    """Close each interrupted turn not in ``exclude`` (pass :func:`turns_leased_here`) with an ``error`` reply of
    :data:`INTERRUPTED_TEXT` (origin ``app``, F-37); returns the replies, oldest first. Each turn is re-checked under a
    lock on its user message, so concurrent workers close it exactly once."""
    closed: list[Message] = []
    excluded = set(exclude)
    for user_message_id in turn_interrupted_list(session_id=session_id):
        if user_message_id in excluded:
            continue
        with transaction.atomic():
            Message.objects.select_for_update().filter(pk=user_message_id).exists()
            if user_message_id not in turn_interrupted_list(session_id=session_id):
                continue
            reply = reply_message_store(
                session_id=session_id,
                reply_to_id=user_message_id,
                role=Message.Role.ASSISTANT,
                content=INTERRUPTED_TEXT,
                status=Message.Status.ERROR,
                origin=Message.Origin.APP,  # shown, never sent to the model (docs/memory.md F-37)
            )
            event_broadcast_on_commit(
                session_id,
                ChatDoneEvent(turn_id=user_message_id, status=Message.Status.ERROR, message_id=reply.pk),
            )
        closed.append(reply)
    return closed


def turns_interrupted_close_first_in_flight(*, session_id: int, exclude: Collection[int] = ()) -> int | None:
    """:func:`turns_interrupted_close`, then the first turn in flight: one read when none was interrupted."""
    cutoff = lease_cutoff()
    excluded = set(exclude)
    pending = pending_turns(session_id)
    if any(not lease_alive(heartbeat, cutoff) and message_id not in excluded for message_id, heartbeat in pending):
        turns_interrupted_close(session_id=session_id, exclude=excluded)
        cutoff = lease_cutoff()
        pending = pending_turns(session_id)
    return next((message_id for message_id, heartbeat in pending if lease_alive(heartbeat, cutoff)), None)


# Two beats may be missed (a slow write) before a live turn looks interrupted.
HEARTBEATS_PER_LEASE = 3


# Turns whose lease this process renews, and those started here whose task has not taken it over yet.
_leases_kept: set[int] = set()
_leases_claimed: set[int] = set()


def turn_lease_claim(*, user_message_id: int) -> None:
    """Count the turn as this process's until its task's :func:`turn_lease_kept` exits (or :func:`turn_lease_unclaim`)."""
    _leases_claimed.add(user_message_id)


def turn_lease_unclaim(*, user_message_id: int) -> None:
    _leases_claimed.discard(user_message_id)


@contextlib.asynccontextmanager
async def turn_lease_kept(*, user_message_id: int, fresh: bool = False) -> AsyncIterator[None]:
    """Keep the turn's lease fresh during the block: renewed on entry (unless ``fresh``: just stored), then by a
    background beat; re-entrant. A failed renewal is logged and retried, never breaking the turn."""
    if user_message_id in _leases_kept:
        yield
        return
    _leases_kept.add(user_message_id)
    try:
        if not fresh:
            await _lease_renew(user_message_id)
        heartbeat = asyncio.create_task(_heartbeat(user_message_id))
        try:
            yield
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
    finally:
        _leases_kept.discard(user_message_id)
        _leases_claimed.discard(user_message_id)


async def _heartbeat(user_message_id: int) -> None:
    while True:
        await asyncio.sleep(settings.CHAT_TURN_LEASE_SECONDS / HEARTBEATS_PER_LEASE)
        await _lease_renew(user_message_id)


async def _lease_renew(user_message_id: int) -> None:
    try:
        await orm_async(turn_lease_renew)(user_message_id=user_message_id)
    except Exception:
        logger.exception("could not renew the lease of chat turn %s", user_message_id)


def turns_leased_here() -> frozenset[int]:
    """User message ids of the turns this process keeps or has claimed the lease of."""
    return frozenset(_leases_kept | _leases_claimed)


def turn_leased_here(user_message_id: int) -> bool:
    """:func:`turns_leased_here` for one turn, without copying the sets (asked per relayed event)."""
    return user_message_id in _leases_kept or user_message_id in _leases_claimed
