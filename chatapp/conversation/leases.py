"""Turns in flight: opening a turn with its lease, keeping the lease fresh, and closing turns
whose worker died.

A turn proves it is alive, to every worker, through its lease (:class:`chatapp.models.TurnLease`):
while it waits for its turn and while it runs, a background task renews the heartbeat every
third of ``CHAT_TURN_LEASE_SECONDS`` (:func:`turn_lease_kept`), whatever the turn is awaiting (a
slow model, a long summarization). A turn whose process died stops renewing; once its lease
expires it counts as interrupted and is closed with an error reply by the next request that looks
(:func:`turns_interrupted_close`). Selectors read, services write (synchronous ORM code; async
callers use :func:`chatapp.orm_threads.orm_async`); :func:`turn_lease_kept` is async.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from chatapp.chats.memory import chat_session_scope_key
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
    """A new user message was refused: its session already has ``limit`` turns in flight."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"This chat already has {limit} messages waiting for a reply. "
            "Wait for an answer, then send your message again."
        )
        self.limit = limit


def _without_final_reply(messages: QuerySet[Message]) -> QuerySet[Message]:
    """``messages`` (user messages) whose turn has no final reply (an assistant message without
    ``tool_calls``) yet."""
    final_reply = Message.objects.filter(reply_to=OuterRef("pk"), role=Message.Role.ASSISTANT, tool_calls__isnull=True)
    return messages.exclude(Exists(final_reply))


