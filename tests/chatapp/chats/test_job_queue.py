"""The web worker's side of the durable queue (chatapp/chats/job_queue.py, docs/memory.md §10 "Where jobs run"):
what a schedule writes to Procrastinate's queue, coalescing, idle batching, bringing a job forward, waiting, and the
status the inspector shows. PostgreSQL only (the queue lives there); the job workers are tested live in
tests/production/test_job_workers.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.cache import cache
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(db_connections_closed: None) -> Any:
    if connection.vendor != "postgresql":
        pytest.skip("the durable queue needs PostgreSQL (DATABASE_URL=postgres://…)")
    from chatapp.chats.job_queue import DurableJobQueue

    cache.clear()
    return DurableJobQueue(debounce_seconds=0.2, idle_seconds=600, batch_turns=3)


def jobs(memory_key: str) -> list[tuple[str, float]]:
    """``(status, seconds from now until it may start)`` of the conversation's jobs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT status, extract(epoch FROM scheduled_at - now()) FROM procrastinate_jobs WHERE queueing_lock = %s "
            "OR lock = %s ORDER BY id",
            [memory_key, memory_key],
        )
        return [(status, float(delay)) for status, delay in cursor.fetchall()]


async def scheduled(queue: Any, memory_key: str, *, idle: bool = False) -> None:
    queue.schedule(memory_key, idle=idle)
    await asyncio.gather(*queue._deferring)


async def test_an_urgent_job_waits_the_debounce_and_later_schedules_coalesce_into_it(queue):
    for _ in range(3):
        await scheduled(queue, "41")
    (status, delay), *more = await sync_to_async(jobs)("41")
    assert status == "todo" and 0 < delay <= 0.2 and more == []
    assert await sync_to_async(queue.activity)("41") == "queued"
    assert await sync_to_async(queue.activity)("42") is None


async def test_an_idle_job_waits_for_idleness_until_an_urgent_schedule_brings_it_forward(queue):
    await scheduled(queue, "43", idle=True)
    [(_, delay)] = await sync_to_async(jobs)("43")
    assert delay > 500 and await sync_to_async(queue.activity)("43") == "batched"
    await scheduled(queue, "43")  # urgent: the waiting job starts after the debounce instead
    [(_, delay)] = await sync_to_async(jobs)("43")
    assert delay <= 0.2 and await sync_to_async(queue.activity)("43") == "queued"


async def test_the_batch_turns_th_idle_schedule_starts_the_job(queue):
    await scheduled(queue, "44", idle=True)
    await scheduled(queue, "44", idle=True)
    assert (await sync_to_async(jobs)("44"))[0][1] > 500
    await scheduled(queue, "44", idle=True)  # the third of a batch of 3
    [(_, delay)] = await sync_to_async(jobs)("44")
    assert delay <= 0.2


async def test_wait_brings_the_job_forward_and_returns_once_no_job_is_open(queue):
    await scheduled(queue, "45", idle=True)
    assert await queue.wait("45", 0.3) is False  # nobody runs it here: the deadline passes
    [(_, delay)] = await sync_to_async(jobs)("45")
    assert delay <= 0.2  # a request needed it: brought forward for the job workers

    def finish() -> None:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE procrastinate_jobs SET status = 'succeeded' WHERE queueing_lock = '45'")

    async def finished_soon() -> None:
        await asyncio.sleep(0.2)
        await sync_to_async(finish)()

    helper = asyncio.create_task(finished_soon())
    assert await queue.wait("45", 5) is True
    await helper
    assert await sync_to_async(queue.activity)("45") is None


async def test_the_engine_queues_instead_of_running_when_it_has_a_queue(queue, settings):
    from chatapp.chats.memory import durable_job_queue, memory_engine

    settings.MEMORY_JOB_QUEUE = "procrastinate"
    settings.MEMORY_JOB_DEBOUNCE_MS = 200
    durable_job_queue.cache_clear()
    try:
        engine = memory_engine()
        assert engine.queue is durable_job_queue()
        engine.schedule("46")
        await asyncio.gather(*durable_job_queue()._deferring)
        assert [status for status, _ in await sync_to_async(jobs)("46")] == ["todo"]
        assert not engine.jobs().busy("46")  # nothing runs in this process
        assert await sync_to_async(engine.job_activity)("46") == "queued"
    finally:
        durable_job_queue.cache_clear()
