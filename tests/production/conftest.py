"""The production shape, live: Daphne workers as subprocesses on the test database and Redis.

Each worker is ``python -m chatapp.serve`` (Daphne, as ``make run`` starts it) on a free
127.0.0.1 port (it binds port 0 and logs the port it got), on the test run's own database (the SQLite test file, or the PostgreSQL test database)
and on Redis (``REDIS_URL``) under a channel-layer key prefix of its own, so concurrent runs
sharing one Redis never hear each other. The offline engine answers; ``start_worker(**env)``
adds variables (``OFFLINE_DELAY``, ``CHAT_TURN_LEASE_SECONDS`` ...). Browsers are played by the
``websockets`` client, sending the owner's session cookie and the worker's own Origin.

Tests on Redis are skipped, with a message, without ``REDIS_URL`` (and the two-worker test also
without a PostgreSQL ``DATABASE_URL``): CI's second leg runs them. ``start_single_worker`` runs
one worker on the in-memory channel layer, on either leg.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection

from chatapp.llm.offline.transport import OFFLINE_MODEL
from tests.chatapp.conftest import Visitor, db_connections_closed, visitor_make
from tests.daphne_process import DaphneServer, daphne_start, server_environment

__all__ = ["db_connections_closed"]  # a fixture of the chat tests, used here too

# A live worker (``url`` like ``http://127.0.0.1:PORT``, ``ws_url``, ``log``, ``stop()``, ``kill()``).
Worker = DaphneServer


def redis_url() -> str:
    """``REDIS_URL``; skips the test without it."""
    url = os.environ.get("REDIS_URL", "").strip()
    if not url:
        pytest.skip("REDIS_URL is not set: this test needs Redis (e.g. REDIS_URL=redis://127.0.0.1:6379/0)")
    return url


def postgres_required() -> None:
    """Skips the test unless the test database is PostgreSQL (``DATABASE_URL``)."""
    if connection.vendor != "postgresql":
        pytest.skip("DATABASE_URL is not a PostgreSQL URL: this test needs PostgreSQL shared by two workers")


def database_environment() -> dict[str, str]:
    """Variables that put a worker on this test run's database (the test name, not the real one)."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return {"SQLITE_PATH": str(settings["NAME"])}
    if connection.vendor != "postgresql":
        pytest.skip(f"live workers need SQLite or PostgreSQL, not {connection.vendor}")
    user = quote(settings.get("USER") or "", safe="")
    password = quote(settings.get("PASSWORD") or "", safe="")
    credentials = f"{user}:{password}@" if password else f"{user}@" if user else ""
    host = settings.get("HOST") or "127.0.0.1"
    port = settings.get("PORT") or 5432
    return {"DATABASE_URL": f"postgres://{credentials}{host}:{port}/{settings['NAME']}"}


@pytest.fixture
def start_worker(transactional_db: None) -> Iterator[Callable[..., Worker]]:
    """``start_worker(**env)``: a new live worker on this test's database and Redis, sharing the
    test's channel-layer prefix with its other workers; all are stopped before the database is
    flushed. Skips without ``REDIS_URL``."""
    yield from _workers({"REDIS_URL": redis_url(), "CHANNEL_LAYER_PREFIX": f"test{uuid.uuid4().hex[:12]}"})


@pytest.fixture
def start_single_worker(transactional_db: None) -> Iterator[Callable[..., Worker]]:
    """``start_single_worker(**env)``: a live worker on this test's database with the in-memory
    channel layer (the embedded default's shape; no Redis needed), stopped before the database is
    flushed."""
    yield from _workers({})


def _workers(shape: dict[str, str]) -> Iterator[Callable[..., Worker]]:
    base = server_environment({**shape, "LLM_MODEL": OFFLINE_MODEL, **database_environment()})
    workers: list[Worker] = []

    def start(**extra: str) -> Worker:
        worker = daphne_start({**base, **extra})
        workers.append(worker)
        return worker

    yield start
    for number, worker in enumerate(workers, start=1):
        worker.stop()
        # Shown by pytest only when the test failed.
        print(f"--- worker {number} ({worker.url}), last lines of its output:\n" + "".join(worker.log[-40:]))


@pytest.fixture
def owner(transactional_db: None) -> Visitor:
    """A logged-in visitor whose browser the sockets play."""
    return visitor_make()


@asynccontextmanager
async def socket_open(worker: Worker, path: str, cookie: str) -> AsyncIterator[Any]:
    """A WebSocket on ``worker`` at ``path`` as the browser with ``cookie`` would open it (the
    worker's own Origin); closed on exit."""
    from websockets.asyncio.client import connect

    async with connect(
        worker.ws_url + path,
        origin=worker.url,  # type: ignore[arg-type]  # websockets' Origin is a NewType of str
        additional_headers={"Cookie": cookie},
        open_timeout=20,
        ping_interval=None,
        close_timeout=2,
    ) as socket:
        yield socket


async def receive_json(socket: Any) -> dict[str, Any]:
    """The next event of ``socket``, decoded (bound the wait with ``asyncio.timeout``)."""
    event = json.loads(await socket.recv())
    assert isinstance(event, dict)
    return event


async def receive_until(socket: Any, predicate: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Every event up to and including the first that satisfies ``predicate`` (bound the wait
    with ``asyncio.timeout``)."""
    events = []
    while True:
        events.append(await receive_json(socket))
        if predicate(events[-1]):
            return events
