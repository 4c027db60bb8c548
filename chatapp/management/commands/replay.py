"""``manage.py replay``: recorded conversations through the live memory path, one JSON line per model call, then
(LoCoMo, ``--questions``) one per annotated question asked as an unstored next turn (contract in docs/replay.md)."""

from __future__ import annotations

import json
import sys
import time
from itertools import chain
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from chatapp.conversation.replay import (
    Question,
    ReplayInputError,
    ReplaySession,
    conversations_read,
    replay_config,
)


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
        parser.add_argument(
            "--questions",
            action="store_true",
            help="LoCoMo: after each conversation, ask its annotated questions (categories 1-4) as unstored turns",
        )
        parser.add_argument(
            "--questions-from",
            type=Path,
            default=None,
            help="with --questions: ask the questions of this LoCoMo file (or folder) instead (noise check)",
        )
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
        questions: bool = False,
        questions_from: Path | None = None,
        **options: object,
    ) -> None:
        if limit is not None and limit < 1:
            raise CommandError("--limit must be at least 1")
        if context_window is not None and context_window < 256:
            raise CommandError("--context-window must be at least 256 tokens")
        if questions and fmt != "locomo":
            raise CommandError("--questions needs --format locomo (only LoCoMo annotates questions)")
        if questions_from is not None and not questions:
            raise CommandError("--questions-from needs --questions")
        config = replay_config(context_window)
        started = time.perf_counter()
        calls = compressions = largest = conversations = asked = 0
        try:
            foreign: list[Question] | None = None
            if questions_from is not None:
                foreign = [q for c in conversations_read(questions_from, "locomo") for q in c.questions]
            with out.open("w", encoding="utf-8") as sink:
                for conversation in conversations_read(path, fmt):  # type: ignore[arg-type]
                    if limit is not None and conversations >= limit:
                        break
                    conversations += 1
                    session = ReplaySession(conversation, config=config, mode=mode)  # type: ignore[arg-type]
                    records = session.records()
                    if questions:
                        asked_here = foreign if foreign is not None else conversation.questions
                        records = chain(records, session.questions(asked_here))
                    for record in records:
                        sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                        if "question" in record:
                            asked += 1
                        else:
                            calls += 1
                        events = [*record["job_events"], *record["events"]]
                        compressions += sum(event["kind"] == "compression" for event in events)
                        largest = max(largest, record["tokens"])
                    print(
                        f"[{conversations}] {conversation.name}: {calls} model calls so far, {compressions} compressions"
                        + (f", {asked} questions asked" if questions else ""),
                        file=sys.stderr,
                    )
        except ReplayInputError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot write {out}: {exc}") from None
        seconds = time.perf_counter() - started
        print(
            f"replayed {conversations} conversations: {calls} model calls, "
            + (f"{asked} questions, " if questions else "")
            + f"{compressions} compressions, "
            f"largest request {largest} tokens (window {config.context_window}), {seconds:.1f} s",
            file=sys.stderr,
        )
