"""Browser tests: Playwright driving the system Chromium (headless) against a real Daphne server.

Each server is a subprocess on a free 127.0.0.1 port (Daphne binds port 0 and logs the port it
got) with its own file-backed SQLite database, copied from one database migrated once per test
run (with the demo knowledge base). The embedded default is forced whatever the environment says
(no DATABASE_URL, REDIS_URL or LLM endpoint), so the offline engine answers. Waits are on server
log lines and DOM state, never on the clock.

Without ``/usr/bin/chromium`` (Debian's ``chromium`` package) every browser test is skipped.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.daphne_process import REPO, DaphneServer, daphne_start
from tests.daphne_process import server_environment as daphne_environment

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# The longest wait for any page state (milliseconds).
WAIT_MS = 30_000
_server_numbers = itertools.count(1)


def server_environment(database: Path, extra: dict[str, str]) -> dict[str, str]:
    """The environment of a test server: the embedded default on ``database``, plus ``extra``."""
    return daphne_environment({"SQLITE_PATH": str(database), **extra})


@pytest.fixture(scope="session")
def chromium_executable() -> Path:
    """The system Chromium; skips the browser tests when it is not installed."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements-dev.txt)")
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium package to run the browser tests")
    return CHROMIUM


@pytest.fixture(scope="session")
def migrated_database(chromium_executable: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file with every migration applied and the demo knowledge base loaded."""
    database = tmp_path_factory.mktemp("browser-db") / "template.sqlite3"
    env = server_environment(database, {})
    for command in (["migrate", "--noinput", "-v0"], ["load_demo_kb"]):
        subprocess.run(
            [sys.executable, "manage.py", *command], cwd=REPO, env=env, check=True, capture_output=True, timeout=120
        )
    return database


# A running server: ``url`` like ``http://127.0.0.1:PORT``, ``log`` its output, ``stop()``.
Server = DaphneServer


def server_start(database: Path, extra: dict[str, str]) -> Server:
    """Start Daphne on a free port with its own copy of ``database``; returns once it listens."""
    own = database.with_name(f"server-{next(_server_numbers)}.sqlite3")
    shutil.copyfile(database, own)
    return daphne_start(server_environment(own, extra))


@pytest.fixture(scope="session")
def start_server(migrated_database: Path) -> Iterator[Callable[..., Server]]:
    """``start_server(**environment)``: a new server with extra environment variables; every
    server started is stopped at the end of the test run."""
    servers: list[Server] = []

    def start(**extra: str) -> Server:
        server = server_start(migrated_database, extra)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def daphne_server(start_server: Callable[..., Server]) -> Server:
    """The embedded default: offline engine, summaries working."""
    return start_server()


# Tests of compression itself run at half the offline engine's window, so that a few questions cross the trigger.
SMALL_WINDOW = {"LLM_CONTEXT_WINDOW": "2048"}


@pytest.fixture(scope="session")
def small_window_server(start_server: Callable[..., Server]) -> Server:
    """The embedded default with a 2,048-token window (:data:`SMALL_WINDOW`)."""
    return start_server(**SMALL_WINDOW)


@pytest.fixture(scope="module")
def browser(chromium_executable: Path) -> Iterator[Browser]:
    """Chromium, for one test module: Playwright's sync API marks an asyncio loop as running in
    this thread while it is open, which Django's and pytest-asyncio's later tests must not see."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(chromium_executable), args=CHROMIUM_ARGS, headless=True
        )
        yield browser
        browser.close()


@pytest.fixture
def new_context(browser: Browser) -> Iterator[Callable[..., BrowserContext]]:
    """``new_context(**options)``: a fresh browser context (a new visitor: no cookies), closed at
    the end of the test. Playwright waits at most ``WAIT_MS`` for any state (actions and
    ``expect`` alike): room for a loaded two-core CI machine."""
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    contexts: list[BrowserContext] = []

    def make(**options: Any) -> BrowserContext:
        context = browser.new_context(**options)
        context.set_default_timeout(WAIT_MS)
        contexts.append(context)
        return context

    yield make
    for context in contexts:
        context.close()
