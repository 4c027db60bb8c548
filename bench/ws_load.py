"""Many chat sockets at once against real Daphne servers, next to a bare Channels echo server.

Starts Daphne (a subprocess on a free 127.0.0.1 port) on the embedded default (a temporary
SQLite file, the in-memory channel layer, the offline engine), or with ``--production`` on
PostgreSQL + Redis with two Daphne workers (a fresh database ``<name>_wsload`` beside the one
``DATABASE_URL`` names, default ``postgres://postgres@127.0.0.1:5432/test``; ``REDIS_URL``,
default ``redis://127.0.0.1:6379/0``, under a key prefix of its own). It migrates, loads the
demo knowledge base and stores N anonymous visitors, each with one quick-answer chat, then opens
N sockets from this one asyncio client (spread over the workers), waits until all are open, and
has each send ``--turns`` questions one after another.

Measured: the handshake; time to the first ``chat.delta`` and to ``chat.done`` of each turn
(milliseconds, p50/p99); server CPU (``/proc/<pid>/stat`` of the Daphne processes, plus the
PostgreSQL backends of the database in production mode) per turn, in milliseconds; lost and
duplicated messages, seen by the client (one ``chat.ack``, one ``chat.message`` of the user's
message, one final reply, one ``chat.done``, and the streamed text equal to the stored reply) and
in the database afterwards (every sent message stored exactly once, with exactly one final reply,
status complete). Then the same sockets and turns against ``bench/echo_asgi.py`` on the same
settings and channel layer, each turn sending as many events through the group as a chat turn
did. Everything talks to 127.0.0.1 only, is bounded (``--deadline`` seconds in all) and stops its
servers. The last line (a public interface, CONTRIBUTING.md)::

    ratio_p99_vs_echo=<chat.done p99 / echo p99> lost=<n> duplicated=<m> sockets=<N> cpu_ms_per_turn=<c>

    python bench/ws_load.py [--sockets 200] [--turns 3] [--production] [--profile DIR]

``--profile DIR`` records each chat worker with py-spy (``pip install py-spy``) during the turns
and prints the hottest functions (their share of samples, self and inclusive).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the repository's packages (tests.daphne_process)
    sys.path.insert(0, str(ROOT))

from tests.daphne_process import FOREIGN_VARIABLES, DaphneServer, daphne_start, server_environment  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# Questions the demo knowledge base answers (quick-answer mode retrieves passages for them).
QUESTIONS = (
    "What is the largest file on paid plans?",
    "Which error code means a conflicting copy?",
    "How much storage does the Free plan include?",
    "How long do deleted files stay in the trash?",
    "What are the API rate limits?",
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- servers --------------------------------------------------------------------------------------


Server = DaphneServer  # a Daphne subprocess: ``port``, ``process``, ``log``, ``stop()``


def server_start(app: str, env: dict[str, str]) -> Server:
    """Start ``daphne app`` on a free 127.0.0.1 port (:func:`tests.daphne_process.daphne_start`,
    the last 2,000 lines of output kept); returns once it listens."""
    return daphne_start(env, app, log_limit=2000)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0.0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    # Fields after the command: state is [0]; utime and stime are fields 14 and 15 of the file.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class BackendCpu:
    """CPU of the PostgreSQL backends serving database ``name`` (``pg_stat_activity``), sampled
    every ``interval`` seconds by a thread between :meth:`start` and :meth:`stop`. Backends that
    start and end between two samples are missed, so this is a lower bound."""

    def __init__(self, dsn: str, name: str, interval: float = 0.5) -> None:
        self.dsn, self.name, self.interval = dsn, name, interval
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._sample(baseline=True)
        self._thread.start()

    def stop(self) -> float:
        """Stop sampling; the CPU seconds the backends used meanwhile."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample(baseline=False)
        return sum(self.last[pid] - self.first.get(pid, 0.0) for pid in self.last)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample(baseline=False)

    def _sample(self, *, baseline: bool) -> None:
        import psycopg

        with contextlib.suppress(Exception), psycopg.connect(self.dsn, autocommit=True) as connection:
            pids = [
                row[0]
                for row in connection.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", [self.name]
                )
            ]
            for pid in pids:
                seconds = cpu_seconds(pid)
                if baseline:
                    self.first[pid] = seconds
                self.last[pid] = max(seconds, self.last.get(pid, 0.0))


