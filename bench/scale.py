"""The production shape under load (docs/deploy.md): 2 web workers and 2 job workers on PostgreSQL + Redis, memory
jobs on the durable queue, a seeded corpus of heavy owners, the 200-socket burst, one job worker killed mid-burst.

Built on bench/ws_load.py (its visitors, client and checks). Before the burst, ``--heavy-owners`` of the visitors
get ``--heavy-items`` recall items each in an older chat of theirs (synthetic text, unit vectors of the bundled
model), so their turns' recall searches that many items. Memory jobs start ``MEMORY_JOB_IDLE_SECONDS=2`` after a
chat's last reply, so that they run during the burst; when half the burst's time has passed the first job worker
is killed (SIGKILL) and the other finishes its jobs once the killed one misses its heartbeats (``--stalled-after``).
After the burst it waits until the queue is empty (at most ``--settle`` seconds).

Reports turns per second, ``chat.done`` p99, CPU per turn of the web workers and of the job workers (``/proc``),
each worker's resident memory at the end, turns lost (client and database, as ws_load counts them), jobs sent back
to the queue, chats whose memory job did not index their last message (``unfinished_jobs``: any fails the run), and
the recall latency of the heavy owners' turns (p95 of the recall report's ``latency_ms``, what the request waited
for the search). Last line::

    turns_per_s=… done_p99_s=… web_cpu_ms_per_turn=… job_cpu_ms_per_turn=… lost=… jobs_redelivered=…
    unfinished_jobs=… recall_p95_ms=…

``--embedded`` runs the same on the embedded default (one Daphne on SQLite, jobs in its process: their CPU is in
``web_cpu_ms_per_turn``, no job worker to kill).

    python bench/scale.py [--sockets 200] [--turns 3] [--heavy-owners 5] [--heavy-items 10000] [--embedded]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import ws_load  # noqa: E402
from tests.daphne_process import JobWorker  # noqa: E402


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MiB (0 once it is gone)."""
    try:
        match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return 0.0
    return int(match.group(1)) / 1024 if match else 0.0


def heavy_owners_seed(visitors: list[tuple[str, int]], items: int) -> list[int]:
    """Give each visitor's owner an older chat with ``items`` recall items (unit vectors of the bundled model);
    returns the visitors' chat ids."""
    import numpy as np
    from django.db import connections
    from django.utils import timezone

    from chatapp.chats.memory import memory_key_of, session_scope_key
    from chatapp.llm.embeddings import BUNDLED, embedder_choice
    from chatapp.models import ChatSession
    from memory.models import MemoryItem

    choice = embedder_choice()
    dimension = BUNDLED[choice.model].dimension if choice.backend == "local" else 0
    rng = np.random.default_rng(7)
    words = [
        "invoice",
        "hiking",
        "Lisbon",
        "schnauzer",
        "router",
        "warranty",
        "recipe",
        "marathon",
        "violin",
        "dentist",
    ]
    now = timezone.now()
    for _, chat_id in visitors:
        chat = ChatSession.objects.get(pk=chat_id)
        older = ChatSession.objects.create(owner_session_key=chat.owner_session_key, title="older chat")
        scope, memory_key = session_scope_key(chat), memory_key_of(older.pk)
        rows = []
        for number in range(items):
            text = (
                f"Note {number}: the {words[number % 10]} and the {words[(number * 7) % 10]} came up on day {number}."
            )
            vector = rng.standard_normal(dimension or 1).astype(np.float32)
            vector /= np.linalg.norm(vector)
            rows.append(
                MemoryItem(
                    scope_key=scope, memory_key=memory_key, message_ids=[number + 1], last_message_id=number + 1,
                    role="user", text=text, token_count=20, created_at=now,
                    embedding=vector.tobytes() if dimension else None,
                    embedding_model=choice.model if dimension else "", embedding_dim=dimension,
                )
            )  # fmt: skip
        MemoryItem.objects.bulk_create(rows, batch_size=2000)
    connections.close_all()
    return [chat_id for _, chat_id in visitors]


def queue_open_jobs() -> int:
    from django.db import connection, connections

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')")
        count = int(cursor.fetchone()[0])
    connections.close_all()
    return count


def recall_latencies(chat_ids: list[int]) -> list[int]:
    """The recall report's ``latency_ms`` of every model call of these chats."""
    from django.db import connections

    from chatapp.models import ModelCall

    latencies = []
    for context in ModelCall.objects.filter(session_id__in=chat_ids).values_list("context", flat=True):
        recall = (context or {}).get("recall") or {}
        if recall.get("latency_ms") is not None:
            latencies.append(int(recall["latency_ms"]))
    connections.close_all()
    return latencies


