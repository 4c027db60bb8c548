"""ORM calls from async code on ``DB_THREADS`` threads with a connection each (channels' one thread queued every
socket behind one another); for one service or selector call, not a transaction spanning calls."""

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
    """``size`` single-thread executors, each call to the least loaded, every thread reachable (:meth:`run_everywhere`)."""

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
    """Closes old connections around the call with Django's own function: channels' test communicators swap theirs
    for a no-op while they wait, and concurrent waits can leave it behind."""

    def thread_handler(self, loop: Any, *args: Any, **kwargs: Any) -> Any:
        db.close_old_connections()
        try:
            return super().thread_handler(loop, *args, **kwargs)
        finally:
            db.close_old_connections()


_executor: OrmExecutor | None = None
_executor_lock = threading.Lock()


def orm_executor() -> OrmExecutor:
    global _executor
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                _executor = OrmExecutor(settings.DB_THREADS)
    return _executor


def orm_async(func: Callable[P, R], *, executor: OrmExecutor | None = None) -> Callable[P, Awaitable[R]]:
    """``func`` as a coroutine function on the ORM threads; cancelling the caller waits for ``func`` to finish."""
    return _OrmSyncToAsync(func, thread_sensitive=False, executor=cast(Any, executor or orm_executor()))


def orm_connections_close() -> None:
    """Close every ORM thread's database connection (tests, shutdown); synchronous."""
    if _executor is not None:
        _executor.run_everywhere(connections.close_all)
