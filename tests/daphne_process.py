"""Daphne as a subprocess on a free 127.0.0.1 port, started as ``make run`` starts it
(``python -m chatapp.serve``, Daphne's command line): the one start-up shared by the browser tests
(``tests/browser``), the live-worker tests (``tests/production``) and the load benchmark
(``bench/ws_load.py``). No pytest here, so the benchmark can import it.

Daphne binds port 0 and logs the port it got (``Listening on TCP address 127.0.0.1:PORT``); a
thread drains its output (so a full pipe never blocks it) into :attr:`DaphneServer.log` and
:func:`daphne_start` returns once that line came. :func:`server_environment` builds the
environment of a server pinned to one shape: this process's variables without those that would
point it elsewhere (:data:`FOREIGN_VARIABLES`), plus the settings every test server uses.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Seconds a server may take to listen (a loaded two-core machine imports Django slowly).
STARTUP_SECONDS = 60
LISTENING = re.compile(r"Listening on TCP address 127\.0\.0\.1:(\d+)")
# Variables that would point a server away from the offline engine and the shape asked for
# (a caller sets again those of its shape: DATABASE_URL, REDIS_URL, SQLITE_PATH ...).
FOREIGN_VARIABLES = (
    "DATABASE_URL",
    "REDIS_URL",
    "SQLITE_PATH",
    "CHANNEL_LAYER_PREFIX",
    "LLM_BASE_URL",
    "SUMMARY_BASE_URL",
    "FAILOVER_BASE_URL",
    "FAILOVER_MODEL",
    "LLM_MODEL",
    "SUMMARY_MODEL",
    "LLM_CONTEXT_WINDOW",
    "OFFLINE_DELAY",
    "OFFLINE_FAIL_SUMMARY",
    "OFFLINE_FAIL_CHAT",
)


def server_environment(settings: dict[str, str], *, keep: Iterable[str] = ()) -> dict[str, str]:
    """This process's environment without :data:`FOREIGN_VARIABLES` (but those in ``keep``), with
    the settings of every test server (``chatapp.settings``, hosts 127.0.0.1 and localhost, no
    debug, unbuffered output), then ``settings``."""
    kept = set(keep)
    env = {key: value for key, value in os.environ.items() if key not in FOREIGN_VARIABLES or key in kept}
    env.update(
        DJANGO_SETTINGS_MODULE="chatapp.settings",
        DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
        DJANGO_DEBUG="false",
        PYTHONUNBUFFERED="1",
        # Every test shares one address and reuses owners: limits only where a test sets them.
        RATE_LIMIT_SEND_OWNER="off",
        RATE_LIMIT_SEND_ADDRESS="off",
        RATE_LIMIT_UPLOAD_OWNER="off",
        RATE_LIMIT_UPLOAD_ADDRESS="off",
        KB_EDITORS="anyone",
    )
    env.update(settings)
    return env


@dataclass
class DaphneServer:
    """A running Daphne subprocess: the ``port`` it listens on, ``log`` its output (at most
    ``log_limit`` lines kept, the newest)."""

    process: subprocess.Popen[str]
    port: int = 0
    log: list[str] = field(default_factory=list)
    log_limit: int = 100_000

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        """``ws://127.0.0.1:PORT``."""
        return f"ws://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Terminate (SIGTERM, then SIGKILL after 10 s) and wait for the process."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL: the server dies at once, as in a crash (no cleanup runs)."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)


def daphne_start(
    env: dict[str, str], app: str = "chatapp.asgi:application", *, log_limit: int = 100_000
) -> DaphneServer:
    """Start ``python -m chatapp.serve app`` (working directory: the repository) with ``env`` on a free 127.0.0.1
    port; returns once it listens. Raises RuntimeError with its output when it does not within
    :data:`STARTUP_SECONDS` (or exits first)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "chatapp.serve", "-b", "127.0.0.1", "-p", "0", app],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = DaphneServer(process=process, log_limit=log_limit)
    listening = threading.Event()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            server.log.append(line)
            if len(server.log) > server.log_limit:  # the newest lines are kept
                del server.log[: len(server.log) - server.log_limit]
            match = LISTENING.search(line)
            if match and not listening.is_set():
                server.port = int(match.group(1))
                listening.set()
        listening.set()  # the process ended: stop waiting

    threading.Thread(target=drain, daemon=True).start()
    if not listening.wait(timeout=STARTUP_SECONDS) or not server.port:
        server.stop()
        raise RuntimeError(f"Daphne ({app}) did not start:\n" + "".join(server.log))
    return server


class JobWorker:
    """A ``manage.py memory_worker`` subprocess (a job worker of the durable queue, docs/deploy.md) and the lines it
    printed; ``cpu_at_death`` keeps its CPU seconds once killed."""

    def __init__(self, env: dict[str, str], *, stalled_after: float = 10.0) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "memory_worker", "--stalled-after", str(stalled_after)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.log: list[str] = []
        self.cpu_at_death: float | None = None
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.log.append(line)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.log)

    def kill(self, cpu_seconds: float | None = None) -> None:
        """SIGKILL, as a crash or the OOM killer would; ``cpu_seconds`` (read just before) is kept."""
        self.cpu_at_death = cpu_seconds
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