def main(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.deadline
    scratch = Path(tempfile.mkdtemp(prefix="scale-"))
    shape = SimpleNamespace(production=not args.embedded)
    env, dsn, db_name = ws_load.environments(shape, scratch)  # type: ignore[arg-type]
    env["MEMORY_JOB_IDLE_SECONDS"] = "2"
    if not args.embedded:
        env["MEMORY_JOB_QUEUE"] = "procrastinate"
    web: list[ws_load.Server] = []
    jobs: list[JobWorker] = []
    try:
        ws_load.django_setup(env)
        visitors = ws_load.database_prepare(args.sockets)
        heavy = heavy_owners_seed(visitors[: args.heavy_owners], args.heavy_items)
        web_count, job_count = (1, 0) if args.embedded else (2, 2)
        print(
            f"shape={'embedded' if args.embedded else 'production'} web_workers={web_count} job_workers={job_count} "
            f"sockets={args.sockets} turns={args.turns} heavy_owners={len(heavy)} items_each={args.heavy_items}"
        )
        web = [ws_load.server_start("chatapp.asgi:application", env) for _ in range(web_count)]
        jobs = [JobWorker(env, stalled_after=args.stalled_after) for _ in range(job_count)]
        web_pids = [server.process.pid for server in web]
        web_cpu_before = sum(ws_load.cpu_seconds(pid) for pid in web_pids)
        job_cpu_before = sum(ws_load.cpu_seconds(worker.process.pid) for worker in jobs)
        plan = ws_load.Plan(turns=args.turns, turn_timeout=args.turn_timeout)
        urls = [f"ws://127.0.0.1:{server.port}" for server in web]

        async def burst() -> tuple[ws_load.RunResult, float]:
            async def killer() -> None:
                await asyncio.sleep(args.kill_after)
                if jobs:
                    jobs[0].kill(ws_load.cpu_seconds(jobs[0].process.pid))
                    print(f"killed job worker 1 (pid {jobs[0].process.pid}) {args.kill_after:.0f} s into the burst")

            kill = asyncio.create_task(killer())
            try:
                async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
                    return await ws_load.load_run(urls, visitors, plan, "/ws/chat/{}/")
            finally:
                if not kill.done():
                    kill.cancel()
                    if jobs:  # the burst ended first: kill it now, with jobs still to run
                        jobs[0].kill(ws_load.cpu_seconds(jobs[0].process.pid))
                        print("killed job worker 1 at the end of the burst")

        chat, began = asyncio.run(burst())
        wall = time.monotonic() - began
        settle_until = min(deadline, time.monotonic() + args.settle)
        time.sleep(2.5)  # the last chats' idle delay
        while time.monotonic() < settle_until:
            if (queue_open_jobs() if jobs else 0) == 0:
                break
            time.sleep(1)
        if args.embedded:
            ws_load.jobs_settle(web_pids, web_cpu_before, settle_until)
        web_cpu = sum(ws_load.cpu_seconds(pid) for pid in web_pids) - web_cpu_before
        job_cpu = (
            sum(
                worker.cpu_at_death if worker.cpu_at_death is not None else ws_load.cpu_seconds(worker.process.pid)
                for worker in jobs
            )
            - job_cpu_before
        )
        memory = [f"web {rss_mb(pid):.0f}" for pid in web_pids] + [
            f"jobs {rss_mb(worker.process.pid):.0f}" for worker in jobs if worker.cpu_at_death is None
        ]
        open_jobs = queue_open_jobs() if jobs else 0
        indexed = ws_load.jobs_check(visitors)
        db_lost, _ = ws_load.database_check(visitors, args.turns)
        lost = sum(turn.lost for turn in chat.turns) + db_lost
        finished = [turn for turn in chat.turns if turn.done is not None]
        _, d99 = ws_load.summary([turn.done for turn in chat.turns])
        redelivered = sum(line.count("of a stopped worker") for worker in jobs for line in worker.log)
        latencies = recall_latencies(heavy)
        recall_p95 = ws_load.percentile([float(x) for x in latencies], 0.95)
        turns = max(1, len(finished))
        unfinished = open_jobs + (len(visitors) - indexed)
        print(f"turns: {len(finished)}/{args.sockets * args.turns} in {wall:.1f} s; chat.done p99 {d99:.0f} ms")
        print(
            f"cpu per turn: web workers {1000 * web_cpu / turns:.1f} ms, job workers {1000 * job_cpu / turns:.1f} ms; "
            f"resident memory at the end (MiB): {', '.join(memory)}"
        )
        print(
            f"memory jobs: {redelivered} sent back to the queue, {open_jobs} still queued, "
            f"{indexed}/{len(visitors)} chats indexed to their last message"
        )
        print(f"recall of the heavy owners' turns: {len(latencies)} searches, p95 {recall_p95:.0f} ms")
        if unfinished:
            for number, worker in enumerate(jobs, start=1):
                print(f"--- job worker {number}, last lines:\n" + "".join(worker.log[-20:]), file=sys.stderr)
        print(
            f"turns_per_s={len(finished) / wall:.1f} done_p99_s={d99 / 1000:.2f} "
            f"web_cpu_ms_per_turn={1000 * web_cpu / turns:.1f} job_cpu_ms_per_turn={1000 * job_cpu / turns:.1f} "
            f"lost={lost} jobs_redelivered={redelivered} unfinished_jobs={unfinished} recall_p95_ms={recall_p95:.0f}"
        )
        return 1 if unfinished or lost else 0
    finally:
        for worker in jobs:
            worker.stop()
        for server in web:
            server.stop()
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        ws_load.database_drop(dsn, db_name)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sockets", type=int, default=200, help="concurrent sockets, one chat each (default 200)")
    parser.add_argument("--turns", type=int, default=3, help="turns per socket (default 3)")
    parser.add_argument("--heavy-owners", type=int, default=5, help="visitors given a large history (default 5)")
    parser.add_argument("--heavy-items", type=int, default=10_000, help="recall items per heavy owner (default 10000)")
    parser.add_argument("--kill-after", type=float, default=10.0, help="seconds into the burst (default 10)")
    parser.add_argument("--stalled-after", type=float, default=10.0, help="job workers' heartbeat limit (default 10)")
    parser.add_argument("--settle", type=float, default=180.0, help="seconds to wait for the queue (default 180)")
    parser.add_argument("--turn-timeout", type=float, default=120.0, help="seconds one turn may take (default 120)")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds the whole run may take (default 900)")
    parser.add_argument("--embedded", action="store_true", help="the embedded default instead (SQLite, one process)")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(parser.parse_args()))
