"""``manage.py memory_reindex [--chat ID ...] [--no-embed]``: rebuild the recall index of existing
chats (docs/memory.md §12); idempotent. Progress goes to stderr, the summary to stdout."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper

from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.llm.embeddings import embedder_choice, embedder_get
from chatapp.models import ChatSession, Message

BAR_WIDTH = 30


class Command(BaseCommand):
    help = (
        "Rebuild the recall index (items and embeddings) of every chat, or of the chats given with --chat. "
        "Unchanged items keep their rows and embeddings, so running it twice changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--chat", type=int, action="append", default=[], help="a chat session id (repeatable)")
        parser.add_argument("--no-embed", action="store_true", help="index for full-text search only")

    def handle(self, *args: Any, **options: Any) -> None:
        ids: list[int] = options["chat"]
        sessions = ChatSession.objects.order_by("id")
        if ids:
            sessions = sessions.filter(pk__in=ids)
            unknown = sorted(set(ids) - set(sessions.values_list("id", flat=True)))
            if unknown:
                raise CommandError(f"no chat session {', '.join(map(str, unknown))}")
        embedder = None if options["no_embed"] else embedder_get()
        choice = embedder_choice()
        self.stderr.write(
            f"embedder: {embedder.model if embedder is not None else 'none'}"
            + ("" if embedder is not None or options["no_embed"] else f" ({choice.reason})")
        )
        totals = {"chats": 0, "messages": 0, "inserted": 0, "deleted": 0, "embedded": 0}
        started = time.monotonic()
        engine = memory_engine(run_sync=sync_to_async, embedder=embedder)
        for session_id in list(sessions.values_list("id", flat=True)):
            total = Message.objects.filter(session_id=session_id).exclude(origin=Message.Origin.APP).count()
            counts = async_to_sync(engine.reindex)(
                memory_key_of(session_id), progress=_bar(self.stderr, session_id, started, total)
            )
            self.stderr.write("")
            totals["chats"] += 1
            for key, value in counts.items():
                totals[key] += value
        self.stdout.write(
            f"reindexed {totals['chats']} chat(s), {totals['messages']} message(s): "
            f"{totals['inserted']} item(s) added, {totals['deleted']} removed, {totals['embedded']} embedded "
            f"in {time.monotonic() - started:.1f} s"
        )


def _bar(stream: OutputWrapper, session_id: int, started: float, messages: int) -> Callable[[str, int, int], None]:
    """A progress callback drawing ``chat N index [#####.....] done/total`` on one line;
    ``messages``: how many the index phase goes through."""

    def progress(phase: str, done: int, total: int) -> None:
        total = total or messages
        filled = BAR_WIDTH if total <= 0 else min(BAR_WIDTH, BAR_WIDTH * done // total)
        line = (
            f"\rchat {session_id} {phase:<5} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
            f"{done}/{total} {time.monotonic() - started:.1f} s"
        )
        stream.write(line, ending="")
        stream.flush()

    return progress
