"""Recall in the request (docs/memory.md §12), on the pure engine with a fake loader: the block's
place and budget, F-34 (never a message that is verbatim in the request), a failing loader, and
the invariants I1-I5 with recall on, over generated conversations."""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime, timedelta

from asgiref.sync import async_to_sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.context.request import ContextRequest
from memory.recall.block import RECALL_HEADER
from memory.recall.values import RecallCandidate, RecallInput, RecallItem
from memory.summary.store import InMemorySummaryStore
from tests.memory.builders import COUNTER, FlakySummarizer, Store, asst, user
from tests.memory.conftest import make_engine
from tests.memory.invariants import check_context

SYSTEM = "You are the support assistant."
NOW = datetime(2026, 12, 1, tzinfo=UTC)
_keys = itertools.count(1)


class FakeIndex:
    """Items for every stored row of this chat (one per message) and of another chat of the same
    owner; the loader returns, like the real one, this chat's items only up to ``boundary``."""

    def __init__(self, store: Store, other: list[tuple[int, str]] | None = None) -> None:
        self.store = store
        self.other = list(other or [])
        self.calls: list[int | None] = []

    async def load(self, query: str, boundary: int | None) -> RecallInput:
        self.calls.append(boundary)
        mine = [
            (row["id"], row["content"], "user" if row["role"] == "user" else "assistant")
            for row in self.store.rows
            if boundary is not None and row["id"] <= boundary and isinstance(row.get("content"), str)
        ]
        candidates = [
            RecallCandidate(
                item=RecallItem(
                    id=message_id,
                    memory_key="this",
                    chat_title="this chat",
                    message_ids=(message_id,),
                    role=role,
                    text=text,
                    tokens=COUNTER.count_text(text),
                    created_at=NOW - timedelta(days=1),
                ),
                lexical_rank=rank,
                cosine=None,
                identifier_match=False,
            )
            for rank, (message_id, text, role) in enumerate(mine, 1)
        ]
        candidates += [
            RecallCandidate(
                item=RecallItem(
                    id=10_000 + message_id,
                    memory_key="other",
                    chat_title="Trip",
                    message_ids=(message_id,),
                    role="user",
                    text=text,
                    tokens=COUNTER.count_text(text),
                    created_at=NOW - timedelta(days=400),
                ),
                lexical_rank=len(candidates) + rank,
                cosine=None,
                identifier_match=False,
            )
            for rank, (message_id, text) in enumerate(self.other, 1)
        ]
        return RecallInput(query=query, candidates=candidates, model=None, now=NOW)


def request(key: str, store: Store, index: FakeIndex, query: str) -> ContextRequest:
    async def load_recall(boundary: int | None) -> RecallInput:
        return await index.load(query, boundary)

    return ContextRequest(
        memory_key=key,
        system_prompt=SYSTEM,
        load_increment=store.load_increment,
        mode="quick-answer",
        load_recall=load_recall,
    )


def recalled_ids(context) -> list[int]:
    return [i for s in context.sources if s["kind"] == "recall" for i in s["message_ids"]]


def test_a_relevant_message_of_another_chat_comes_back_verbatim_after_the_summary():
    store = Store()
    store.add(user("hello there"), asst("Hi! How can I help?"), user("where is my blue umbrella?"))
    index = FakeIndex(store, other=[(501, "The blue umbrella is in locker 12 at the station.")])
    engine = make_engine(4096, FlakySummarizer(["ok"]), attempts=1, store=InMemorySummaryStore())
    context = async_to_sync(engine.build_context)(request("recall-1", store, index, "where is my blue umbrella?"))
    kinds = [s["kind"] for s in context.sources]
    assert kinds[:2] == ["system", "recall"]
    block = context.messages[1]["content"]
    assert block.startswith(RECALL_HEADER)
    assert '(chat "Trip", msg 501) User: The blue umbrella is in locker 12 at the station.' in block
    assert context.sections["recall"] == COUNTER.count_message(context.messages[1])
    assert context.recall["items"][0]["item_id"] == 10_501 and context.recall["model"] is None
    check_context(context, stored=store.rows, system_prompt=SYSTEM, counter=COUNTER)


def test_f33_nothing_relevant_means_no_block_and_no_reserve():
    store = Store()
    store.add(user("hello there"), asst("Hi!"), user("what is the refund policy for flights?"))
    index = FakeIndex(store, other=[(501, "My cat likes tuna.")])
    engine = make_engine(4096, FlakySummarizer(["ok"]), attempts=1, store=InMemorySummaryStore())
    context = async_to_sync(engine.build_context)(request("recall-2", store, index, "refund policy for flights"))
    assert "recall" not in [s["kind"] for s in context.sources]
    assert context.sections["recall"] == 0
    assert [r["reason"] for r in context.recall["rejected"]], "the refused candidate is reported with its reason"


