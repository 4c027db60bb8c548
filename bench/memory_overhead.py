"""Per-request cost of the memory layer, by history length.

For sessions of 10, 100, 1,000 and 10,000 stored messages in steady state (already compressed
as after a long chat: a summary and a boundary exist), time the memory layer of each request:
load the summary, load the increment from the database, estimate, compress when needed (with an
instant summarizer, so no LLM time is counted), write back, assemble. Runs on the database
configured (``DATABASE_URL``, else a temporary SQLite file). Prints p50/p95 in milliseconds
per size and, as its last line, ``ratio_p50_10000_vs_10=<x>``.

    python bench/memory_overhead.py [--requests 200] [--window 8192]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if not os.environ.get("DATABASE_URL"):
    os.environ["SQLITE_PATH"] = str(Path(tempfile.mkdtemp(prefix="memory-bench-")) / "bench.sqlite3")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")

import django  # noqa: E402

django.setup()

from asgiref.sync import sync_to_async  # noqa: E402
from django.core.management import call_command  # noqa: E402

from chatapp.chats.memory import memory_key_of  # noqa: E402
from chatapp.models import ChatSession, Message  # noqa: E402
from memory.api import ContextRequest, SummaryRequest, get_counter  # noqa: E402
from memory.api import Message as WireMessage  # noqa: E402
from memory.context.budget import MemoryBudget  # noqa: E402
from memory.context.builder import ContextBuilder  # noqa: E402
from memory.context.request import IncrementLoader  # noqa: E402
from memory.storage.summaries import OrmSummaryStore, session_memory_delete  # noqa: E402
from memory.summary.chain import SummarizerChain  # noqa: E402

SIZES = (10, 100, 1_000, 10_000)
COUNTER = get_counter("gpt-4o-mini")
SYSTEM = "You are a helpful assistant for an airline. Follow the booking policy."


class InstantSummarizer:
    """Returns a short fixed-shape summary at once: the benchmark measures the memory layer only."""

    model = "instant"

    async def summarize(self, request: SummaryRequest) -> str:
        return f"Summary covering {len(request.messages)} more messages; user id ada_1815, reservation ZFA04Y."


def message_row(session: ChatSession, index: int) -> Message:
    role = "user" if index % 2 == 0 else "assistant"
    content = f"{role} message {index}: " + "booking details and flight numbers HAT123 " * 6
    wire = {"role": role, "content": content}
    return Message(session=session, role=role, content=content, token_count=COUNTER.count_message(wire))


def seed(size: int) -> ChatSession:
    session = ChatSession.objects.create(owner_session_key="bench", mode="agent", title=f"bench {size}")
    Message.objects.bulk_create([message_row(session, i) for i in range(size)], batch_size=2000)
    return session


def add(session: ChatSession, index: int) -> None:
    message_row(session, index).save()


async def load_increment_for(session_id: int) -> IncrementLoader:
    def load(boundary: int | None) -> list[WireMessage]:
        rows = Message.objects.filter(session_id=session_id).order_by("id")
        if boundary is not None:
            rows = rows.filter(id__gt=boundary)
        return [{"id": r.pk, **r.to_wire(), "token_count": r.token_count} for r in rows]

    async def loader(boundary: int | None) -> list[WireMessage]:
        return await sync_to_async(load)(boundary)

    return loader


async def measure(size: int, requests: int, engine: ContextBuilder) -> list[float]:
    session = await sync_to_async(seed)(size)
    loader = await load_increment_for(session.pk)
    request = ContextRequest(
        memory_key=memory_key_of(session.pk), system_prompt=SYSTEM, load_increment=loader, mode="agent"
    )
    # Reach the steady state: the first request compresses the long history once.
    await sync_to_async(add)(session, size if size % 2 == 0 else size + 1)
    await engine.build_context(request)
    timings = []
    index = size + 2
    for _ in range(requests):
        await sync_to_async(add)(session, index)  # the user's message, stored before the memory layer runs
        started = time.perf_counter()
        await engine.build_context(request)
        timings.append((time.perf_counter() - started) * 1000)
        await sync_to_async(add)(session, index + 1)  # the assistant's reply
        index += 2
    await sync_to_async(session_memory_delete)(memory_key=request.memory_key)
    await sync_to_async(session.delete)()
    return timings


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def main(args: argparse.Namespace) -> None:
    engine = ContextBuilder(
        budget=MemoryBudget(context_window=args.window),
        chain=SummarizerChain(primary=InstantSummarizer(), backoff=0),
        counter=COUNTER,
        store=OrmSummaryStore(),
    )
    logging.getLogger("memory").setLevel(logging.WARNING)
    vendor = django.db.connection.vendor
    print(f"database={vendor} window={args.window} requests_per_size={args.requests}")
    p50s = {}
    for size in SIZES:
        timings = await measure(size, args.requests, engine)
        p50s[size] = statistics.median(timings)
        print(
            f"messages={size:>6}  p50={p50s[size]:.2f} ms  p95={percentile(timings, 0.95):.2f} ms  max={max(timings):.2f} ms"
        )
    print(f"ratio_p50_10000_vs_10={p50s[10_000] / p50s[10]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="timed requests per size (default 200)")
    parser.add_argument("--window", type=int, default=8192, help="context window in tokens (default 8192)")
    call_command("migrate", verbosity=0)
    asyncio.run(main(parser.parse_args()))
