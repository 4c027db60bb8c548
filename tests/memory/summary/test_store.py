"""The storage port (docs/architecture.md): the database store and the in-memory store keep the
same compare-and-set contract (docs/memory.md §3 step 6), so tests of the engine over either say
the same thing."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from memory.storage.summaries import OrmSummaryStore
from memory.summary.store import CompressionRecord, InMemorySummaryStore, Summary, SummaryStore

pytestmark = pytest.mark.django_db  # for the database store; the in-memory one ignores it


@pytest.fixture(params=["orm", "in-memory"])
def store(request) -> SummaryStore:
    return OrmSummaryStore() if request.param == "orm" else InMemorySummaryStore()


def cas(store: SummaryStore, key: str, expected: int, boundary: int | None, content: str = "s") -> bool:
    new = Summary(content=content, summary_type="llm", last_message_id=boundary, compressed_count=boundary or 0)
    return async_to_sync(store.compare_and_set)(key, expected_version=expected, new=new, token_count=1)


def test_an_unknown_key_reads_as_an_empty_summary(store):
    assert async_to_sync(store.get)("nobody") == Summary()


def test_compare_and_set_bumps_the_version_and_only_moves_the_boundary_forward(store):
    assert cas(store, "k", 0, 10, "first")
    stored = async_to_sync(store.get)("k")
    assert (stored.version, stored.last_message_id, stored.content) == (1, 10, "first")
    assert not cas(store, "k", 0, 20), "a stale version must lose"
    assert not cas(store, "k", 1, 10), "the boundary may not stay put"
    assert not cas(store, "k", 1, 5), "the boundary may not move backwards"
    assert cas(store, "k", 1, 20, "second")
    assert async_to_sync(store.get)("k").version == 2
    assert async_to_sync(store.get)("other") == Summary(), "keys are independent"


def test_a_recorded_event_comes_back_with_its_fields_and_an_id(store):
    record = CompressionRecord(
        kind="overflow",
        mode="agent",
        context_window=2048,
        trigger_tokens=1024,
        target_tokens=614,
        tokens_before=3000,
        tokens_after=2000,
        notes=["elided 1 message(s) of the current turn in the model-facing copy"],
        elisions=[{"id": 7, "role": "tool", "tokens_before": 1500, "tokens_after": 500}],
    )
    event = async_to_sync(store.record)("k", record)
    assert event.id and event.created_at
    assert event.fields() == record.fields()
