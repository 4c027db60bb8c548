"""Summaries and compression events in the database, and the engine's storage port over them
(compare-and-set on the summary's version, docs/memory.md §3 step 6)."""

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
    """The conversation's current summary, or an empty one (version 0) when it has none. Read on
    every request: written in SQL (the same row as ``SessionSummary.objects.filter(memory_key=…)
    .first()``), so Django does not build and compile the query each time (issue 11)."""
    row = next(iter(SessionSummary.objects.raw(_SUMMARY_SQL, [memory_key])), None)
    return Summary() if row is None else row.as_summary()


_SUMMARY_SQL = f"SELECT * FROM {SessionSummary._meta.db_table} WHERE memory_key = %s ORDER BY id LIMIT 1"


def session_summary_kind(*, memory_key: str, summary: Summary) -> str:
    """How the conversation's current ``summary`` (:func:`session_summary_get`) was written:
    :func:`memory.summarizer.summary_kind` of the compression event that wrote its version (one
    query), or its stored type when that event is gone or disagrees (``none`` before the first)."""
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
    """Compare-and-set write of a new summary (docs/memory.md §3 step 6).

    Succeeds (returns True) only if the stored version still equals ``expected_version`` and the
    boundary moves strictly forward; otherwise nothing is written and False is returned, so two
    concurrent compressions can never move the boundary backwards or overwrite a newer summary.
    ``new.version`` is ignored: the stored version becomes ``expected_version + 1``.
    ``token_count``: the summary text's size in tokens. With ``alive``, nothing is written and
    False is returned once the conversation is gone (deleted meanwhile, docs/memory.md F-41).
    With ``same_boundary`` the boundary may also stay where it is (a summary over the cap
    rewritten in place, docs/memory.md F-40); it still never moves back.
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
    """Store one compression event; with ``alive``, store nothing and return None once the
    conversation is gone (docs/memory.md F-41)."""
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
    """One page of the conversation's compression events for reading them all with bounded
    memory (an export): at most ``limit`` events with ``after_id < id <= up_to_id``, oldest
    first; ask again after the last id until a page comes back empty. ValueError for a
    ``limit`` below 1."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    rows = CompressionEvent.objects.filter(memory_key=memory_key, id__gt=after_id, id__lte=up_to_id)
    return list(rows.order_by("id")[:limit])


def session_memory_delete(*, memory_key: str) -> None:
    """Forget a conversation's memory state (its summary, events, job state, key facts,
    superseded ones included, and recall items); raw messages are not ours."""
    SessionSummary.objects.filter(memory_key=memory_key).delete()
    CompressionEvent.objects.filter(memory_key=memory_key).delete()
    MemoryJobState.objects.filter(memory_key=memory_key).delete()
    KeyFact.objects.filter(memory_key=memory_key).delete()
    MemoryItem.objects.filter(memory_key=memory_key).delete()


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
    """The engine's storage port (:class:`memory.store.SummaryStore`) over the database.

    ``alive`` (see :data:`ConversationAlive`), when given, guards every write: the state of a
    conversation deleted while it was being compressed is never recreated (docs/memory.md F-41).
    Its compare-and-set then fails like a lost race (the engine reads again and finds nothing
    left to compress) and its events are not stored (returned with ``id`` None).
    """

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
