"""Memory-job state and leases in the database (docs/memory.md §10, "memory job")."""

from __future__ import annotations

from datetime import timedelta

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from memory.jobs.state import JobState, JobStatus, StepAttempt
from memory.models import MemoryJobState
from memory.ports import RunSync


def memory_job_state_get(*, memory_key: str) -> JobState:
    """The conversation's memory-job state, or an idle one when no job has run."""
    row = MemoryJobState.objects.filter(memory_key=memory_key).first()
    return JobState(memory_key=memory_key) if row is None else row.as_state()


def memory_job_acquire(*, memory_key: str, owner: str, lease_seconds: float) -> JobState | None:
    """Take the job lease for ``owner`` for ``lease_seconds`` with one conditional UPDATE, so of two workers exactly
    one gets it; the state as acquired, or None while another owner holds a live lease."""
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
    """End ``owner``'s lease with the job's ``status`` and ``error`` and count the run; nothing if it lost the lease."""
    with transaction.atomic():
        row = MemoryJobState.objects.select_for_update().filter(memory_key=memory_key, lease_owner=owner).first()
        if row is None:
            return
        row.status, row.last_error, row.lease_owner, row.lease_expires_at = status, error, "", None
        row.runs += 1
        row.save(update_fields=["status", "last_error", "lease_owner", "lease_expires_at", "runs", "updated_at"])


class OrmJobStore:
    """:class:`memory.jobs.state.JobStore` in the database; ``run_sync`` runs each call on a database thread."""

    def __init__(self, *, run_sync: RunSync = sync_to_async) -> None:
        self.run_sync = run_sync

    async def get(self, memory_key: str) -> JobState:
        return await self.run_sync(memory_job_state_get)(memory_key=memory_key)

    async def acquire(self, memory_key: str, *, owner: str, lease_seconds: float) -> JobState | None:
        return await self.run_sync(memory_job_acquire)(memory_key=memory_key, owner=owner, lease_seconds=lease_seconds)

    async def renew(self, memory_key: str, *, owner: str, lease_seconds: float) -> bool:
        return await self.run_sync(memory_job_renew)(memory_key=memory_key, owner=owner, lease_seconds=lease_seconds)

    async def step_done(self, memory_key: str, *, owner: str, attempt: StepAttempt) -> bool:
        return await self.run_sync(memory_job_step_done)(memory_key=memory_key, owner=owner, attempt=attempt)

    async def release(self, memory_key: str, *, owner: str, status: JobStatus, error: str) -> None:
        await self.run_sync(memory_job_release)(memory_key=memory_key, owner=owner, status=status, error=error)
