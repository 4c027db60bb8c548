"""Persistence of memory state in the database: services write, selectors read.

The functions are synchronous ORM code; :class:`OrmSummaryStore` wraps them for the engine's
async storage port (:class:`memory.store.SummaryStore`).
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from memory.models import CompressionEvent, SessionSummary
from memory.store import CompressionRecord, Summary


def session_summary_get(*, memory_key: str) -> Summary:
    """The conversation's current summary, or an empty one (version 0) when it has none."""
    row = SessionSummary.objects.filter(memory_key=memory_key).first()
    return Summary() if row is None else row.as_summary()


def session_summary_save(*, memory_key: str, expected_version: int, new: Summary, token_count: int) -> bool:
    """Compare-and-set write of a new summary (docs/memory.md §3 step 6).

    Succeeds (returns True) only if the stored version still equals ``expected_version`` and the
    boundary moves strictly forward; otherwise nothing is written and False is returned, so two
    concurrent compressions can never move the boundary backwards or overwrite a newer summary.
    ``new.version`` is ignored: the stored version becomes ``expected_version + 1``.
    ``token_count``: the summary text's size in tokens.
    """
    fields = {
        "content": new.content,
        "summary_type": new.summary_type,
        "last_message_id": new.last_message_id,
        "compressed_count": new.compressed_count,
        "token_count": token_count,
        "version": expected_version + 1,
        "updated_at": timezone.now(),
    }
    with transaction.atomic():
        if expected_version == 0:
            _, created = SessionSummary.objects.get_or_create(memory_key=memory_key, defaults=fields)
            if created:
                return True
        queryset = SessionSummary.objects.filter(memory_key=memory_key, version=expected_version)
        if new.last_message_id is not None:
            queryset = queryset.exclude(last_message_id__gte=new.last_message_id)
        return queryset.update(**fields) == 1


def compression_event_create(*, memory_key: str, record: CompressionRecord) -> CompressionEvent:
    """Store one compression event."""
    return CompressionEvent.objects.create(memory_key=memory_key, **record.fields())


def compression_event_list(*, memory_key: str, limit: int = 50) -> list[CompressionEvent]:
    """The conversation's most recent ``limit`` compression events, oldest first."""
    rows = list(CompressionEvent.objects.filter(memory_key=memory_key).order_by("-id")[:limit])
    return rows[::-1]


def session_memory_delete(*, memory_key: str) -> None:
    """Forget a conversation's memory state (its summary and events); raw messages are not ours."""
    SessionSummary.objects.filter(memory_key=memory_key).delete()
    CompressionEvent.objects.filter(memory_key=memory_key).delete()


def summarizer_health_get(*, memory_key: str) -> dict[str, Any]:
    """The summarizer's health as of the conversation's last compression.

    ``status``: ``idle`` (no compression yet), ``ok`` (first primary attempt succeeded),
    ``retrying`` (the primary succeeded after failed attempts), ``failover`` (the failover model
    produced the summary) or ``raw_archive`` (every attempt failed; docs/memory.md §4, layer 3).
    ``last_error``: the newest failed attempt's error of that compression, ``""`` if none;
    ``attempts``: its attempt records; ``at``: when it happened (ISO 8601) or None.
    """
    event = (
        CompressionEvent.objects.filter(memory_key=memory_key, kind__in=("compression", "superseded"))
        .order_by("-id")
        .first()
    )
    if event is None:
        return {"status": "idle", "last_error": "", "attempts": [], "at": None}
    attempts = event.attempts or []
    errors = [attempt["error"] for attempt in attempts if not attempt.get("ok")]
    succeeded = next((attempt for attempt in attempts if attempt.get("ok")), None)
    if event.degraded or succeeded is None:
        status = "raw_archive"
    elif succeeded.get("phase") == "failover":
        status = "failover"
    elif errors:
        status = "retrying"
    else:
        status = "ok"
    return {
        "status": status,
        "last_error": errors[-1] if errors else "",
        "attempts": attempts,
        "at": event.created_at.isoformat(),
    }


class OrmSummaryStore:
    """The engine's storage port (:class:`memory.store.SummaryStore`) over the database."""

    async def get(self, memory_key: str) -> Summary:
        return await sync_to_async(session_summary_get)(memory_key=memory_key)

    async def compare_and_set(self, memory_key: str, *, expected_version: int, new: Summary, token_count: int) -> bool:
        return await sync_to_async(session_summary_save)(
            memory_key=memory_key, expected_version=expected_version, new=new, token_count=token_count
        )

    async def record(self, memory_key: str, record: CompressionRecord) -> dict[str, Any]:
        event = await sync_to_async(compression_event_create)(memory_key=memory_key, record=record)
        return event.as_dict()