# --- the database, through Django in this process ------------------------------------------------


def django_setup(env: dict[str, str]) -> None:
    """Configure Django in this process on the servers' database (``env``)."""
    for name in FOREIGN_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(env)
    import django

    django.setup()


def database_prepare(sockets: int) -> list[tuple[str, int]]:
    """Migrate, load the demo knowledge base, and store ``sockets`` anonymous visitors with one
    quick-answer chat each; returns ``(session cookie value, chat session id)`` pairs."""
    from django.contrib.sessions.backends.db import SessionStore
    from django.core.management import call_command
    from django.db import connections

    from chatapp.models import ChatSession

    call_command("migrate", verbosity=0)
    call_command("load_demo_kb", stdout=open(os.devnull, "w"))  # noqa: SIM115 (closed with the process)
    visitors: list[tuple[str, int]] = []
    for index in range(sockets):
        store = SessionStore()
        store.create()
        assert store.session_key is not None
        chat = ChatSession.objects.create(
            owner_session_key=store.session_key, mode=ChatSession.Mode.QUICK_ANSWER, title=f"load {index}"
        )
        visitors.append((store.session_key, chat.pk))
    connections.close_all()
    return visitors


def jobs_settle(pids: list[int], cpu_start: float, deadline: float) -> tuple[float, float]:
    """``(cpu seconds, wall seconds)`` the workers spent after the last turn until they went quiet:
    at least ``MEMORY_JOB_IDLE_SECONDS`` (the memory jobs of chats that went idle start then,
    docs/memory.md §10), then until two half-second windows in a row used under 10 ms of CPU, at
    most until ``deadline`` (monotonic)."""
    from django.conf import settings

    started = time.monotonic()
    time.sleep(min(max(0.0, deadline - started), settings.MEMORY_JOB_IDLE_SECONDS + 0.5))
    quiet, last = 0, sum(cpu_seconds(pid) for pid in pids)
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        now = sum(cpu_seconds(pid) for pid in pids)
        quiet = quiet + 1 if now - last < 0.01 else 0
        last = now
    return last - cpu_start, time.monotonic() - started


def jobs_check(visitors: list[tuple[str, int]]) -> int:
    """How many chats' memory jobs indexed every message (the ``index`` step's watermark is the
    chat's newest message id): the deferred work was done, not skipped."""
    from django.db import connections

    from chatapp.chats.memory import memory_key_of
    from chatapp.models import Message
    from memory.models import MemoryJobState

    done = 0
    for _, chat_id in visitors:
        rows = Message.objects.filter(session_id=chat_id).exclude(origin=Message.Origin.APP)
        newest = rows.order_by("-id").values_list("id", flat=True).first()
        state = MemoryJobState.objects.filter(memory_key=memory_key_of(chat_id)).first()
        if newest is not None and state is not None and (state.watermarks or {}).get("index") == newest:
            done += 1
    connections.close_all()
    return done


