"""Memory jobs on a durable queue (``MEMORY_JOB_QUEUE=procrastinate``, docs/memory.md §10 "Where jobs run"):
Procrastinate on PostgreSQL. Web workers only queue; ``manage.py memory_worker`` processes run the jobs. A job's
``queueing_lock`` (the memory key) keeps at most one waiting per conversation, its ``lock`` one running."""

from __future__ import annotations

import asyncio
import logging
import time

from django.core.cache import cache
from django.db import connection
from procrastinate import JobContext, RetryStrategy
from procrastinate import exceptions as procrastinate_exceptions
from procrastinate.contrib.django import app

from chatapp.orm_threads import orm_async

logger = logging.getLogger(__name__)

TASK = "memory.job"
QUEUE = "memory"
# How often :meth:`DurableJobQueue.wait` looks at the queue, in seconds.
WAIT_POLL_SECONDS = 0.05


def _idle_key(memory_key: str) -> str:
    return f"memory-job:idle:{memory_key}"


class LeaseHeld(Exception):
    """Another process held the conversation's job lease throughout (a worker that stopped, until its lease ran out)."""


# The queue's jobs this process is running: a job worker never sends its own jobs back to the queue.
running_here: set[int] = set()


@app.task(
    name=TASK,
    queue=QUEUE,
    pass_context=True,
    retry=RetryStrategy(max_attempts=10, wait=5, retry_exceptions={LeaseHeld}),
)
async def memory_job(context: JobContext, memory_key: str) -> None:
    """Run the conversation's memory job to completion in this job worker: the same steps, watermarks and
    compare-and-set as in process; a failed step is recorded and retried by the next job, as there."""
    from chatapp.chats.memory import memory_engine

    job_id = context.job.id
    if job_id is not None:
        running_here.add(job_id)
    try:
        await cache.adelete(_idle_key(memory_key))
        run = await memory_engine().run_jobs(memory_key)
    finally:
        running_here.discard(job_id or 0)
    if run is None:
        raise LeaseHeld(f"the job lease of {memory_key} stayed with another process; retried in 5 s")
    if not run.ok:
        logger.warning("memory job of %s ended with a failed step (recorded in its attempts)", memory_key)


class DurableJobQueue:
    """The durable queue's side in a web worker (:class:`memory.ports.JobQueue`): debounce and idle batching keep
    their meaning (docs/memory.md §10 "When"): urgent jobs start ``debounce_seconds`` after they are queued, idle
    ones after ``idle_seconds`` or at once on the ``batch_turns``-th idle schedule; a request that needs the job
    brings a waiting one forward."""

    def __init__(self, *, debounce_seconds: float, idle_seconds: float, batch_turns: int) -> None:
        self.debounce_seconds = debounce_seconds
        self.idle_seconds = idle_seconds
        self.batch_turns = max(1, batch_turns)
        self._deferring: set[asyncio.Task[None]] = set()

    def schedule(self, memory_key: str, *, idle: bool = False) -> None:
        """Queue the job in the background and return; a failure to queue is logged (the next schedule catches up:
        the steps' watermarks say what is left)."""
        task = asyncio.get_running_loop().create_task(self._defer(memory_key, idle=idle))
        self._deferring.add(task)
        task.add_done_callback(self._deferring.discard)

    async def _defer(self, memory_key: str, *, idle: bool) -> None:
        try:
            urgent = not idle or await self._batch_full(memory_key)
            delay = self.debounce_seconds if urgent else self.idle_seconds
            deferrer = app.configure_task(
                TASK, queue=QUEUE, lock=memory_key, queueing_lock=memory_key, schedule_in={"seconds": delay}
            )
            try:
                await deferrer.defer_async(memory_key=memory_key)
            except procrastinate_exceptions.AlreadyEnqueued:
                if urgent:
                    await self._expedite(memory_key)
        except Exception:
            logger.exception("the memory job of %s could not be queued", memory_key)

    async def _batch_full(self, memory_key: str) -> bool:
        """Count an idle schedule since the job last started; True (and start counting again) on the last of a
        batch."""
        key = _idle_key(memory_key)
        await cache.aadd(key, 0, timeout=3600)
        try:
            count = await cache.aincr(key)
        except ValueError:  # expired in between
            return False
        if count >= self.batch_turns:
            await cache.adelete(key)
            return True
        return False

    async def _expedite(self, memory_key: str) -> None:
        """A job waiting longer than the debounce (an idle one) starts after the debounce instead."""
        await orm_async(_expedite_sql)(memory_key, self.debounce_seconds)

    async def wait(self, memory_key: str, timeout_seconds: float) -> bool:
        """Bring the waiting job forward and wait until no job of the conversation is waiting or running; False at
        the deadline."""
        deadline = time.monotonic() + timeout_seconds
        await self._expedite(memory_key)
        while await orm_async(_jobs_open)(memory_key):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(WAIT_POLL_SECONDS)
        return True

    def activity(self, memory_key: str) -> str | None:
        """``running`` when a job worker has it, ``queued`` when it waits to start within a second, ``batched``
        when it waits for idleness, else None (one query)."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT bool_or(status = 'doing'), bool_or(status = 'todo' AND (scheduled_at IS NULL OR "
                "scheduled_at <= now() + interval '1 second')), bool_or(status = 'todo') FROM procrastinate_jobs "
                "WHERE (lock = %s AND status = 'doing') OR (queueing_lock = %s AND status = 'todo')",
                [memory_key, memory_key],
            )
            running, queued, waiting = cursor.fetchone()
        if running:
            return "running"
        if queued:
            return "queued"
        return "batched" if waiting else None


def _expedite_sql(memory_key: str, debounce_seconds: float) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET scheduled_at = now() + make_interval(secs => %s) "
            "WHERE queueing_lock = %s AND status = 'todo' AND scheduled_at > now() + make_interval(secs => %s)",
            [debounce_seconds, memory_key, debounce_seconds],
        )


def _jobs_open(memory_key: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs "
            "WHERE (lock = %s AND status = 'doing') OR (queueing_lock = %s AND status = 'todo'))",
            [memory_key, memory_key],
        )
        return bool(cursor.fetchone()[0])
