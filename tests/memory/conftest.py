from __future__ import annotations

import itertools

import pytest

from memory.config import MemoryConfig
from memory.engine import MemoryEngine
from memory.summarizer import SummarizerChain
from tests.memory.builders import COUNTER, ScriptedSummarizer

_keys = itertools.count(1)


@pytest.fixture
def session_key() -> str:
    return f"test-session-{next(_keys)}"


def make_engine(
    window: int = 2048,
    primary=None,
    failover=None,
    *,
    attempts: int = 3,
    timeout: float = 5.0,
    **config,
) -> MemoryEngine:
    """An engine over the test database with scripted summarizers and no retry backoff."""
    chain = SummarizerChain(
        primary=primary or ScriptedSummarizer(),
        failover=failover,
        attempts=attempts,
        timeout=timeout,
        backoff=0,
    )
    return MemoryEngine(config=MemoryConfig(context_window=window, **config), chain=chain, counter=COUNTER)