def database_check(visitors: list[tuple[str, int]], turns: int) -> tuple[int, int]:
    """``(lost, duplicated)`` as stored: per chat, each sent ``client_message_id`` must be stored
    once, with exactly one final reply of status complete. A message missing or without a
    complete final reply is lost; an extra copy or an extra final reply is duplicated."""
    from django.db import connections
    from django.db.models import Count, Q

    from chatapp.models import Message

    lost = duplicated = 0
    for _, chat_id in visitors:
        users = (
            Message.objects.filter(session_id=chat_id, role=Message.Role.USER)
            .values("client_message_id")
            .annotate(copies=Count("id"))
        )
        copies = {row["client_message_id"]: row["copies"] for row in users}
        finals = dict(
            Message.objects.filter(session_id=chat_id, role=Message.Role.USER)
            .annotate(
                finals=Count(
                    "replies",
                    filter=Q(replies__role=Message.Role.ASSISTANT, replies__tool_calls__isnull=True),
                ),
                complete=Count(
                    "replies",
                    filter=Q(
                        replies__role=Message.Role.ASSISTANT,
                        replies__tool_calls__isnull=True,
                        replies__status=Message.Status.COMPLETE,
                    ),
                ),
            )
            .values_list("client_message_id", "finals")
        )
        completes = dict(
            Message.objects.filter(
                session_id=chat_id,
                role=Message.Role.ASSISTANT,
                tool_calls__isnull=True,
                status=Message.Status.COMPLETE,
            )
            .values("reply_to__client_message_id")
            .annotate(n=Count("id"))
            .values_list("reply_to__client_message_id", "n")
        )
        for turn in range(turns):
            client_id = client_message_id(chat_id, turn)
            stored = copies.get(client_id, 0)
            if stored == 0 or completes.get(client_id, 0) == 0:
                lost += 1
            duplicated += max(0, stored - 1) + max(0, finals.get(client_id, 0) - 1)
        duplicated += sum(
            1 for client_id in copies if client_id not in {client_message_id(chat_id, t) for t in range(turns)}
        )
    connections.close_all()
    return lost, duplicated


def client_message_id(chat_id: int, turn: int) -> str:
    """The ``client_message_id`` the client sends for turn ``turn`` (0-based) of chat ``chat_id``."""
    return f"load-{chat_id}-{turn}"


# --- the client ------------------------------------------------------------------------------------


@dataclass
class TurnResult:
    """What one socket saw of one turn. Times are seconds after the send (None: never came)."""

    first_delta: float | None = None
    done: float | None = None
    events: int = 0
    delta_at: int | None = None
    lost: int = 0
    duplicated: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass
class RunResult:
    """All sockets of one run: handshake seconds, turns, failures, events per turn."""

    handshakes: list[float] = field(default_factory=list)
    turns: list[TurnResult] = field(default_factory=list)
    failed_sockets: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)


class TurnWatch:
    """The events of one chat turn on one socket, checked for loss and duplication."""

    def __init__(self, client_id: str, sent: float) -> None:
        self.client_id = client_id
        self.sent = sent
        self.turn_id: int | None = None
        self.acks = self.user_messages = self.finals = self.dones = 0
        self.streamed = ""
        self.final_text: str | None = None
        self.kinds: list[str] = []  # the event types of this turn, in arrival order (for a report)
        self.result = TurnResult()

    def see(self, event: dict[str, Any], now: float) -> None:
        kind = event.get("type")
        if kind == "chat.ack" and event.get("client_message_id") == self.client_id:
            self.acks += 1
            self.turn_id = event.get("message_id")
            return
        message = event.get("message") if kind == "chat.message" else None
        if isinstance(message, dict) and message.get("client_message_id") == self.client_id:
            self.user_messages += 1
            self.turn_id = self.turn_id or message.get("id")
            self.result.events += 1
            return
        if self.turn_id is None or (event.get("turn_id") != self.turn_id and not message):
            return
        if message is not None:
            if message.get("reply_to") == self.turn_id and message.get("role") == "assistant":
                if not message.get("tool_calls"):
                    self.finals += 1
                    self.final_text = message.get("content") or ""
            else:
                return
        self.result.events += 1
        self.kinds.append(str(kind))
        if kind == "chat.delta":
            self.streamed += str(event.get("text", ""))
            if self.result.first_delta is None:
                self.result.first_delta = now - self.sent
                self.result.delta_at = self.result.events - 1
        elif kind == "chat.done":
            self.dones += 1
            if self.result.done is None:
                self.result.done = now - self.sent

    def finish(self) -> TurnResult:
        counts = {
            "chat.ack": self.acks,
            "user chat.message": self.user_messages,
            "final reply": self.finals,
            "chat.done": self.dones,
        }
        for name, count in counts.items():
            if count != 1:
                self.result.problems.append(f"{name} x{count}")
        self.result.lost = sum(1 for n in counts.values() if n == 0)
        self.result.duplicated = sum(n - 1 for n in counts.values() if n > 1)
        if self.finals and self.final_text is not None and self.streamed != self.final_text:
            self.result.lost += 1  # a streamed piece went missing (or arrived twice)
            self.result.problems.append("streamed text differs from the stored reply")
            at = next(
                (i for i, (a, b) in enumerate(zip(self.streamed, self.final_text, strict=False)) if a != b),
                min(len(self.streamed), len(self.final_text)),
            )
            print(
                f"turn {self.turn_id}: streamed {len(self.streamed)} characters, stored {len(self.final_text)}, "
                f"first difference at {at}; events {', '.join(self.kinds)}",
                file=sys.stderr,
            )
        return self.result


