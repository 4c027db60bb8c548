"""``python manage.py replay PATH --format tau-bench|locomo [--limit N] [--context-window TOKENS]
[--mode agent|quick-answer] --out FILE.jsonl``: replay recorded conversations through the live
memory path and write one JSON line per model call (contract in docs/replay.md)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from chatapp.conversation.replay import ReplayInputError, conversation_replay, conversations_read, replay_engine


class Command(BaseCommand):
    help = "Replay recorded conversations through the memory engine; one JSON line per model call."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "path", type=Path, help="tau-bench trajectories.json, or a LoCoMo conv-*.json file or folder"
        )
        parser.add_argument("--format", required=True, choices=["tau-bench", "locomo"], dest="fmt")
        parser.add_argument("--limit", type=int, default=None, help="replay at most N conversations")
        parser.add_argument(
            "--context-window", type=int, default=None, help="the chat model's context window in tokens"
        )
        parser.add_argument("--mode", choices=["agent", "quick-answer"], default="agent")
        parser.add_argument("--out", required=True, type=Path, help="output JSON Lines file")

    def handle(
        self,
        *args: object,
        path: Path,
        fmt: str,
        limit: int | None,
        context_window: int | None,
        mode: str,
        out: Path,
        **options: object,
    ) -> None:
        if limit is not None and limit < 1:
            raise CommandError("--limit must be at least 1")
        if context_window is not None and context_window < 256:
            raise CommandError("--context-window must be at least 256 tokens")
        engine = replay_engine(context_window)
        started = time.perf_counter()
        calls = compressions = largest = conversations = 0
        try:
            with out.open("w", encoding="utf-8") as sink:
                for conversation in conversations_read(path, fmt):  # type: ignore[arg-type]
                    if limit is not None and conversations >= limit:
                        break
                    conversations += 1
                    for record in conversation_replay(conversation, engine=engine, mode=mode):  # type: ignore[arg-type]
                        sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                        calls += 1
                        events = [*record["job_events"], *record["events"]]
                        compressions += sum(event["kind"] == "compression" for event in events)
                        largest = max(largest, record["tokens"])
                    print(
                        f"[{conversations}] {conversation.name}: {calls} model calls so far, {compressions} compressions",
                        file=sys.stderr,
                    )
        except ReplayInputError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot write {out}: {exc}") from None
        seconds = time.perf_counter() - started
        print(
            f"replayed {conversations} conversations: {calls} model calls, {compressions} compressions, "
            f"largest request {largest} tokens (window {engine.budget.context_window}), {seconds:.1f} s",
            file=sys.stderr,
        )
