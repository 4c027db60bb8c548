from __future__ import annotations

import itertools

import pytest

from memory.context.budget import MemoryBudget
from memory.context.builder import ContextBuilder
from memory.storage.summaries import OrmSummaryStore
from memory.summary.chain import SummarizerChain
from memory.summary.store import SummaryStore
from tests.memory.builders import COUNTER, ScriptedSummarizer

_keys = itertools.count(1)


@pytest.fixture
def memory_key() -> str:
    return f"test-session-{next(_keys)}"


def make_engine(
    window: int = 2048,
    primary=None,
    failover=None,
    *,
    attempts: int = 3,
    timeout: float = 5.0,
    store: SummaryStore | None = None,
    **budget,
) -> ContextBuilder:
    """An engine with scripted summarizers and no retry backoff, over ``store`` (default: the
    test database)."""
    chain = SummarizerChain(
        primary=primary or ScriptedSummarizer(),
        failover=failover,
        attempts=attempts,
        timeout=timeout,
        backoff=0,
    )
    return ContextBuilder(
        budget=MemoryBudget(context_window=window, **budget),
        chain=chain,
        counter=COUNTER,
        store=store or OrmSummaryStore(),
    )