class EchoWatch(TurnWatch):
    """The events of one echo turn: one ``chat.ack``, then ``events`` group events."""

    def see(self, event: dict[str, Any], now: float) -> None:
        kind = event.get("type")
        if kind == "chat.ack" and event.get("client_message_id") == self.client_id:
            self.acks += 1
            return
        if event.get("turn_id") != self.turn_id:
            return
        self.result.events += 1
        if kind == "chat.delta" and self.result.first_delta is None:
            self.result.first_delta = now - self.sent
        elif kind == "chat.done":
            self.dones += 1
            if self.result.done is None:
                self.result.done = now - self.sent

    def finish(self) -> TurnResult:
        self.result.lost = sum(1 for n in (self.acks, self.dones) if n == 0)
        self.result.duplicated = sum(n - 1 for n in (self.acks, self.dones) if n > 1)
        return self.result


@dataclass(frozen=True)
class Plan:
    """What every socket of a run does: ``turns`` turns, each within ``turn_timeout`` seconds;
    ``echo_events``/``echo_delta_at`` shape an echo turn (None: a chat turn)."""

    turns: int
    turn_timeout: float
    echo_events: int | None = None
    echo_delta_at: int = 0


async def socket_run(
    url: str, cookie: str, chat_id: int, plan: Plan, ready: asyncio.Barrier, go: asyncio.Event, run: RunResult
) -> None:
    """One socket: connect, wait for every socket, then send ``plan.turns`` turns one after
    another, each after the previous one's ``chat.done``."""
    from websockets.asyncio.client import connect

    origin = "http://" + urlsplit(url).netloc
    loop = asyncio.get_running_loop()
    started = loop.time()
    watches: list[TurnWatch] = []
    try:
        async with connect(
            url,
            origin=origin,  # type: ignore[arg-type]  # websockets' Origin is a NewType of str
            additional_headers={"Cookie": f"sessionid={cookie}"} if cookie else None,
            open_timeout=plan.turn_timeout,
            ping_interval=None,
            max_size=None,
            close_timeout=2,
        ) as socket:
            run.handshakes.append(loop.time() - started)
            await ready.wait()
            await go.wait()
            for turn in range(plan.turns):
                client_id = client_message_id(chat_id, turn)
                sent = loop.time()
                if plan.echo_events is None:
                    watch = TurnWatch(client_id, sent)
                    frame: dict[str, Any] = {
                        "type": "chat.send",
                        "client_message_id": client_id,
                        "text": QUESTIONS[(chat_id + turn) % len(QUESTIONS)],
                    }
                else:
                    watch = EchoWatch(client_id, sent)
                    watch.turn_id = chat_id * 1000 + turn
                    frame = {
                        "type": "echo",
                        "client_message_id": client_id,
                        "turn_id": watch.turn_id,
                        "events": plan.echo_events,
                        "delta_at": plan.echo_delta_at,
                    }
                watches.append(watch)
                await socket.send(json.dumps(frame))
                async with asyncio.timeout(plan.turn_timeout):
                    while not watch.dones:
                        event = json.loads(await socket.recv())
                        now = loop.time()
                        for seen in watches:
                            seen.see(event, now)
            # Late duplicates of any turn would arrive now.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.3):
                    while True:
                        event = json.loads(await socket.recv())
                        for seen in watches:
                            seen.see(event, loop.time())
    except Exception as exc:  # a socket that fails counts its unfinished turns as lost
        run.errors[type(exc).__name__] += 1
        if not watches:
            run.failed_sockets += 1
            with contextlib.suppress(Exception):
                await ready.wait()
    for watch in watches:
        run.turns.append(watch.finish())
    missing = plan.turns - len(watches)
    run.turns.extend(TurnResult(lost=1) for _ in range(missing))


