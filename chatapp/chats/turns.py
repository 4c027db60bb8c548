"""Turns in flight as the session's rows tell them (docs/memory.md F-26): a user message without a final reply (an
assistant message without ``tool_calls``) is in flight while its lease is fresh, interrupted once it is not."""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from chatapp.models import Message, TurnLease


def pending_turns_sql() -> str:
    """The SQL of :func:`pending_turns`: asked often, and the ORM's ``Exists`` cost more to build than to run."""
    quote = connection.ops.quote_name
    message, lease = quote(Message._meta.db_table), quote(TurnLease._meta.db_table)
    return (
        f"SELECT m.id, l.heartbeat FROM {message} m LEFT JOIN {lease} l ON l.user_message_id = m.id "
        f"WHERE m.session_id = %s AND m.role = '{Message.Role.USER.value}' AND NOT EXISTS ("
        f"SELECT 1 FROM {message} r WHERE r.reply_to_id = m.id "
        f"AND r.role = '{Message.Role.ASSISTANT.value}' AND r.tool_calls IS NULL) "
        "ORDER BY m.id"
    )


def pending_turns(session_id: int) -> list[tuple[int, datetime | None]]:
    with connection.cursor() as cursor:
        cursor.execute(pending_turns_sql(), [session_id])
        rows = cursor.fetchall()
    return [(int(message_id), heartbeat_aware(heartbeat)) for message_id, heartbeat in rows]


def heartbeat_aware(value: datetime | str | None) -> datetime | None:
    """A heartbeat as an aware datetime (SQLite returns naive UTC)."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if value is not None and timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value


def lease_cutoff() -> datetime:
    """Heartbeats from this moment on are fresh; with ``CHAT_TURN_LEASES_ONE_PROCESS``, none older than this process."""
    cutoff = timezone.now() - timedelta(seconds=settings.CHAT_TURN_LEASE_SECONDS)
    return max(cutoff, PROCESS_STARTED) if settings.CHAT_TURN_LEASES_ONE_PROCESS else cutoff


PROCESS_STARTED = timezone.now()


def lease_alive(heartbeat: datetime | None, cutoff: datetime) -> bool:
    return heartbeat is not None and heartbeat >= cutoff


def turn_in_flight_list(*, session_id: int) -> list[int]:
    cutoff = lease_cutoff()
    return [message_id for message_id, heartbeat in pending_turns(session_id) if lease_alive(heartbeat, cutoff)]


def turn_in_flight_first_id(*, session_id: int) -> int | None:
    """The oldest in-flight user message's id, or None: compression must not summarize from there on (F-26)."""
    return next(iter(turn_in_flight_list(session_id=session_id)), None)


def turn_lease_next_expiry(*, session_id: int, exclude: Collection[int] = ()) -> datetime | None:
    """When the first lease of the turns in flight but ``exclude`` (this process's, still renewing) runs out, or None."""
    excluded = set(exclude)
    heartbeats = [
        heartbeat
        for message_id, heartbeat in pending_turns(session_id)
        if heartbeat is not None and message_id not in excluded
    ]
    return min(heartbeats) + timedelta(seconds=settings.CHAT_TURN_LEASE_SECONDS) if heartbeats else None


def turn_interrupted_list(*, session_id: int) -> list[int]:
    cutoff = lease_cutoff()
    return [message_id for message_id, heartbeat in pending_turns(session_id) if not lease_alive(heartbeat, cutoff)]
