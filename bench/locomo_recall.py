"""How much of a very long conversation stays answerable: managed memory versus truncation.

Replays the LoCoMo conversations of ../shared/data/locomo (speaker_a as user, speaker_b as
assistant) through the memory engine at a given context window with the offline extractive
summarizer, then asks every annotated question (categories 1-4, those with an answer) as the
next user message and checks whether the answer text appears in what the model would be sent.
The baseline is plain truncation: the system prompt plus the newest messages that fit the same
target. Prints recall per conversation and overall, then ``recall_managed=<x> recall_truncation=<y>``.
A rough proxy (answers must appear verbatim), but the same for both methods.

    python bench/locomo_recall.py [--window 4096] [--limit 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["SQLITE_PATH"] = str(Path(tempfile.mkdtemp(prefix="locomo-recall-")) / "recall.sqlite3")
os.environ.pop("DATABASE_URL", None)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from chatapp.conversation.replay import locomo_conversation  # noqa: E402
from memory.api import (  # noqa: E402
    ContextRequest,
    ExtractiveSummarizer,
    InMemorySummaryStore,
    MemoryBudget,
    MemoryEngine,
    SummarizerChain,
    get_counter,
)

DATA = ROOT.parent / "shared" / "data" / "locomo"
COUNTER = get_counter("gpt-4o-mini")


class Rows:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, message: dict) -> None:
        row = {**message, "id": len(self.rows) + 1}
        row["token_count"] = COUNTER.count_message(row)
        self.rows.append(row)

    async def load(self, boundary: int | None) -> list[dict]:
        return [dict(r) for r in self.rows if boundary is None or r["id"] > boundary]


def truncation_text(system: str, rows: list[dict], question: dict, target: int) -> str:
    budget = target - COUNTER.count_message({"role": "system", "content": system}) - COUNTER.count_message(question)
    kept: list[str] = []
    for row in reversed(rows):
        if row["token_count"] > budget:
            break
        budget -= row["token_count"]
        kept.append(row["content"])
    return system + "\n" + "\n".join(reversed(kept))


async def run(path: Path, engine: MemoryEngine) -> tuple[int, int, int]:
    data = json.loads(await asyncio.to_thread(path.read_text))
    conversation = locomo_conversation(data, path.stem)
    system, messages = conversation.system_prompt, conversation.messages
    store = Rows()
    for index, message in enumerate(messages):
        if message["role"] == "assistant" and index:
            await engine.build_context(
                ContextRequest(
                    memory_key=path.stem, system_prompt=system, load_increment=store.load, mode="quick-answer"
                )
            )
        store.add(message)
    questions = [qa for qa in data.get("qa", []) if qa.get("category") in (1, 2, 3, 4) and "answer" in qa]
    managed = truncated = 0
    for qa in questions:
        answer = str(qa["answer"]).lower()
        question = {"role": "user", "content": qa["question"]}
        probe = Rows()
        probe.rows = [
            *store.rows,
            {**question, "id": len(store.rows) + 1, "token_count": COUNTER.count_message(question)},
        ]
        # Each question is asked as the next turn (not stored): it may trigger a compression, as
        # a real next turn would.
        context = await engine.build_context(
            ContextRequest(memory_key=path.stem, system_prompt=system, load_increment=probe.load, mode="quick-answer")
        )
        sent = "\n".join(m["content"] or "" for m in context.messages).lower()
        managed += answer in sent
        truncated += answer in truncation_text(system, store.rows, question, engine.budget.target_tokens).lower()
    return len(questions), managed, truncated


async def main(window: int, limit: int) -> None:
    engine = MemoryEngine(
        budget=MemoryBudget(context_window=window),
        chain=SummarizerChain(primary=ExtractiveSummarizer(COUNTER), backoff=0),
        counter=COUNTER,
        store=InMemorySummaryStore(),
    )
    total = managed = truncated = 0
    for path in sorted(DATA.glob("conv-*.json"))[:limit]:
        count, hit_managed, hit_truncated = await run(path, engine)
        total, managed, truncated = total + count, managed + hit_managed, truncated + hit_truncated
        print(f"{path.stem}: {count} questions, answer in context: managed {hit_managed}, truncation {hit_truncated}")
    print(f"window={window} questions={total}")
    print(f"recall_managed={managed / total:.3f} recall_truncation={truncated / total:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="LoCoMo answer recall: managed memory versus truncation")
    parser.add_argument("--window", type=int, default=4096, help="context window in tokens (default 4096)")
    parser.add_argument("--limit", type=int, default=5, help="conversations to replay (default 5)")
    args = parser.parse_args()
    if not DATA.exists():
        sys.exit(f"LoCoMo data not found at {DATA}")
    logging.getLogger("memory").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)
    asyncio.run(main(args.window, args.limit))