def _many_relevant_items() -> list[tuple[int, str]]:
    return [(600 + n, f"The blue umbrella story, part {n}: it was left at station {n} by the seat.") for n in range(12)]


def test_the_block_grows_into_the_room_under_the_trigger_only():
    """docs/memory.md §12 "Budget": admitted items over the share fill the room a request leaves
    under the trigger; the request never crosses the trigger for them, and without the fill the
    block keeps to its share."""
    sizes = {}
    for fill in (False, True):
        store = Store()
        store.add(user("hello there"), asst("Hi! How can I help?"), user("where is my blue umbrella at the station?"))
        index = FakeIndex(store, other=_many_relevant_items())
        engine = make_engine(2048, FlakySummarizer(["ok"]), attempts=1, store=InMemorySummaryStore(), recall_fill=fill)
        context = async_to_sync(engine.build_context)(
            request(f"recall-fill-{fill}", store, index, "where is my blue umbrella at the station?")
        )
        share = engine.budget.recall_budget_tokens
        assert context.path == "under_trigger" and context.tokens <= engine.budget.trigger_tokens
        if fill:
            assert any("grew past its share" in note for note in context.recall["notes"])
            assert (
                share
                < context.recall["tokens"]
                <= engine.budget.trigger_tokens - (context.tokens - context.recall["tokens"])
            )
        else:
            assert 0 < context.recall["tokens"] <= share
            assert context.recall["over_budget"], "more items were admitted than the share holds"
        sizes[fill] = len(context.recall["items"])
        check_context(context, stored=store.rows, system_prompt=SYSTEM, counter=COUNTER)
    assert sizes[True] > sizes[False]


def test_a_failing_search_leaves_the_request_without_recall_and_says_why():
    store = Store()
    store.add(user("hello"), asst("Hi!"), user("where is my blue umbrella?"))

    async def broken(boundary: int | None) -> RecallInput:
        raise RuntimeError("index unavailable")

    engine = make_engine(4096, FlakySummarizer(["ok"]), attempts=1, store=InMemorySummaryStore())
    context = async_to_sync(engine.build_context)(
        ContextRequest(
            memory_key="recall-3",
            system_prompt=SYSTEM,
            load_increment=store.load_increment,
            mode="quick-answer",
            load_recall=broken,
        )
    )
    assert "recall" not in [s["kind"] for s in context.sources]
    assert "index unavailable" in context.recall["notes"][0]
    check_context(context, stored=store.rows, system_prompt=SYSTEM, counter=COUNTER)


words = st.sampled_from(["umbrella", "locker", "refund", "flight", "ZFA04Y", "blue", "station", "seat", "bag"])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    turns=st.lists(
        st.tuples(st.lists(words, min_size=2, max_size=8), st.integers(min_value=10, max_value=300)),
        min_size=2,
        max_size=12,
    ),
    window=st.sampled_from([1024, 2048, 4096]),
    script=st.lists(st.sampled_from(["ok", "ok", "fail"]), min_size=1, max_size=4),
    summary_role=st.sampled_from(["system", "user"]),
    strict=st.booleans(),
)
def test_f34_recall_never_repeats_a_message_of_the_request_and_the_invariants_hold(
    turns, window, script, summary_role, strict
):
    key = f"recall-property-{next(_keys)}"
    store = Store()
    index = FakeIndex(store, other=[(900 + n, " ".join(["umbrella", "locker", "blue"][: n + 1])) for n in range(3)])
    engine = make_engine(
        window,
        FlakySummarizer(script),
        attempts=1,
        store=InMemorySummaryStore(),
        summary_role=summary_role,
        strict_alternation=strict,
    )
    for question, length in turns:
        text = " ".join(question)
        store.add(user(f"{text} " + "filler " * length))
        context = async_to_sync(engine.build_context)(request(key, store, index, text))
        check_context(
            context,
            stored=store.rows,
            system_prompt=SYSTEM,
            counter=COUNTER,
            single_system=summary_role == "user",
            strict_alternation=strict,
        )
        boundary = context.summary.last_message_id or 0
        expanded = [p for s in context.sources for p in (s, *s.get("merged", []))]
        present = {p["id"] for p in expanded if p["id"] is not None}
        mine = {i for i in recalled_ids(context) if i < 900}
        assert not mine & present, "F-34: a recalled message is also verbatim in the request"
        assert all(i <= boundary for i in mine), "recall of this chat only from the summarized part"
        if context.recall["tokens"] > engine.budget.recall_budget_tokens:
            # Grown past its share: only into the room under the trigger (docs/memory.md §12).
            assert context.tokens <= engine.budget.trigger_tokens
            assert context.path == "under_trigger"
        store.add(copy.deepcopy(asst("answer " * 40)))
