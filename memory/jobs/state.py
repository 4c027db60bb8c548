"""The stored state of a conversation's memory job (docs/memory.md §10): steps, watermarks,
attempt records and the lease, behind a small storage port."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

JobStatus = Literal["idle", "running", "failed"]


@dataclass(frozen=True, kw_only=True)
class StepAttempt:
    """The record of one run of one step.

    ``step``: the step's name; ``at``: when it started (ISO 8601, UTC); ``ok``: it returned
    without raising; ``error``: the exception as text (``""`` when ok); ``duration_ms``:
    milliseconds; ``watermark_before``/``watermark_after``: the step's watermark (a message id,
    None before the first run) before and after; unchanged when the attempt failed.
    """

    step: str
    at: str
    ok: bool
    error: str
    duration_ms: int
    watermark_before: int | None
    watermark_after: int | None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form kept in the job state and shown in the inspector."""
        return {
            "step": self.step,
            "at": self.at,
            "ok": self.ok,
            "error": self.error,
            "duration_ms": self.duration_ms,
            "watermark_before": self.watermark_before,
            "watermark_after": self.watermark_after,
        }


@dataclass(frozen=True, kw_only=True)
class JobState:
    """The stored state of one conversation's memory job.

    ``status``: ``idle`` (no job running; the last one succeeded or none ran), ``running``
    (a worker holds the lease) or ``failed`` (the last job had a failed step; ``last_error``
    says which and why). ``lease_owner``: the worker holding the lease (``""`` when none);
    ``lease_expires_at``: when it runs out (aware datetime, None when none); ``watermarks``: step
    name → message id; ``attempts``: step name → the JSON form of its last :class:`StepAttempt`;
    ``runs``: jobs completed so far.
    """

    memory_key: str
    status: JobStatus = "idle"
    lease_owner: str = ""
    lease_expires_at: datetime | None = None
    watermarks: dict[str, int | None] = field(default_factory=dict)
    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_error: str = ""
    runs: int = 0

    def held_by_other(self, owner: str, now: datetime) -> bool:
        """True when a worker other than ``owner`` holds a lease that has not run out at ``now``."""
        return bool(
            self.lease_owner
            and self.lease_owner != owner
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON form sent to the inspector (``lease_expires_at`` as ISO 8601 or None)."""
        return {
            "status": self.status,
            "lease_owner": self.lease_owner,
            "lease_expires_at": self.lease_expires_at.isoformat() if self.lease_expires_at else None,
            "watermarks": dict(self.watermarks),
            "attempts": dict(self.attempts),
            "last_error": self.last_error,
            "runs": self.runs,
        }


class JobStore(Protocol):
    """Where job state lives, shared by every worker. ``memory_key`` names one conversation.

    ``acquire`` takes the lease for ``owner`` for ``lease_seconds`` unless another owner holds
    one that has not run out; it returns the state as acquired (status ``running``) or None.
    ``renew`` extends a lease ``owner`` still holds (False when it lost it). ``step_done`` stores
    one step's attempt and, when it succeeded, its new watermark, only while ``owner`` holds the
    lease (False otherwise: the result is dropped). ``release`` ends the lease with the job's
    final status and error and counts the run. Storage errors propagate.
    """

    async def get(self, memory_key: str) -> JobState: ...

    async def acquire(self, memory_key: str, *, owner: str, lease_seconds: float) -> JobState | None: ...

    async def renew(self, memory_key: str, *, owner: str, lease_seconds: float) -> bool: ...

    async def step_done(self, memory_key: str, *, owner: str, attempt: StepAttempt) -> bool: ...

    async def release(self, memory_key: str, *, owner: str, status: JobStatus, error: str) -> None: ...


class JobStep(Protocol):
    """One step of the pipeline. ``name`` keys its watermark and attempt record.

    ``await step.due(memory_key)`` tells, reading only, whether the step has work now; a job
    whose steps have none ends without taking the lease or writing anything (most replies need no
    compression). ``await step.run(memory_key, watermark)`` does the step's work for every
    message after ``watermark`` (all of them when None) and returns its new watermark (the newest
    message id it dealt with; the same value when there was nothing to do). It raises on failure;
    the runner records the error and keeps the old watermark.
    """

    name: str

    async def due(self, memory_key: str) -> bool: ...

    async def run(self, memory_key: str, watermark: int | None) -> int | None: ...


class InMemoryJobStore:
    """:class:`JobStore` in a dict, with the same lease rules as the database store.

    ``clock`` returns the current aware datetime (tests move it to let leases run out).
    Shared by the runners of one process only.
    """

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self.states: dict[str, JobState] = {}
        self._clock = clock or (lambda: datetime.now(UTC))

    async def get(self, memory_key: str) -> JobState:
        return self.states.get(memory_key, JobState(memory_key=memory_key))

    async def acquire(self, memory_key: str, *, owner: str, lease_seconds: float) -> JobState | None:
        now = self._clock()
        state = await self.get(memory_key)
        if state.held_by_other(owner, now):
            return None
        state = replace(
            state, status="running", lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_seconds)
        )
        self.states[memory_key] = state
        return state

    async def renew(self, memory_key: str, *, owner: str, lease_seconds: float) -> bool:
        state = await self.get(memory_key)
        if state.lease_owner != owner:
            return False
        self.states[memory_key] = replace(state, lease_expires_at=self._clock() + timedelta(seconds=lease_seconds))
        return True

    async def step_done(self, memory_key: str, *, owner: str, attempt: StepAttempt) -> bool:
        state = await self.get(memory_key)
        if state.lease_owner != owner:
            return False
        watermarks = dict(state.watermarks)
        if attempt.ok:
            watermarks[attempt.step] = attempt.watermark_after
        attempts = {**state.attempts, attempt.step: attempt.as_dict()}
        self.states[memory_key] = replace(state, watermarks=watermarks, attempts=attempts)
        return True

    async def release(self, memory_key: str, *, owner: str, status: JobStatus, error: str) -> None:
        state = await self.get(memory_key)
        if state.lease_owner != owner:
            return
        self.states[memory_key] = replace(
            state, status=status, lease_owner="", lease_expires_at=None, last_error=error, runs=state.runs + 1
        )
