"""ORM work of sockets and turns run from async code on ``settings.DB_THREADS`` threads, each with its own connection:
channels' ``database_sync_to_async`` has one thread per process under Daphne, where every handshake, send and turn
queued behind one another's queries. For self-contained units (one service or selector call); a transaction
spanning calls keeps asgiref's thread-sensitive ``sync_to_async``."""

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
    """``size`` single-thread executors, each call to the least loaded; unlike one shared pool, every thread can be
    reached on its own (:meth:`run_everywhere`), e.g. to close its connection."""

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
        """Run ``fn`` once on every thread and wait (``timeout`` seconds each); re-raises the first exception."""
        futures = [thread.submit(fn) for thread in self._threads]
        for future in futures:
            future.result(timeout=timeout)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for thread in self._threads:
            thread.shutdown(wait=wait, cancel_futures=cancel_futures)


class _OrmSyncToAsync(SyncToAsync[P, R]):
    """``SyncToAsync`` closing obsolete or broken connections before and after the call, like channels'
    ``DatabaseSyncToAsync``, but through Django's own function: channels' test communicators swap channels' for a
    no-op while they wait, and concurrent waits can leave the no-op behind."""

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
    """``func`` as a coroutine function run on ``executor`` (default :func:`orm_executor`), with channels' connection
    handling; cancelling the caller waits for ``func`` to finish (a thread cannot be interrupted)."""
    return _OrmSyncToAsync(func, thread_sensitive=False, executor=cast(Any, executor or orm_executor()))


def orm_connections_close() -> None:
    """Close every ORM thread's database connection (tests, shutdown); synchronous."""
    if _executor is not None:
        _executor.run_everywhere(connections.close_all)
