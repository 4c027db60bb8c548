"""A conversation's memory-job state (docs/memory.md §10): steps, watermarks, attempts and the lease, behind a port."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

JobStatus = Literal["idle", "running", "failed"]


@dataclass(frozen=True, kw_only=True)
class StepAttempt:
    """One run of one step, ``at`` ISO 8601 UTC; the watermark (a message id) does not move when it failed."""

    step: str
    at: str
    ok: bool
    error: str
    duration_ms: int
    watermark_before: int | None
    watermark_after: int | None

    def as_dict(self) -> dict[str, Any]:
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
    """One conversation's job state: ``status`` ``idle``, ``running`` (a worker holds the lease) or ``failed``
    (``last_error`` says why); ``watermarks`` and last ``attempts`` by step name; ``runs`` completed."""

    memory_key: str
    status: JobStatus = "idle"
    lease_owner: str = ""
    lease_expires_at: datetime | None = None
    watermarks: dict[str, int | None] = field(default_factory=dict)
    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_error: str = ""
    runs: int = 0

    def held_by_other(self, owner: str, now: datetime) -> bool:
        return bool(
            self.lease_owner
            and self.lease_owner != owner
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )

    def as_dict(self) -> dict[str, Any]:
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
    """Job state shared by every worker. ``acquire`` takes the lease unless another owner holds a live one (None
    then); ``renew``, ``step_done`` (the attempt, and the watermark on success) and ``release`` act only for the
    holder, the first two saying whether they did. Storage errors propagate."""

    async def get(self, memory_key: str) -> JobState: ...

    async def acquire(self, memory_key: str, *, owner: str, lease_seconds: float) -> JobState | None: ...

    async def renew(self, memory_key: str, *, owner: str, lease_seconds: float) -> bool: ...

    async def step_done(self, memory_key: str, *, owner: str, attempt: StepAttempt) -> bool: ...

    async def release(self, memory_key: str, *, owner: str, status: JobStatus, error: str) -> None: ...


class JobStep(Protocol):
    """One pipeline step; ``name`` keys its watermark. ``due`` says, reading only, whether it has work (a job with
    none takes no lease); ``run`` handles the messages after ``watermark`` and returns the new one, raising on
    failure (the runner keeps the old one)."""

    name: str

    async def due(self, memory_key: str) -> bool: ...

    async def run(self, memory_key: str, watermark: int | None) -> int | None: ...


class InMemoryJobStore:
    """:class:`JobStore` in one process's dict, with the same lease rules; ``clock`` lets tests run leases out."""

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
