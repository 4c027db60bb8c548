"""Persistence of memory state in the database: services write, selectors read.

The functions are synchronous ORM code; :class:`OrmSummaryStore` wraps them for the engine's
async storage port (:class:`memory.store.SummaryStore`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from memory.jobs import JobState, JobStatus, StepAttempt
from memory.models import CompressionEvent, MemoryJobState, SessionSummary
from memory.store import CompressionRecord, Summary


def session_summary_get(*, memory_key: str) -> Summary:
    """The conversation's current summary, or an empty one (version 0) when it has none."""
    row = SessionSummary.objects.filter(memory_key=memory_key).first()
    return Summary() if row is None else row.as_summary()


ConversationAlive = Callable[[str], bool]
"""``alive(memory_key)``: whether the conversation still exists, asked inside a write's transaction
by the app that owns it; it should lock the conversation's row so a concurrent delete waits for
the write or the write sees the delete (docs/memory.md F-41)."""


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


def session_memory_delete(*, memory_key: str) -> None:
    """Forget a conversation's memory state (its summary and events); raw messages are not ours."""
    SessionSummary.objects.filter(memory_key=memory_key).delete()
    CompressionEvent.objects.filter(memory_key=memory_key).delete()
    MemoryJobState.objects.filter(memory_key=memory_key).delete()


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

    def __init__(self, *, alive: ConversationAlive | None = None) -> None:
        self.alive = alive

    async def get(self, memory_key: str) -> Summary:
        return await sync_to_async(session_summary_get)(memory_key=memory_key)

    async def compare_and_set(
        self, memory_key: str, *, expected_version: int, new: Summary, token_count: int, same_boundary: bool = False
    ) -> bool:
        return await sync_to_async(session_summary_save)(
            memory_key=memory_key,
            expected_version=expected_version,
            new=new,
            token_count=token_count,
            same_boundary=same_boundary,
            alive=self.alive,
        )

    async def record(self, memory_key: str, record: CompressionRecord) -> dict[str, Any]:
        event = await sync_to_async(compression_event_create)(memory_key=memory_key, record=record, alive=self.alive)
        if event is None:
            return {"id": None, "created_at": None, **record.fields()}
        return event.as_dict()


def memory_job_state_get(*, memory_key: str) -> JobState:
    """The conversation's memory-job state, or an idle one when no job has run."""
    row = MemoryJobState.objects.filter(memory_key=memory_key).first()
    return JobState(memory_key=memory_key) if row is None else row.as_state()


def memory_job_acquire(*, memory_key: str, owner: str, lease_seconds: float) -> JobState | None:
    """Take the conversation's job lease for ``owner`` for ``lease_seconds`` (docs/memory.md §10,
    "memory job"): one conditional UPDATE, so of two workers asking at once exactly one gets it.
    Returns the state as acquired (status ``running``), or None while another owner holds a lease
    that has not run out."""
    now = timezone.now()
    MemoryJobState.objects.get_or_create(memory_key=memory_key)
    free = Q(lease_owner="") | Q(lease_owner=owner) | Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lte=now)
    taken = (
        MemoryJobState.objects.filter(free, memory_key=memory_key).update(
            status="running", lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds), updated_at=now
        )
        == 1
    )
    return memory_job_state_get(memory_key=memory_key) if taken else None


def memory_job_renew(*, memory_key: str, owner: str, lease_seconds: float) -> bool:
    """Extend the lease ``owner`` holds by ``lease_seconds`` from now; False when it lost it."""
    now = timezone.now()
    return (
        MemoryJobState.objects.filter(memory_key=memory_key, lease_owner=owner).update(
            lease_expires_at=now + timedelta(seconds=lease_seconds), updated_at=now
        )
        == 1
    )


def memory_job_step_done(*, memory_key: str, owner: str, attempt: StepAttempt) -> bool:
    """Store one step's attempt and, if it succeeded, its new watermark, while ``owner`` still
    holds the lease (row locked for the read-modify-write); False, writing nothing, otherwise."""
    with transaction.atomic():
        row = MemoryJobState.objects.select_for_update().filter(memory_key=memory_key, lease_owner=owner).first()
        if row is None:
            return False
        if attempt.ok:
            row.watermarks = {**row.watermarks, attempt.step: attempt.watermark_after}
        row.attempts = {**row.attempts, attempt.step: attempt.as_dict()}
        row.save(update_fields=["watermarks", "attempts", "updated_at"])
    return True


def memory_job_release(*, memory_key: str, owner: str, status: JobStatus, error: str) -> None:
    """End ``owner``'s lease with the job's final ``status`` and ``error`` and count the run;
    nothing happens when ``owner`` no longer holds it."""
    with transaction.atomic():
        row = MemoryJobState.objects.select_for_update().filter(memory_key=memory_key, lease_owner=owner).first()
        if row is None:
            return
        row.status, row.last_error, row.lease_owner, row.lease_expires_at = status, error, "", None
        row.runs += 1
        row.save(update_fields=["status", "last_error", "lease_owner", "lease_expires_at", "runs", "updated_at"])


class OrmJobStore:
    """The memory jobs' shared state (:class:`memory.jobs.JobStore`) in the database."""

    async def get(self, memory_key: str) -> JobState:
        return await sync_to_async(memory_job_state_get)(memory_key=memory_key)

    async def acquire(self, memory_key: str, *, owner: str, lease_seconds: float) -> JobState | None:
        return await sync_to_async(memory_job_acquire)(memory_key=memory_key, owner=owner, lease_seconds=lease_seconds)

    async def renew(self, memory_key: str, *, owner: str, lease_seconds: float) -> bool:
        return await sync_to_async(memory_job_renew)(memory_key=memory_key, owner=owner, lease_seconds=lease_seconds)

    async def step_done(self, memory_key: str, *, owner: str, attempt: StepAttempt) -> bool:
        return await sync_to_async(memory_job_step_done)(memory_key=memory_key, owner=owner, attempt=attempt)

    async def release(self, memory_key: str, *, owner: str, status: JobStatus, error: str) -> None:
        await sync_to_async(memory_job_release)(memory_key=memory_key, owner=owner, status=status, error=error)
