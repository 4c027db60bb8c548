"""Memory jobs on the durable queue (``MEMORY_JOB_QUEUE=procrastinate``, docs/deploy.md), live: a web worker only
queues, ``manage.py memory_worker`` processes run the jobs, and a job whose worker is killed mid-way is sent back
to the queue and finished by another worker. PostgreSQL and Redis (CI's second leg)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from chatapp.chats.memory import memory_key_of
from memory.models import MemoryItem
from tests.chatapp.conftest import chat_session_make
from tests.daphne_process import JobWorker, server_environment
from tests.production.conftest import (
    Worker,
    database_environment,
    postgres_required,
    receive_until,
    redis_url,
    socket_open,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("db_connections_closed")]

REPO = Path(__file__).resolve().parents[2]
QUEUE = {"MEMORY_JOB_QUEUE": "procrastinate", "MEMORY_JOB_DEBOUNCE_MS": "0", "MEMORY_JOB_LEASE_SECONDS": "5"}


@pytest.fixture
def queue_shape(start_worker: Callable[..., Worker]) -> Iterator[tuple[Worker, Callable[..., JobWorker]]]:
    """A web worker queueing memory jobs, and ``start_job_worker(**env)`` (stopped at the end, output shown when the
    test fails). Skips without PostgreSQL and Redis."""
    postgres_required()
    web = start_worker(**QUEUE)
    base = server_environment({"REDIS_URL": redis_url(), **database_environment(), **QUEUE})
    workers: list[JobWorker] = []

    def start_job_worker(**extra: str) -> JobWorker:
        worker = JobWorker({**base, **extra}, stalled_after=3)
        workers.append(worker)
        return worker

    yield web, start_job_worker
    for number, worker in enumerate(workers, start=1):
        worker.stop()
        print(f"--- job worker {number}, last lines:\n" + "".join(worker.log[-30:]))


def open_jobs(memory_key: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE lock = %s AND status IN ('todo', 'doing')", [memory_key]
        )
        return int(cursor.fetchone()[0])


async def until(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not await sync_to_async(check)():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        await asyncio.sleep(0.2)


async def turn(web: Worker, owner, session_id: int, text: str) -> None:
    async with socket_open(web, f"/ws/chat/{session_id}/", owner.cookie) as socket:
        await socket.send(
            json.dumps({"type": "chat.send", "client_message_id": f"m{time.monotonic_ns()}", "text": text})
        )
        async with asyncio.timeout(30):
            await receive_until(socket, lambda event: event["type"] == "chat.done")


async def test_the_web_worker_only_queues_and_a_job_worker_indexes(queue_shape, owner):
    web, start_job_worker = queue_shape
    session = await sync_to_async(chat_session_make)(owner.owner)
    key = memory_key_of(session.pk)
    await turn(web, owner, session.pk, "My booking reference is QX-4417, please keep it.")
    await until(lambda: open_jobs(key) == 1, 10, "the turn's job waits in the queue")
    assert not await MemoryItem.objects.filter(memory_key=key).aexists()  # nothing ran in the web worker

    worker = start_job_worker()
    await until(lambda: open_jobs(key) == 0 and MemoryItem.objects.filter(memory_key=key).exists(), 60, "indexed")
    assert worker.said("memory.job") and worker.said("Success")


async def test_a_job_a_killed_job_worker_held_is_redelivered_and_finishes(queue_shape, owner):
    web, start_job_worker = queue_shape
    # The first worker's key-fact extraction waits on a summarizer that answers after a minute: killed meanwhile.
    slow = start_job_worker(OFFLINE_SUMMARY_DELAY="60")
    session = await sync_to_async(chat_session_make)(owner.owner)
    key = memory_key_of(session.pk)
    await turn(web, owner, session.pk, "I moved to 48 Harbour Road, Bristol. My order number is W2378156.")
    await until(lambda: slow.said("Starting job"), 30, "the first worker takes the job")
    slow.kill()
    assert await sync_to_async(open_jobs)(key) == 1 and not await MemoryItem.objects.filter(memory_key=key).aexists()

    other = start_job_worker()
    await until(lambda: open_jobs(key) == 0 and MemoryItem.objects.filter(memory_key=key).exists(), 90, "finished")
    assert other.said("goes back to the queue")


async def test_a_worker_stopped_gracefully_finishes_its_job_and_no_other_worker_runs_it(queue_shape, owner):
    web, start_job_worker = queue_shape
    slow = start_job_worker(OFFLINE_SUMMARY_DELAY="8")
    session = await sync_to_async(chat_session_make)(owner.owner)
    key = memory_key_of(session.pk)
    await turn(web, owner, session.pk, "My order number is W2378156 and I live in Bristol.")
    await until(lambda: slow.said("Starting job"), 30, "the first worker takes the job")
    other = start_job_worker()
    slow.process.terminate()  # a deploy: SIGTERM, the job runs on to its end (longer than --stalled-after)
    await until(lambda: slow.process.poll() is not None, 60, "the first worker finishes its job and stops")
    await until(lambda: open_jobs(key) == 0 and MemoryItem.objects.filter(memory_key=key).exists(), 30, "finished")
    assert slow.said("Success")
    assert not any(worker.said("of a stopped worker") for worker in (slow, other))
    assert not other.said("Starting job")
