"""The ORM threads (chatapp/orm_threads.py): async ORM work runs on several threads, not one per
process, each thread keeps its database connection between calls, and a connection that broke
is replaced rather than used."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections

from chatapp.orm_threads import OrmExecutor, orm_async, orm_connections_close

pytestmark = pytest.mark.usefixtures("db_connections_closed")


def on_executor(executor: OrmExecutor, func):
    return orm_async(func, executor=executor)


async def test_orm_work_runs_on_the_orm_threads():
    name = await orm_async(lambda: threading.current_thread().name)()

    assert name.startswith("orm-")


async def test_a_slow_call_does_not_hold_up_the_next_one():
    executor = OrmExecutor(2)
    release = threading.Event()
    started = threading.Event()

    def wait() -> bool:
        started.set()
        return release.wait(10)

    try:
        slow = asyncio.ensure_future(on_executor(executor, wait)())
        async with asyncio.timeout(5):
            assert await asyncio.to_thread(started.wait, 5)
            # The least busy thread takes the second call: it returns while the first still waits.
            name = await on_executor(executor, lambda: threading.current_thread().name)()
        assert name.startswith("orm-1") and not slow.done()
        release.set()
        assert await slow is True
    finally:
        release.set()
        executor.shutdown()


@pytest.mark.django_db(transaction=True)
async def test_a_thread_keeps_its_connection_between_calls():
    executor = OrmExecutor(1)

    def backend() -> object:
        connection.ensure_connection()
        return connection.connection

    try:
        first = await on_executor(executor, backend)()
        second = await on_executor(executor, backend)()
        assert first is second  # one connection, not one per call (CONN_MAX_AGE)
        executor.run_everywhere(connections.close_all)
        assert await on_executor(executor, lambda: connection.connection)() is None
    finally:
        executor.run_everywhere(connections.close_all)
        executor.shutdown()


@pytest.mark.django_db(transaction=True)
async def test_a_connection_the_database_dropped_is_replaced_not_used():
    if connection.vendor != "postgresql":
        pytest.skip("a file-backed SQLite connection cannot be dropped by the database; PostgreSQL only")
    executor = OrmExecutor(1)

    def backend_pid() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return int(cursor.fetchone()[0])

    def terminate(pid: int) -> bool:
        """End backend ``pid`` and wait (10 s at most) until PostgreSQL no longer lists it."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            for _ in range(200):
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
                if not cursor.fetchone()[0]:
                    return True
                time.sleep(0.05)
        return False

    try:
        dropped = await on_executor(executor, backend_pid)()
        assert await sync_to_async(terminate)(dropped)
        # The health check on reuse notices the dead connection and opens a new one.
        assert await on_executor(executor, backend_pid)() != dropped
    finally:
        executor.run_everywhere(connections.close_all)
        executor.shutdown()


def test_closing_reaches_every_thread():
    orm_connections_close()  # never fails, also before any ORM work

    executor = OrmExecutor(3)
    seen: set[str] = set()
    lock = threading.Lock()
    barrier = threading.Barrier(3)

    def mark() -> None:
        with lock:
            seen.add(threading.current_thread().name)
        barrier.wait(5)

    try:
        executor.run_everywhere(mark)
        assert len(seen) == 3
    finally:
        executor.shutdown()
