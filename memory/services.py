"""Persistence of memory state (services write, selectors read). All functions are synchronous
ORM calls; async callers wrap them with ``asgiref.sync.sync_to_async``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from memory.models import CompressionEvent, SessionSummary


@dataclass(frozen=True, kw_only=True)
class SummaryState:
    """A snapshot of a session's summary as read: ``last_message_id`` is the boundary (None
    before the first compression), ``version`` the compare-and-set token."""

    content: str = ""
    summary_type: str = "none"
    last_message_id: int | None = None
    compressed_count: int = 0
    version: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": self.summary_type,
            "content": self.content,
            "last_message_id": self.last_message_id,
            "compressed_count": self.compressed_count,
            "version": self.version,
        }


def session_summary_get(*, session_key: str) -> SummaryState:
    """The session's current summary, or an empty state (version 0) when it has none."""
    row = SessionSummary.objects.filter(session_key=session_key).first()
    if row is None:
        return SummaryState()
    return SummaryState(
        content=row.content,
        summary_type=row.summary_type,
        last_message_id=row.last_message_id,
        compressed_count=row.compressed_count,
        version=row.version,
    )


def session_summary_save(*, session_key: str, expected_version: int, new: SummaryState, token_count: int) -> bool:
    """Compare-and-set write of a new summary (SPEC.md section 3 step 6).

    Succeeds (returns True) only if the stored version still equals ``expected_version`` and the
    boundary moves strictly forward; otherwise nothing is written and False is returned, so two
    concurrent compressions can never move the boundary backwards or overwrite a newer summary.
    ``new.version`` is ignored: the stored version becomes ``expected_version + 1``.
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
            _, created = SessionSummary.objects.get_or_create(session_key=session_key, defaults=fields)
            if created:
                return True
        queryset = SessionSummary.objects.filter(session_key=session_key, version=expected_version)
        if new.last_message_id is not None:
            queryset = queryset.exclude(last_message_id__gte=new.last_message_id)
        return queryset.update(**fields) == 1


def compression_event_create(*, session_key: str, **fields: Any) -> CompressionEvent:
    """Record one compression event (see :class:`memory.models.CompressionEvent` for fields)."""
    return CompressionEvent.objects.create(session_key=session_key, **fields)


def compression_event_list(*, session_key: str, limit: int = 50) -> list[CompressionEvent]:
    """The session's most recent ``limit`` compression events, oldest first."""
    rows = list(CompressionEvent.objects.filter(session_key=session_key).order_by("-id")[:limit])
    return rows[::-1]


def session_memory_delete(*, session_key: str) -> None:
    """Forget a session's memory state (its summary and events); raw messages are not ours."""
    SessionSummary.objects.filter(session_key=session_key).delete()
    CompressionEvent.objects.filter(session_key=session_key).delete()


def summarizer_health_get(*, session_key: str) -> dict[str, Any]:
    """The summarizer's health as of the session's last compression.

    ``status``: ``idle`` (no compression yet), ``ok`` (first primary attempt succeeded),
    ``retrying`` (the primary succeeded after failed attempts), ``failover`` (the failover model
    produced the summary) or ``raw_archive`` (every attempt failed; SPEC.md section 4 layer 3).
    ``last_error``: the newest failed attempt's error of that compression, ``""`` if none;
    ``attempts``: its attempt records; ``at``: when it happened (ISO 8601) or None.
    """
    event = (
        CompressionEvent.objects.filter(session_key=session_key, kind__in=("compression", "superseded"))
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