async def load_run(urls: list[str], visitors: list[tuple[str, int]], plan: Plan, path: str) -> tuple[RunResult, float]:
    """Open one socket per visitor (round-robin over ``urls``), then run the turns; returns the
    result and when (``time.monotonic()``) every socket was open and the turns began."""
    run = RunResult()
    ready = asyncio.Barrier(len(visitors) + 1)
    go = asyncio.Event()
    tasks = [
        asyncio.create_task(
            socket_run(f"{urls[index % len(urls)]}{path.format(chat_id)}", cookie, chat_id, plan, ready, go, run)
        )
        for index, (cookie, chat_id) in enumerate(visitors)
    ]
    await ready.wait()
    began = time.monotonic()
    go.set()
    await asyncio.gather(*tasks)
    return run, began


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (``fraction`` 0..1); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def summary(values: list[float | None]) -> tuple[float, float]:
    """p50 and p99 of the values that came, in milliseconds."""
    came = [v * 1000 for v in values if v is not None]
    return percentile(came, 0.5), percentile(came, 0.99)


# --- profiling ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def profiled(pids: list[int], directory: Path | None, *, gil_only: bool = False) -> Iterator[None]:
    """Record each of ``pids`` with py-spy (raw collapsed stacks) into ``directory`` while the
    block runs; nothing when ``directory`` is None. ``gil_only``: sample only the thread holding
    the GIL (Python CPU; native work done without the GIL, such as SQLite's, is left out)."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    recorders = [
        subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--rate",
                "200",
                *(["--gil"] if gil_only else []),
                "-o",
                str(directory / f"worker-{pid}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid in pids
    ]
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        for recorder in recorders:
            recorder.send_signal(2)  # SIGINT: py-spy writes its output and exits
        for recorder in recorders:
            try:
                recorder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                recorder.kill()


def profile_top(directory: Path, limit: int = 25) -> None:
    """Print the functions with the largest share of samples in ``directory``'s raw py-spy
    files: self (the function was running) and inclusive (on the stack)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for path in directory.glob("worker-*.txt"):
        for line in path.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [re.sub(r":\d+\)", ")", frame) for frame in stack.split(";")]
            total += count
            own[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
    if not total:
        print("profile: no samples")
        return
    print(f"profile: {total} samples (all threads of every chat worker)")
    print("  self share  function")
    for frame, count in own.most_common(limit):
        print(f"  {100 * count / total:9.1f}%  {frame}")
    print("  inclusive   function")
    for frame, count in inclusive.most_common(limit):
        print(f"  {100 * count / total:9.1f}%  {frame}")


# --- the run --------------------------------------------------------------------------------------------


def environments(args: argparse.Namespace, scratch: Path) -> tuple[dict[str, str], str | None, str | None]:
    """The servers' environment, plus (production) the bench database's DSN and name."""
    base = server_environment({})
    if not args.production:
        base["SQLITE_PATH"] = str(scratch / "bench.sqlite3")
        return base, None, None
    parts = urlsplit(os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL)
    if parts.scheme not in ("postgres", "postgresql"):
        raise SystemExit("--production needs DATABASE_URL to be a PostgreSQL URL")
    name = (parts.path.strip("/") or "postgres") + "_wsload"
    admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    import psycopg

    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    base["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{name}"))
    base["REDIS_URL"] = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    base["CHANNEL_LAYER_PREFIX"] = f"wsload{os.getpid()}"
    return base, urlunsplit(parts._replace(scheme="postgresql", path=f"/{name}")), name


