"""ORM work of sockets and turns, run from async code on a bounded set of threads.

channels' ``database_sync_to_async`` runs synchronous code in asgiref's thread-sensitive mode:
under Daphne, with no outer synchronous thread, that is one thread for the whole process, so
every handshake, send and turn of a worker queued behind one another's queries (handshakes
reached a p99 of 4.1 s under load). :func:`orm_async` runs a function on one of
``settings.DB_THREADS`` threads instead (the least busy one), with the same connection handling
as channels: connections older than ``CONN_MAX_AGE`` or broken (``CONN_HEALTH_CHECKS``) are
closed before and after the call, and a kept one is reused by the next call on that thread.
Each thread has its own connection, so a worker holds at most ``DB_THREADS`` connections for
this work.

Use it for self-contained units of ORM work (one service or selector call: its transaction
opens and ends inside). Code that must run on the thread of the caller's other synchronous work
(a transaction spanning calls) keeps asgiref's thread-sensitive ``sync_to_async``.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast

from asgiref.sync import SyncToAsync
from django import db
from django.conf import settings
from django.db import connections

P = ParamSpec("P")
R = TypeVar("R")


class OrmExecutor(concurrent.futures.Executor):
    """``size`` single-thread executors; each call goes to the one with the fewest calls queued
    or running. Unlike one shared pool, every thread can be reached on its own
    (:meth:`run_everywhere`), e.g. to close its connection."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"an ORM executor needs at least one thread, not {size}")
        self._threads = [
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"orm-{index}")
            for index in range(size)
        ]
        self._load = [0] * size
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """How many threads (hence at most how many database connections) the executor uses."""
        return len(self._threads)

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[R]:
        with self._lock:
            index = min(range(len(self._load)), key=self._load.__getitem__)
            self._load[index] += 1
        try:
            future = self._threads[index].submit(fn, *args, **kwargs)
        except BaseException:
            self._release(index)
            raise
        future.add_done_callback(lambda _: self._release(index))
        return future

    def _release(self, index: int) -> None:
        with self._lock:
            self._load[index] -= 1

    def run_everywhere(self, fn: Callable[[], object], timeout: float = 30.0) -> None:
        """Run ``fn`` once on every thread and wait (at most ``timeout`` seconds for each);
        re-raises the first exception."""
        futures = [thread.submit(fn) for thread in self._threads]
        for future in futures:
            future.result(timeout=timeout)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for thread in self._threads:
            thread.shutdown(wait=wait, cancel_futures=cancel_futures)


class _OrmSyncToAsync(SyncToAsync[P, R]):
    """``SyncToAsync`` closing obsolete or broken connections of its thread before and after the
    call, as channels' ``DatabaseSyncToAsync`` does; it calls Django's function itself, which
    channels' test communicators never replace (they swap channels' reference for a no-op while
    they wait, and concurrent waits can leave the no-op behind for the rest of a test run)."""

    def thread_handler(self, loop: Any, *args: Any, **kwargs: Any) -> Any:
        db.close_old_connections()
        try:
            return super().thread_handler(loop, *args, **kwargs)
        finally:
            db.close_old_connections()


_executor: OrmExecutor | None = None
_executor_lock = threading.Lock()


def orm_executor() -> OrmExecutor:
    """The process's ORM executor, created with ``settings.DB_THREADS`` threads on first use."""
    global _executor
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                _executor = OrmExecutor(settings.DB_THREADS)
    return _executor


def orm_async(func: Callable[P, R], *, executor: OrmExecutor | None = None) -> Callable[P, Awaitable[R]]:
    """``func`` (synchronous ORM code) as a coroutine function that runs it on ``executor``
    (default: the process's, :func:`orm_executor`), closing obsolete or broken connections
    before and after, like channels' ``database_sync_to_async``. Exceptions of ``func``
    propagate; cancelling the caller waits for ``func`` to finish (a thread cannot be
    interrupted)."""
    return _OrmSyncToAsync(func, thread_sensitive=False, executor=cast(Any, executor or orm_executor()))


def orm_connections_close() -> None:
    """Close the database connections of every ORM thread (tests before dropping their database,
    a graceful shutdown). Synchronous: call it from synchronous code, or through ``sync_to_async``."""
    if _executor is not None:
        _executor.run_everywhere(connections.close_all)
