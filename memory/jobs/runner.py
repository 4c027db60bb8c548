"""Runs memory jobs in this process (docs/memory.md §10): debounced, coalescing, batched when
idle, single-flight across workers through the job store's lease. Pure: no ORM, no I/O."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime

from memory.jobs.state import JobState, JobStep, JobStore, StepAttempt

logger = logging.getLogger(__name__)

_in_memory_job: ContextVar[bool] = ContextVar("in_memory_job", default=False)


def in_memory_job() -> bool:
    """Whether the running code is a memory job's (background work), not a user's turn: an LLM client that
    limits requests per server serves a waiting turn first (docs/memory.md §6 "Concurrency")."""
    return _in_memory_job.get()


@dataclass(frozen=True, kw_only=True)
class JobRun:
    """What one job did: ``attempts`` of the due steps in order; ``lost_lease`` when the lease ran out mid-way (later
    results dropped); ``idle`` when no step was due (nothing taken or written)."""

    memory_key: str
    attempts: tuple[StepAttempt, ...]
    ok: bool
    lost_lease: bool = False
    idle: bool = False


class MemoryJobRunner:
    """Runs this process's memory jobs. ``owner`` names this worker in leases; a lease lasts ``lease_seconds`` and
    is renewed every third of it; ``on_done`` gets each finished :class:`JobRun`; ``batch_turns`` 1 makes every idle
    schedule urgent. One event loop only."""

    def __init__(
        self,
        *,
        store: JobStore,
        steps: Sequence[JobStep],
        owner: str,
        debounce_seconds: float = 0.2,
        lease_seconds: float = 60.0,
        on_done: Callable[[JobRun], object] | None = None,
        idle_seconds: float = 15.0,
        batch_turns: int = 4,
    ) -> None:
        self.store = store
        self.steps = list(steps)
        self.owner = owner
        self.debounce_seconds = debounce_seconds
        self.lease_seconds = lease_seconds
        self.on_done = on_done
        self.idle_seconds = idle_seconds
        self.batch_turns = max(1, batch_turns)
        self._tasks: dict[str, asyncio.Task[JobRun | None]] = {}
        # Jobs pending until idle (not yet running), and the idle schedules since each one's last job started.
        self._idle: set[str] = set()
        self._idle_calls: dict[str, int] = {}
        # Conversations to run once more after their running job; True when that may wait.
        self._again: dict[str, bool] = {}
        self._running: set[str] = set()

    def schedule(self, memory_key: str, *, idle: bool = False) -> None:
        """Queue the conversation's job and return (docs/memory.md §10 "When"): urgent, it starts after
        ``debounce_seconds``; idle, after ``idle_seconds`` without a schedule or at once on the ``batch_turns``-th
        since the last job. A pending urgent job is never delayed; a running one runs once more after."""
        if idle:
            calls = self._idle_calls.get(memory_key, 0) + 1
            self._idle_calls[memory_key] = calls
            idle = calls < self.batch_turns
        task = self._tasks.get(memory_key)
        if task is not None and not task.done():
            if memory_key in self._running:
                self._again[memory_key] = self._again.get(memory_key, True) and idle
                return
            if memory_key not in self._idle:
                return  # a pending urgent job absorbs any schedule
            task.cancel()  # a pending idle job: pushed back, or started at once
        self._start(memory_key, self.idle_seconds if idle else self.debounce_seconds, idle=idle)

    def _start(self, memory_key: str, delay: float, *, idle: bool) -> None:
        """A new task for the conversation's job after ``delay`` seconds."""
        if idle:
            self._idle.add(memory_key)
        else:
            self._idle.discard(memory_key)
        task = asyncio.get_running_loop().create_task(self._loop(memory_key, delay), name=f"memory-job:{memory_key}")
        self._tasks[memory_key] = task
        # A finished job keeps nothing: a worker serving many chats must not grow without bound.
        task.add_done_callback(lambda done: self._forget_task(memory_key, done))

    def _forget_task(self, memory_key: str, task: asyncio.Task[JobRun | None]) -> None:
        if self._tasks.get(memory_key) is task:
            del self._tasks[memory_key]

    async def run_now(self, memory_key: str) -> JobRun | None:
        """Run the job to completion now (replays' deterministic path), replacing one in its debounce pause, after
        one running. None when another worker held the lease throughout."""
        task = self._tasks.get(memory_key)
        if task is not None and not task.done():
            self._again.pop(memory_key, None)
            if memory_key not in self._running:
                task.cancel()  # still in its debounce pause: this run replaces it
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        self._start(memory_key, 0.0, idle=False)
        return await self._tasks[memory_key]

    def busy(self, memory_key: str) -> bool:
        """True while a job of this process is pending or running for the conversation."""
        task = self._tasks.get(memory_key)
        return task is not None and not task.done()

    async def wait(self, memory_key: str, timeout_seconds: float, *, poll_seconds: float = 0.05) -> bool:
        """Wait at most ``timeout_seconds`` for the job to end, this process's (a pending idle one starts at once),
        then another worker's (its lease polled every ``poll_seconds``). False at the deadline; storage errors
        propagate."""
        deadline = time.monotonic() + timeout_seconds
        if memory_key in self._idle and memory_key not in self._running:
            self.schedule(memory_key)  # a request needs it now: a job waiting for idleness starts
        while (task := self._tasks.get(memory_key)) is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                return False
        while (await self.store.get(memory_key)).held_by_other(self.owner, datetime.now(UTC)):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(poll_seconds, left))
        return True

    async def close(self) -> None:
        """Cancel every pending or running job of this process (their leases run out)."""
        tasks = [task for task in self._tasks.values() if not task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._idle.clear()
        self._idle_calls.clear()
        self._again.clear()

    async def _loop(self, memory_key: str, delay: float) -> JobRun | None:
        """One job after ``delay`` seconds; a schedule during it queues the next as a new task, not holding awaiters."""
        _in_memory_job.set(True)  # this task's own context: the LLM client lets a user's turn go first
        if delay:
            await asyncio.sleep(delay)
        self._idle.discard(memory_key)
        self._idle_calls.pop(memory_key, None)
        self._running.add(memory_key)
        try:
            run = await self._run_with_lease(memory_key)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The store itself failed (database down): nothing recorded; the next reply schedules again.
            logger.exception("memory job of %s could not run", memory_key)
            run = None
        finally:
            self._running.discard(memory_key)
        if memory_key in self._again:
            idle = self._again.pop(memory_key)
            self._start(memory_key, self.idle_seconds if idle else self.debounce_seconds, idle=idle)
        return run

    async def _run_with_lease(self, memory_key: str) -> JobRun | None:
        steps = [step for step in self.steps if await step.due(memory_key)]
        if not steps:
            run = JobRun(memory_key=memory_key, attempts=(), ok=True, idle=True)
            await self._done(run)
            return run
        state = await self._acquire(memory_key)
        if state is None:
            return None
        renewal = asyncio.get_running_loop().create_task(self._renew(memory_key))
        attempts: list[StepAttempt] = []
        lost = False
        try:
            for step in steps:
                attempt = await self._run_step(step, memory_key, state.watermarks.get(step.name))
                attempts.append(attempt)
                if not await self.store.step_done(memory_key, owner=self.owner, attempt=attempt):
                    lost = True
                    break
        finally:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal
        failed = [attempt for attempt in attempts if not attempt.ok]
        error = "; ".join(f"{attempt.step}: {attempt.error}" for attempt in failed)
        if not lost:
            await self.store.release(memory_key, owner=self.owner, status="failed" if failed else "idle", error=error)
        run = JobRun(memory_key=memory_key, attempts=tuple(attempts), ok=not failed and not lost, lost_lease=lost)
        await self._done(run)
        return run

    async def _done(self, run: JobRun) -> None:
        if self.on_done is not None:
            try:
                told = self.on_done(run)
                if inspect.isawaitable(told):
                    await told
            except Exception:
                logger.exception("memory job callback failed for %s", run.memory_key)

    def waits_for_idle(self, memory_key: str) -> bool:
        """True while the conversation's pending job waits for idleness (``schedule(idle=True)``)."""
        return memory_key in self._idle and self.busy(memory_key) and memory_key not in self._running

    def status(self, memory_key: str) -> str | None:
        """``running``, ``queued`` or ``batched`` (until idle) for this process's job, else None (ask the store)."""
        if memory_key in self._running:
            return "running"
        if self.waits_for_idle(memory_key):
            return "batched"
        return "queued" if self.busy(memory_key) else None

    async def _acquire(self, memory_key: str) -> JobState | None:
        """The lease, retrying with backoff (0.05 s doubling to 1 s) for at most ``lease_seconds`` while another holds
        it."""
        deadline = time.monotonic() + self.lease_seconds
        pause = 0.05
        while True:
            state = await self.store.acquire(memory_key, owner=self.owner, lease_seconds=self.lease_seconds)
            if state is not None or time.monotonic() >= deadline:
                return state
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def _renew(self, memory_key: str) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            if not await self.store.renew(memory_key, owner=self.owner, lease_seconds=self.lease_seconds):
                return

    async def _run_step(self, step: JobStep, memory_key: str, watermark: int | None) -> StepAttempt:
        started = time.monotonic()
        at = datetime.now(UTC).isoformat()
        try:
            new_watermark = await step.run(memory_key, watermark)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("memory job step %s of %s failed: %s", step.name, memory_key, exc)
            return StepAttempt(
                step=step.name,
                at=at,
                ok=False,
                error=f"{type(exc).__name__}: {exc}"[:500],
                duration_ms=round((time.monotonic() - started) * 1000),
                watermark_before=watermark,
                watermark_after=watermark,
            )
        return StepAttempt(
            step=step.name,
            at=at,
            ok=True,
            error="",
            duration_ms=round((time.monotonic() - started) * 1000),
            watermark_before=watermark,
            watermark_after=new_watermark,
        )
