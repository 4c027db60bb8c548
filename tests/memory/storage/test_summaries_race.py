"""Two compressions of one session racing on separate database connections (real threads),
on SQLite and, when DATABASE_URL points at it, PostgreSQL (docs/memory.md F-26; docs/memory.md §3 step 6)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync
from django.db import connection

from memory.context.request import ContextRequest, MemoryContext
from memory.models import CompressionEvent, SessionSummary
from tests.memory.builders import COUNTER, Store, asst, user
from tests.memory.conftest import make_engine
from tests.memory.invariants import check_context

SYSTEM = "You are a helpful assistant."


class BarrierSummarizer:
    """Waits until both racing requests are inside the summarizer, then answers."""

    def __init__(self, barrier: threading.Barrier, text: str) -> None:
        self.barrier = barrier
        self.text = text
        self.model = f"barrier-{text}"

    async def summarize(self, request):
        await asyncio.to_thread(self.barrier.wait, 10)
        return self.text


@pytest.mark.django_db(transaction=True)
def test_two_racing_compressions_leave_one_consistent_boundary():
    store = Store()
    for i in range(14):
        store.add(user(f"Question {i}: " + "lorem " * 40), asst(f"Answer {i}: " + "ipsum " * 40))
    store.add(user("final"))
    barrier = threading.Barrier(2)
    results: dict[str, MemoryContext | Exception] = {}

    def run(name: str) -> None:
        engine = make_engine(primary=BarrierSummarizer(barrier, f"summary from {name}"))
        try:
            results[name] = async_to_sync(engine.build_context)(
                ContextRequest(
                    memory_key="race", system_prompt=SYSTEM, load_increment=store.load_increment, mode="agent"
                )
            )
        except Exception as exc:  # surfaced by the assertions below
            results[name] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    row = SessionSummary.objects.get(memory_key="race")
    kinds = sorted(CompressionEvent.objects.filter(memory_key="race").values_list("kind", flat=True))
    assert kinds == ["compression", "superseded"], kinds
    assert row.version == 1 and row.content in ("summary from a", "summary from b")
    for context in results.values():
        assert isinstance(context, MemoryContext), context
        check_context(context, stored=store.rows, system_prompt=SYSTEM, counter=COUNTER)
        assert context.summary.last_message_id == row.last_message_id
        assert context.summary.content == row.content
