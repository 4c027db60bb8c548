"""Replay of the 100 real tau-bench airline transcripts through the agent entry point at
context windows of 2,048, 4,096 and 8,192 tokens, checking the invariants before every model
call (every recorded assistant message). Data: ../shared/data/tau-bench-airline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync

from memory.context.builder import AgentMemoryMiddleware
from memory.context.request import ContextRequest
from memory.summary.extractive import ExtractiveSummarizer
from memory.summary.store import InMemorySummaryStore
from tests.memory.builders import COUNTER, Store
from tests.memory.conftest import make_engine
from tests.memory.invariants import check_context

DATA = Path(__file__).resolve().parents[4] / "shared" / "data" / "tau-bench-airline" / "trajectories.json"
WIRE = ("role", "content", "tool_calls", "tool_call_id", "name")

pytestmark = pytest.mark.replay


@pytest.fixture(scope="module")
def trajectories():
    if not DATA.exists():
        pytest.skip(f"tau-bench transcripts not found at {DATA} (the shared data folder is absent)")
    return json.loads(DATA.read_text())


@pytest.mark.parametrize(
    ("window", "summary_role", "strict"),
    [(2048, "system", False), (4096, "system", False), (8192, "system", False), (2048, "user", True)],
)
def test_all_tau_bench_transcripts_keep_the_invariants(trajectories, window, summary_role, strict):
    """Also: no call is refused (docs/memory.md F-44: in-turn compaction), the window after the
    summary starts with a user message and, with strict alternation, no two user or two
    assistant messages follow each other (F-38; both asserted by ``check_context``)."""
    assert len(trajectories) == 100
    engine = make_engine(
        window,
        ExtractiveSummarizer(COUNTER),
        attempts=1,
        summarizer_context_window=8192,
        summary_role=summary_role,
        strict_alternation=strict,
        store=InMemorySummaryStore(),
    )
    calls = compressions = refused = 0
    for number, item in enumerate(trajectories):
        traj = item["traj"]
        system_prompt = traj[0]["content"]
        assert traj[0]["role"] == "system"
        store = Store()
        middleware = AgentMemoryMiddleware(engine)
        request = ContextRequest(
            memory_key=f"tau-{window}-{number}",
            system_prompt=system_prompt,
            load_increment=store.load_increment,
            mode="agent",
        )
        for message in traj[1:]:
            if message["role"] == "assistant" and store.rows:
                snapshot = store.snapshot()
                context = async_to_sync(middleware.before_model)(request)
                assert store.rows == snapshot
                check_context(
                    context,
                    stored=store.rows,
                    system_prompt=system_prompt,
                    counter=COUNTER,
                    single_system=summary_role == "user",
                    strict_alternation=strict,
                )
                assert context.tokens <= window or context.overflow
                refused += context.overflow
                calls += 1
                compressions += sum(event.kind == "compression" for event in context.events)
            store.add({key: message[key] for key in WIRE if key in message})
    assert calls > 1000
    assert refused == 0
    if window <= 4096:
        assert compressions > 0