def database_drop(dsn: str | None, name: str | None) -> None:
    if dsn is None or name is None:
        return
    import psycopg

    admin = urlunsplit(urlsplit(dsn)._replace(path="/postgres"))
    with contextlib.suppress(Exception), psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.deadline
    scratch = Path(tempfile.mkdtemp(prefix="ws-load-"))
    env, dsn, db_name = environments(args, scratch)
    workers = args.workers or (2 if args.production else 1)
    servers: list[Server] = []
    try:
        django_setup(env)
        visitors = database_prepare(args.sockets)
        shape = "production (PostgreSQL + Redis)" if args.production else "embedded (SQLite + in-memory layer)"
        print(f"shape={shape} workers={workers} sockets={args.sockets} turns_per_socket={args.turns}")
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

        servers = [server_start("chatapp.asgi:application", env) for _ in range(workers)]
        urls = [f"ws://127.0.0.1:{server.port}" for server in servers]
        plan = Plan(turns=args.turns, turn_timeout=args.turn_timeout)
        pids = [server.process.pid for server in servers]
        cpu_before = sum(cpu_seconds(pid) for pid in pids)
        backends = BackendCpu(dsn, db_name) if dsn and db_name else None
        remaining = max(1.0, deadline - time.monotonic())
        with profiled(pids, args.profile, gil_only=args.profile_gil):
            if backends:
                backends.start()

            async def chat_phase() -> tuple[RunResult, float]:
                async with asyncio.timeout(remaining):
                    return await load_run(urls, visitors, plan, "/ws/chat/{}/")

            wall_start = time.monotonic()
            chat, began = asyncio.run(chat_phase())
            wall = time.monotonic() - began
            chat_cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
            pg_cpu = backends.stop() if backends else 0.0
            jobs_cpu, jobs_wall = jobs_settle(pids, cpu_before + chat_cpu, deadline) if args.jobs else (0.0, 0.0)
        handshake_wall = began - wall_start
        for server in servers:
            server.stop()
        chat_servers, servers = servers, []
        db_lost, db_duplicated = database_check(visitors, args.turns)
        if db_lost or any(turn.lost for turn in chat.turns):
            for number, server in enumerate(chat_servers, start=1):  # what the workers said, to find out why
                print(f"--- worker {number}, last lines:\n" + "".join(server.log[-30:]), file=sys.stderr)
        jobs_done = jobs_check(visitors) if args.jobs else 0

        sent_turns = args.sockets * args.turns
        finished = [turn for turn in chat.turns if turn.done is not None]
        events = statistics.median([turn.events for turn in finished]) if finished else 1
        delta_positions = [turn.delta_at for turn in finished if turn.delta_at is not None]
        delta_at = int(statistics.median(delta_positions)) if delta_positions else 0

        echo_servers = [server_start("bench.echo_asgi:application", env) for _ in range(workers)]
        servers = echo_servers
        echo_urls = [f"ws://127.0.0.1:{server.port}" for server in echo_servers]
        echo_plan = Plan(
            turns=args.turns, turn_timeout=args.turn_timeout, echo_events=max(1, int(events)), echo_delta_at=delta_at
        )
        echo_pids = [server.process.pid for server in echo_servers]
        echo_cpu_before = sum(cpu_seconds(pid) for pid in echo_pids)

        async def echo_phase() -> tuple[RunResult, float]:
            async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
                return await load_run(echo_urls, [("", chat_id) for _, chat_id in visitors], echo_plan, "/ws/echo/{}/")

        echo, _ = asyncio.run(echo_phase())
        echo_cpu = sum(cpu_seconds(pid) for pid in echo_pids) - echo_cpu_before

        lost = sum(turn.lost for turn in chat.turns) + db_lost
        duplicated = sum(turn.duplicated for turn in chat.turns) + db_duplicated
        h50, h99 = summary(list(chat.handshakes))
        f50, f99 = summary([turn.first_delta for turn in chat.turns])
        d50, d99 = summary([turn.done for turn in chat.turns])
        ef50, ef99 = summary([turn.first_delta for turn in echo.turns])
        ed50, ed99 = summary([turn.done for turn in echo.turns])
        cpu_ms = 1000 * (chat_cpu + pg_cpu) / max(1, len(finished))
        print(f"handshakes: {len(chat.handshakes)} in {handshake_wall:.1f} s, p50={h50:.0f} ms p99={h99:.0f} ms")
        print(
            f"chat turns: {len(finished)}/{sent_turns} done in {wall:.1f} s ({len(finished) / wall:.1f} turns/s), "
            f"{events:g} events per turn, first delta is event {delta_at}"
        )
        print(f"  first token p50={f50:.0f} ms p99={f99:.0f} ms; done p50={d50:.0f} ms p99={d99:.0f} ms")
        print(
            f"echo turns: {sum(1 for t in echo.turns if t.done is not None)}/{sent_turns}; "
            f"first event p50={ef50:.0f} ms p99={ef99:.0f} ms; done p50={ed50:.0f} ms p99={ed99:.0f} ms; "
            f"echo cpu {1000 * echo_cpu / max(1, sent_turns):.1f} ms per turn"
        )
        print(
            f"server cpu: daphne {chat_cpu:.1f} s + postgres backends {pg_cpu:.1f} s "
            f"(handshakes, turns and closing included) = {cpu_ms:.1f} ms per turn"
        )
        client_lost = sum(turn.lost for turn in chat.turns)
        client_duplicated = sum(turn.duplicated for turn in chat.turns)
        print(
            f"lost: client {client_lost}, database {db_lost}; duplicated: client {client_duplicated}, "
            f"database {db_duplicated}; failed sockets {chat.failed_sockets}; errors {dict(chat.errors) or 'none'}"
        )
        problems = collections.Counter(problem for turn in chat.turns for problem in turn.problems)
        if problems:
            print(f"client-side problems: {dict(problems)}")
        jobs_ms = 1000 * jobs_cpu / max(1, len(finished))
        if args.jobs:
            print(
                f"memory jobs after the last turn: {jobs_wall:.1f} s until the workers went quiet, "
                f"{jobs_cpu:.1f} s cpu = {jobs_ms:.1f} ms per turn; chats indexed to their last message: "
                f"{jobs_done}/{len(visitors)}"
            )
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.profile is not None:
            profile_top(args.profile)
        ratio = d99 / ed99 if ed99 and ed99 == ed99 else float("nan")
        print(
            f"ratio_p99_vs_echo={ratio:.2f} lost={lost} duplicated={duplicated} sockets={args.sockets} "
            f"cpu_ms_per_turn={cpu_ms:.1f}"
            + (f" cpu_ms_per_turn_with_jobs={cpu_ms + jobs_ms:.1f} jobs_done={jobs_done}" if args.jobs else "")
        )
        return 0
    finally:
        for server in servers:
            server.stop()
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        database_drop(dsn, db_name)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sockets", type=int, default=200, help="concurrent sockets, one chat each (default 200)")
    parser.add_argument("--turns", type=int, default=3, help="turns per socket, one after another (default 3)")
    parser.add_argument("--production", action="store_true", help="PostgreSQL + Redis, two Daphne workers")
    parser.add_argument("--workers", type=int, default=0, help="Daphne workers (default 1, or 2 with --production)")
    parser.add_argument("--turn-timeout", type=float, default=60.0, help="seconds one turn may take (default 60)")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds the whole run may take (default 600)")
    parser.add_argument(
        "--jobs",
        action="store_true",
        help="after the last turn, also count the CPU of the memory jobs (they wait for idle chats) until quiet",
    )
    parser.add_argument("--profile", type=Path, default=None, help="record the chat workers with py-spy into DIR")
    parser.add_argument("--profile-gil", action="store_true", help="with --profile: only the thread holding the GIL")
    parsed = parser.parse_args()
    if not 1 <= parsed.sockets <= 2000 or not 1 <= parsed.turns <= 50 or not 0 <= parsed.workers <= 8:
        parser.error("--sockets must be 1..2000, --turns 1..50, --workers 0..8")
    sys.exit(main(parsed))