def user_message_submit(
    *, session: ChatSession, client_message_id: str, text: str, max_pending: int | None = None, name: str = ""
) -> tuple[Message, bool]:
    """Store the user's message ``text`` once per ``client_message_id``; returns ``(message, created)``.
    ``name``: the OpenAI ``name`` of the speaker (a replayed conversation between named people,
    docs/replay.md; ``""`` for none), sent with the message and indexed with it for recall.

    A resend with a known ``client_message_id`` (after a reconnect, docs/memory.md F-27) stores nothing
    and returns the stored message with ``created`` False, also when two resends race. A new
    message opens a turn: it is stored with the turn's lease (:class:`TurnLease`, fresh until the
    turn's own heartbeat takes over), names an untitled session (without the message's
    identifiers and contact data, :func:`chatapp.chats.services.chat_session_title_from_text`)
    and moves it to the top of the list. With ``max_pending``, a new message is refused with :class:`TurnLimitReached`, storing
    nothing, when the session already has that many turns in flight (counted in the same
    transaction, under a lock on the session row, so concurrent sends cannot pass the bound
    together). The message's key facts are stored in the same transaction
    (:func:`chatapp.chats.services.message_facts_store`, no query when it holds none). On commit
    the session's sockets get a ``chat.message`` event.
    """
    # A resend is rare: it is found by the unique constraint on (session, client_message_id)
    # failing the insert (or, at the limit, looked up then), not by a query before every new message.
    wire = {"role": Message.Role.USER, "content": text, **({"name": name} if name else {})}
    try:
        with transaction.atomic():
            if max_pending is not None:
                # SQLite needs no row lock: its transactions begin IMMEDIATE (settings.py), which
                # already serializes writers.
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
            TurnLease.objects.create(user_message=message, heartbeat=timezone.now())
            ChatSession.objects.filter(pk=session.pk).update(updated=timezone.now())
            if not session.title:  # as loaded; the filter re-checks the stored title
                title = chat_session_title_from_text(text=text, session_id=session.pk)
                if ChatSession.objects.filter(pk=session.pk, title="").update(title=title):
                    session.title = title
            message_facts_store(
                message=message,
                scope_key=chat_session_scope_key(
                    owner_id=session.owner_id, owner_session_key=session.owner_session_key
                ),
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
    """Record a heartbeat of the turn opened by ``user_message_id``: it is alive now. Creates the
    lease when the message has none (stored by other code, e.g. a test or an older version);
    does nothing once the message is gone (its session was deleted) or its turn has ended (its
    final reply, stored with the lease's deletion, is there: a late beat must not bring the lease
    back)."""
    now = timezone.now()
    if TurnLease.objects.filter(user_message_id=user_message_id).update(heartbeat=now):
        return
    if _without_final_reply(Message.objects.filter(pk=user_message_id, role=Message.Role.USER)).exists():
        TurnLease.objects.get_or_create(user_message_id=user_message_id, defaults={"heartbeat": now})


def turns_interrupted_close(*, session_id: int, exclude: Collection[int] = ()) -> list[Message]:
    """Close every interrupted turn of the session (:func:`turn_interrupted_list`) with a final
    assistant reply, status ``error``, origin ``app`` (never sent to the model, docs/memory.md
    F-37), content :data:`INTERRUPTED_TEXT`; returns the replies
    stored, oldest turn first. After the commit the session's sockets get ``chat.message`` and
    ``chat.done {turn_id, status: "error", message_id}``. Turns in ``exclude`` are left alone:
    pass :func:`turns_leased_here` (taken on the event loop), the turns this process runs, which
    are alive even before their first heartbeat is stored.

    Safe from any number of workers at once: each turn is re-checked under a lock on its user
    message row (the database serializes SQLite writers), so it is closed exactly once. A turn
    whose lease was renewed meanwhile is left alone.
    """
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
    """:func:`turns_interrupted_close` (``exclude`` likewise), then the session's
    :func:`turn_in_flight_first_id`, reading the session's pending turns once when none was
    interrupted (the usual case) instead of twice: what a turn needs as it opens."""
    cutoff = lease_cutoff()
    excluded = set(exclude)
    pending = pending_turns(session_id)
    if any(not lease_alive(heartbeat, cutoff) and message_id not in excluded for message_id, heartbeat in pending):
        turns_interrupted_close(session_id=session_id, exclude=excluded)
        cutoff = lease_cutoff()
        pending = pending_turns(session_id)
    return next((message_id for message_id, heartbeat in pending if lease_alive(heartbeat, cutoff)), None)


# Heartbeats per lease period: two may be missed (a slow database write) before a live turn
# would look interrupted.
HEARTBEATS_PER_LEASE = 3


# The turns whose lease this process renews, and those started here whose task has not taken
# the lease over yet (turn_lease_claim).
_leases_kept: set[int] = set()
_leases_claimed: set[int] = set()


def turn_lease_claim(*, user_message_id: int) -> None:
    """Count the turn opened by ``user_message_id`` as this process's (:func:`turns_leased_here`)
    from now on, before the task that will keep its lease (:func:`turn_lease_kept`) has started:
    call it on the event loop when starting that task. The claim ends when that block exits, or
    with :func:`turn_lease_unclaim` when the task ends without entering it."""
    _leases_claimed.add(user_message_id)


def turn_lease_unclaim(*, user_message_id: int) -> None:
    """End the claim of :func:`turn_lease_claim` (nothing when there is none)."""
    _leases_claimed.discard(user_message_id)


@contextlib.asynccontextmanager
async def turn_lease_kept(*, user_message_id: int, fresh: bool = False) -> AsyncIterator[None]:
    """Keep the lease of the turn opened by ``user_message_id`` fresh for the duration of the
    block: renewed once on entry (not with ``fresh``: the lease was stored a moment ago, e.g. by
    :func:`user_message_submit`, and a write per turn is saved), then every
    ``CHAT_TURN_LEASE_SECONDS / HEARTBEATS_PER_LEASE`` seconds by a background task until the
    block exits. Re-entrant (an inner block for a lease this process already keeps does nothing).
    A failed renewal is logged and retried on the next beat; it never breaks the turn."""
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
    """Ids of the turns (their user messages) this process runs or queues and keeps (or has
    claimed, :func:`turn_lease_claim`) the lease of."""
    return frozenset(_leases_kept | _leases_claimed)


def turn_leased_here(user_message_id: int) -> bool:
    """Whether the turn opened by ``user_message_id`` is one of :func:`turns_leased_here` (without
    copying the set: asked for every relayed event that opens a turn)."""
    return user_message_id in _leases_kept or user_message_id in _leases_claimed
