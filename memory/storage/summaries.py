"""Summaries and compression events in the database, and the engine's storage port over them."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from memory.models import CompressionEvent, KeyFact, MemoryItem, MemoryJobState, SessionSummary
from memory.ports import ConversationAlive, RunSync
from memory.summary import chain as summarizer
from memory.summary.store import CompressionRecord, Summary

logger = logging.getLogger(__name__)


def session_summary_get(*, memory_key: str) -> Summary:
    """The current summary, or an empty one (version 0). Fixed SQL, as it runs every request and Django would
    build and compile the query each time."""
    row = next(iter(SessionSummary.objects.raw(_SUMMARY_SQL, [memory_key])), None)
    return Summary() if row is None else row.as_summary()


_SUMMARY_SQL = f"SELECT * FROM {SessionSummary._meta.db_table} WHERE memory_key = %s ORDER BY id LIMIT 1"


def session_summary_kind(*, memory_key: str, summary: Summary) -> str:
    """How ``summary`` was written: :func:`memory.summary.chain.summary_kind` of the event that wrote its version,
    or its stored type when that event is gone or disagrees."""
    if not summary.version:
        return summary.summary_type
    event = (
        CompressionEvent.objects.filter(
            memory_key=memory_key, kind=CompressionEvent.Kind.COMPRESSION, summary_version=summary.version
        )
        .order_by("-id")
        .values_list("result_type", "attempts")
        .first()
    )
    if event is None or event[0] != summary.summary_type:
        return summary.summary_type
    return summarizer.summary_kind(event[0], event[1] or [])


def session_summary_save(
    *,
    memory_key: str,
    expected_version: int,
    new: Summary,
    token_count: int,
    alive: ConversationAlive | None = None,
    same_boundary: bool = False,
) -> bool:
    """Compare-and-set write (docs/memory.md §3 step 6): only at ``expected_version`` with the boundary moving
    forward, or staying with ``same_boundary`` (F-40); the version becomes ``expected_version + 1``. Returns whether
    it wrote; never writes once ``alive`` fails (F-41)."""
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
        if alive is not None and not alive(memory_key):
            return False
        if expected_version == 0:
            _, created = SessionSummary.objects.get_or_create(memory_key=memory_key, defaults=fields)
            if created:
                return True
        queryset = SessionSummary.objects.filter(memory_key=memory_key, version=expected_version)
        if new.last_message_id is not None:
            if same_boundary:
                queryset = queryset.exclude(last_message_id__gt=new.last_message_id)
            else:
                queryset = queryset.exclude(last_message_id__gte=new.last_message_id)
        return queryset.update(**fields) == 1


def compression_event_create(
    *, memory_key: str, record: CompressionRecord, alive: ConversationAlive | None = None
) -> CompressionEvent | None:
    """Store one event; None, nothing stored, once ``alive`` fails (docs/memory.md F-41)."""
    with transaction.atomic():
        if alive is not None and not alive(memory_key):
            return None
        return CompressionEvent.objects.create(memory_key=memory_key, **record.fields())


def compression_event_list(*, memory_key: str, limit: int = 50) -> list[CompressionEvent]:
    """The conversation's most recent ``limit`` compression events, oldest first."""
    rows = list(CompressionEvent.objects.filter(memory_key=memory_key).order_by("-id")[:limit])
    return rows[::-1]


def compression_event_list_after(
    *, memory_key: str, after_id: int, up_to_id: int, limit: int
) -> list[CompressionEvent]:
    """One page for reading every event with bounded memory (an export): at most ``limit`` with ``after_id < id <=
    up_to_id``, oldest first. ValueError for ``limit`` below 1."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    rows = CompressionEvent.objects.filter(memory_key=memory_key, id__gt=after_id, id__lte=up_to_id)
    return list(rows.order_by("id")[:limit])


def session_summary_adopt(*, memory_key: str, source_key: str, summary: Summary, token_count: int, note: str) -> bool:
    """Write ``summary`` (the source's, its boundary already moved) as the first of the empty ``memory_key``, with a
    copy of the source's event that wrote it (so its kind and history read the same), ``note`` added. Returns
    whether it wrote (False when ``memory_key`` already has a summary)."""
    source_version = session_summary_get(memory_key=source_key).version
    with transaction.atomic():
        if not session_summary_save(memory_key=memory_key, expected_version=0, new=summary, token_count=token_count):
            return False
        event = (
            CompressionEvent.objects.filter(
                memory_key=source_key, kind=CompressionEvent.Kind.COMPRESSION, summary_version=source_version
            )
            .order_by("-id")
            .first()
        )
        if event is not None:
            event.pk = None
            event.memory_key = memory_key
            event.summary_version = 1
            event.boundary_before = None
            event.boundary_after = summary.last_message_id
            event.notes = [*(event.notes or []), note]
            event.save(force_insert=True)
    return True


def session_memory_delete(*, memory_key: str) -> None:
    """Forget a conversation's memory state (summary, events, job, facts, recall items); messages are not ours."""
    SessionSummary.objects.filter(memory_key=memory_key).delete()
    CompressionEvent.objects.filter(memory_key=memory_key).delete()
    MemoryJobState.objects.filter(memory_key=memory_key).delete()
    KeyFact.objects.filter(memory_key=memory_key).delete()
    MemoryItem.objects.filter(memory_key=memory_key).delete()


def session_memory_forget_after(*, memory_key: str, message_id: int) -> tuple[int, int]:
    """Forget what memory derived from the conversation's messages after ``message_id``, deleted by the app (a
    regenerated reply): their recall items are deleted, their active key facts invalidated (facts are never deleted).
    Returns ``(items deleted, facts invalidated)``. The summary must not reach past ``message_id`` (the caller's check)."""
    items, _ = MemoryItem.objects.filter(memory_key=memory_key, last_message_id__gt=message_id).delete()
    facts = KeyFact.objects.filter(
        memory_key=memory_key, source_message_id__gt=message_id, invalidated_at__isnull=True
    ).update(invalidated_at=timezone.now(), operation="forget")
    return items, facts


def summarizer_health_get(*, memory_key: str) -> dict[str, Any]:
    """The summarizer's health at the last compression: ``status`` ``idle``, ``ok``, ``retrying``, ``failover`` or
    ``raw_archive`` (docs/memory.md §4), ``last_error`` (the newest failed attempt's), ``attempts``, ``at``."""
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
    """:class:`memory.summary.store.SummaryStore` over the database; ``alive`` guards every write, so a chat deleted
    mid-compression is never recreated (F-41): its write fails like a lost race, its events are not stored."""

    def __init__(self, *, alive: ConversationAlive | None = None, run_sync: RunSync = sync_to_async) -> None:
        self.alive = alive
        self.run_sync = run_sync

    async def get(self, memory_key: str) -> Summary:
        return await self.run_sync(session_summary_get)(memory_key=memory_key)

    async def compare_and_set(
        self, memory_key: str, *, expected_version: int, new: Summary, token_count: int, same_boundary: bool = False
    ) -> bool:
        return await self.run_sync(session_summary_save)(
            memory_key=memory_key,
            expected_version=expected_version,
            new=new,
            token_count=token_count,
            same_boundary=same_boundary,
            alive=self.alive,
        )

    async def record(self, memory_key: str, record: CompressionRecord) -> CompressionRecord:
        event = await self.run_sync(compression_event_create)(memory_key=memory_key, record=record, alive=self.alive)
        return record if event is None else event.as_record()
