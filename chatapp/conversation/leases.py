"""Turns in flight: opening a turn with its lease, keeping the lease fresh, and closing turns
whose worker died.

A turn proves it is alive, to every worker, through its lease (:class:`chatapp.models.TurnLease`):
while it waits for its turn and while it runs, a background task renews the heartbeat every
third of ``CHAT_TURN_LEASE_SECONDS`` (:func:`turn_lease_kept`), whatever the turn is awaiting (a
slow model, a long summarization). A turn whose process died stops renewing; once its lease
expires it counts as interrupted and is closed with an error reply by the next request that looks
(:func:`turns_interrupted_close`). Selectors read, services write (synchronous ORM code; async
callers use ``database_sync_to_async``); :func:`turn_lease_kept` is async.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection
from datetime import datetime, timedelta

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, Min, OuterRef, QuerySet
from django.utils import timezone

from chatapp.chats.services import TITLE_MAX_CHARS, message_token_count, reply_message_store
from chatapp.models import ChatSession, Message, TurnLease
from chatapp.realtime.broadcast import event_broadcast_on_commit

logger = logging.getLogger(__name__)

INTERRUPTED_TEXT = "[Interrupted: the server stopped before this reply finished. Please send your message again.]"


class TurnLimitReached(Exception):
    """A new user message was refused: its session already has ``limit`` turns in flight."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"This chat already has {limit} messages waiting for a reply. "
            "Wait for an answer, then send your message again."
        )
        self.limit = limit


def _pending_user_messages(session_id: int) -> QuerySet[Message]:
    final_reply = Message.objects.filter(reply_to=OuterRef("pk"), role=Message.Role.ASSISTANT, tool_calls__isnull=True)
    return Message.objects.filter(session_id=session_id, role=Message.Role.USER).exclude(Exists(final_reply))


def _alive() -> Exists:
    """A fresh lease: a heartbeat within the last ``CHAT_TURN_LEASE_SECONDS``."""
    cutoff = timezone.now() - timedelta(seconds=settings.CHAT_TURN_LEASE_SECONDS)
    return Exists(TurnLease.objects.filter(user_message=OuterRef("pk"), heartbeat__gte=cutoff))


def turn_in_flight_list(*, session_id: int) -> list[int]:
    """Ids of the session's user messages whose turn is in flight, ascending: no final reply (an
    assistant message without ``tool_calls``) yet, and a fresh lease (:class:`TurnLease`), so
    running or queued on some worker right now. These are the turns a client sees as pending."""
    return list(_pending_user_messages(session_id).filter(_alive()).order_by("id").values_list("id", flat=True))


def turn_in_flight_first_id(*, session_id: int) -> int | None:
    """The id of the session's oldest user message whose turn is in flight (see
    :func:`turn_in_flight_list`), or None. Memory compression must not summarize from there on
    while that turn runs (FAULTS F-26); an interrupted turn pins nothing."""
    return _pending_user_messages(session_id).filter(_alive()).aggregate(first=Min("id"))["first"]


def turn_lease_next_expiry(*, session_id: int, exclude: Collection[int] = ()) -> datetime | None:
    """When the first lease of the session's turns in flight runs out (its heartbeat plus
    ``CHAT_TURN_LEASE_SECONDS``), leaving out the turns ``exclude`` (e.g. those running in this
    process, which keep renewing theirs); None when there is no such turn."""
    pending = _pending_user_messages(session_id).exclude(pk__in=list(exclude)).values("pk")
    first = TurnLease.objects.filter(user_message__in=pending).aggregate(first=Min("heartbeat"))["first"]
    return None if first is None else first + timedelta(seconds=settings.CHAT_TURN_LEASE_SECONDS)


def turn_interrupted_list(*, session_id: int) -> list[int]:
    """Ids of the session's user messages whose turn was interrupted, ascending: no final reply,
    and no fresh lease (the worker running it stopped, e.g. a server restart mid-reply)."""
    return list(_pending_user_messages(session_id).exclude(_alive()).order_by("id").values_list("id", flat=True))


