"""Time to first token with memory work in the request (``sync``) and in background memory jobs
(``background``), against the same turns with no memory work at all (docs/memory.md §10, "fast
first token"; docs/benchmarks.md).

Drives real turns through the app's turn runner (``chat_turn_run``: lease, memory engine, model
call, streaming, storage, then the session's memory job) with the offline engine, whose
summarizer answers after ``--summary-delay`` seconds (``OFFLINE_SUMMARY_DELAY``). The user side
of a LoCoMo conversation of ../shared/data/locomo is fed turn by turn in quick-answer mode, with
``--gap`` seconds between a reply and the next message (a person reading and typing). TTFT is the
time from the user message being stored to the first streamed ``chat.delta`` reaching the
session's channel-layer group.

Modes, each on a fresh session of the same database:

- ``no-memory``: a context window so large that nothing is ever compressed;
- ``sync``: ``MEMORY_COMPRESSION=sync``, compression inside the request, before the first token;
- ``background``: ``MEMORY_COMPRESSION=background`` (the default): pre-compression in the memory
  job after each reply; the request path only reads.

Prints per-mode p50/p95 TTFT (milliseconds) and the first-of-turn model calls that waited for a
summarizer, then, as its last line,
``ttft_penalty_p95_ms=<background p95 − no-memory p95> sync_penalty_p95_ms=<sync p95 − no-memory
p95> first_of_turn_summarizer_waits=<background count>``.

    python bench/ttft.py [--turns 30] [--gap 3.5] [--summary-delay 3] [--window 2048]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
    os.environ["SQLITE_PATH"] = str(Path(tempfile.mkdtemp(prefix="ttft-bench-")) / "bench.sqlite3")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")

import django  # noqa: E402

django.setup()

from asgiref.sync import sync_to_async  # noqa: E402
from channels.layers import get_channel_layer  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import override_settings  # noqa: E402

from chatapp.chats import services  # noqa: E402
from chatapp.chats.access import Owner  # noqa: E402
from chatapp.chats.memory import memory_engine  # noqa: E402
from chatapp.conversation import leases  # noqa: E402
from chatapp.conversation.replay import locomo_conversation  # noqa: E402
from chatapp.conversation.runner import chat_turn_run  # noqa: E402
from chatapp.models import ModelCall  # noqa: E402
from chatapp.realtime.broadcast import session_group_name  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "locomo"
OWNER = Owner(user_id=None, session_key="ttft-bench")
NO_MEMORY_WINDOW = 1_000_000


def user_messages(path: Path, turns: int) -> list[str]:
    """The first ``turns`` user messages of the LoCoMo conversation at ``path``."""
    conversation = locomo_conversation(json.loads(path.read_text(encoding="utf-8")), path.stem)
    texts = [m["content"] for m in conversation.messages if m["role"] == "user" and m["content"]]
    return texts[:turns]


async def first_delta(channel: str) -> float:
    """Wait for the next ``chat.delta`` on ``channel``; returns when it arrived (monotonic s)."""
    layer = get_channel_layer()
    while True:
        message = await layer.receive(channel)
        if message.get("event", {}).get("type") == "chat.delta":
            return time.monotonic()


def summarizer_waits(session_id: int) -> int:
    """First-of-turn model calls (step 1) of the session whose request made a summarizer call."""
    calls = ModelCall.objects.filter(session_id=session_id, step=1)
    return sum(
        any(event.get("attempts") for event in (call.context or {}).get("events", [])) for call in calls.only("context")
    )


async def run_mode(mode: str, texts: list[str], gap: float, window: int) -> tuple[list[float], int]:
    """Feed ``texts`` as turns of a fresh session in ``mode``; returns the TTFTs (ms) and the
    first-of-turn requests that waited for a summarizer."""
    compression = "sync" if mode == "sync" else "background"
    with override_settings(
        MEMORY_COMPRESSION=compression, LLM_CHAT_CONTEXT_WINDOW=NO_MEMORY_WINDOW if mode == "no-memory" else window
    ):
        session = await sync_to_async(services.chat_session_create)(owner=OWNER, mode="quick-answer", title=mode)
        layer = get_channel_layer()
        group = session_group_name(session.pk)
        ttfts: list[float] = []
        for index, text in enumerate(texts):
            # A fresh channel per turn: the previous turn's later deltas must not count.
            channel = await layer.new_channel()
            await layer.group_add(group, channel)
            listening = asyncio.create_task(first_delta(channel))
            started = time.monotonic()
            stored, _ = await sync_to_async(leases.user_message_submit)(
                session=session, client_message_id=f"{mode}-{index}", text=text
            )
            await chat_turn_run(session_id=session.pk, user_message_id=stored.pk)
            ttfts.append((await asyncio.wait_for(listening, 30) - started) * 1000)
            await layer.group_discard(group, channel)
            await asyncio.sleep(gap)
        await memory_engine().jobs().wait(str(session.pk), 60)
        return ttfts, await sync_to_async(summarizer_waits)(session.pk)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def main(args: argparse.Namespace) -> None:
    path = sorted(DATA.glob("conv-*.json"))[0]
    texts = user_messages(path, args.turns)
    print(
        f"{len(texts)} turns of {path.stem}, quick-answer, offline engine, summarizer delay {args.summary_delay} s, "
        f"gap {args.gap} s, window {args.window} tokens"
    )
    await run_mode("no-memory", texts[:1], 0.0, args.window)  # warm-up: imports, tokenizer, knowledge base
    p95: dict[str, float] = {}
    waits: dict[str, int] = {}
    for mode in ("no-memory", "sync", "background"):
        ttfts, waits[mode] = await run_mode(mode, texts, args.gap, args.window)
        p95[mode] = percentile(ttfts, 0.95)
        print(
            f"{mode:>10}: ttft p50 {statistics.median(ttfts):8.1f} ms  p95 {p95[mode]:8.1f} ms  "
            f"max {max(ttfts):8.1f} ms  first-of-turn summarizer waits {waits[mode]}"
        )
    print(
        f"ttft_penalty_p95_ms={p95['background'] - p95['no-memory']:.1f} "
        f"sync_penalty_p95_ms={p95['sync'] - p95['no-memory']:.1f} "
        f"first_of_turn_summarizer_waits={waits['background']}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Time to first token: sync versus background memory work")
    parser.add_argument("--turns", type=int, default=30, help="user turns per mode (default 30)")
    parser.add_argument("--gap", type=float, default=3.5, help="seconds between a reply and the next message")
    parser.add_argument("--summary-delay", type=float, default=3.0, help="offline summarizer delay in seconds")
    parser.add_argument("--window", type=int, default=2048, help="context window in tokens (default 2048)")
    args = parser.parse_args()
    if not DATA.exists():
        sys.exit(f"LoCoMo data not found at {DATA}")
    logging.getLogger("memory").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)
    with override_settings(OFFLINE_SUMMARY_DELAY_SECONDS=args.summary_delay):
        asyncio.run(main(args))