def user_message_submit(
    *, session: ChatSession, client_message_id: str, text: str, max_pending: int | None = None
) -> tuple[Message, bool]:
    """Store the user's message ``text`` once per ``client_message_id``; returns ``(message, created)``.

    A resend with a known ``client_message_id`` (after a reconnect, FAULTS F-27) stores nothing
    and returns the stored message with ``created`` False, also when two resends race. A new
    message opens a turn: it is stored with the turn's lease (:class:`TurnLease`, fresh until the
    turn's own heartbeat takes over), names an untitled session and moves it to the top of the
    list. With ``max_pending``, a new message is refused with :class:`TurnLimitReached`, storing
    nothing, when the session already has that many turns in flight (counted in the same
    transaction, under a lock on the session row, so concurrent sends cannot pass the bound
    together). On commit the session's sockets get a ``chat.message`` event.
    """
    existing = Message.objects.filter(session=session, client_message_id=client_message_id).first()
    if existing is not None:
        return existing, False
    wire = {"role": Message.Role.USER, "content": text}
    try:
        with transaction.atomic():
            if max_pending is not None:
                ChatSession.objects.select_for_update().filter(pk=session.pk).exists()
                if len(turn_in_flight_list(session_id=session.pk)) >= max_pending:
                    raise TurnLimitReached(max_pending)
            message = Message.objects.create(
                session=session,
                role=Message.Role.USER,
                content=text,
                client_message_id=client_message_id,
                token_count=message_token_count(wire),
            )
            TurnLease.objects.create(user_message=message, heartbeat=timezone.now())
            ChatSession.objects.filter(pk=session.pk).update(updated=timezone.now())
            ChatSession.objects.filter(pk=session.pk, title="").update(title=" ".join(text.split())[:TITLE_MAX_CHARS])
            event_broadcast_on_commit(session.pk, {"type": "chat.message", "message": message.as_dict()})
    except IntegrityError:
        return Message.objects.get(session=session, client_message_id=client_message_id), False
    return message, True


def turn_lease_renew(*, user_message_id: int) -> None:
    """Record a heartbeat of the turn opened by ``user_message_id``: it is alive now. Creates the
    lease when the message has none (stored by other code, e.g. a test or an older version);
    does nothing once the message is gone (its session was deleted)."""
    now = timezone.now()
    if TurnLease.objects.filter(user_message_id=user_message_id).update(heartbeat=now):
        return
    if Message.objects.filter(pk=user_message_id).exists():
        TurnLease.objects.get_or_create(user_message_id=user_message_id, defaults={"heartbeat": now})


def turns_interrupted_close(*, session_id: int) -> list[Message]:
    """Close every interrupted turn of the session (:func:`chatapp.chats.turn_interrupted_list`)
    with a final assistant reply, status ``error``, content :data:`INTERRUPTED_TEXT`; returns the
    replies stored, oldest turn first. After the commit the session's sockets get
    ``chat.message`` and ``chat.done {turn_id, status: "error", message_id}``.

    Safe from any number of workers at once: each turn is re-checked under a lock on its user
    message row (the database serializes SQLite writers), so it is closed exactly once. A turn
    whose lease was renewed meanwhile is left alone.
    """
    closed: list[Message] = []
    for user_message_id in turn_interrupted_list(session_id=session_id):
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
            )
            event_broadcast_on_commit(
                session_id,
                {
                    "type": "chat.done",
                    "turn_id": user_message_id,
                    "status": Message.Status.ERROR,
                    "message_id": reply.pk,
                },
            )
        closed.append(reply)
    return closed


# Heartbeats per lease period: two may be missed (a slow database write) before a live turn
# would look interrupted.
HEARTBEATS_PER_LEASE = 3


# The turns whose lease this process renews, and the queue of each session's started turns.
_leases_kept: set[int] = set()


@contextlib.asynccontextmanager
async def turn_lease_kept(*, user_message_id: int) -> AsyncIterator[None]:
    """Keep the lease of the turn opened by ``user_message_id`` fresh for the duration of the
    block: renewed once on entry, then every ``CHAT_TURN_LEASE_SECONDS / HEARTBEATS_PER_LEASE``
    seconds by a background task until the block exits. Re-entrant (an inner block for a lease
    this process already keeps does nothing). A failed renewal is logged and retried on the next
    beat; it never breaks the turn."""
    if user_message_id in _leases_kept:
        yield
        return
    _leases_kept.add(user_message_id)
    try:
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


async def _heartbeat(user_message_id: int) -> None:
    while True:
        await asyncio.sleep(settings.CHAT_TURN_LEASE_SECONDS / HEARTBEATS_PER_LEASE)
        await _lease_renew(user_message_id)


async def _lease_renew(user_message_id: int) -> None:
    try:
        await database_sync_to_async(turn_lease_renew)(user_message_id=user_message_id)
    except Exception:
        logger.exception("could not renew the lease of chat turn %s", user_message_id)


def turns_leased_here() -> frozenset[int]:
    """Ids of the turns (their user messages) this process runs or queues and keeps the lease of."""
    return frozenset(_leases_kept)
