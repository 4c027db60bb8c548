"""Recall ranking (docs/memory.md §12): admission gate, fusion, floored decay, budget, block.

Pure functions of memory/recall/; docs/memory.md F-33 (nothing relevant, nothing recalled) and F-35
(decay breaks ties only) are covered here, the storage side in the index's tests.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory.recall.block import RECALL_HEADER, recall_block, recall_line
from memory.recall.gate import (
    DENSE_WEIGHT,
    LEXICAL_THRESHOLDS,
    RECALL_THRESHOLDS,
    admit,
    content_terms,
    lexical_overlap,
    rarity_overlap,
    thresholds_for,
)
from memory.recall.rank import (
    RECALL_CONTEXT_ANCHORS,
    RECALL_MAX_REJECTED,
    decay,
    recall_anchors,
    recall_scored,
    rrf,
    score_candidates,
    select_recall,
)
from memory.recall.values import RARITY_MIN_DOCUMENTS, RecallCandidate, RecallItem, RecallResult, TermRarity
from memory.tokens.counter import get_counter

COUNTER = get_counter("gpt-4o-mini")
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
E5 = RECALL_THRESHOLDS["multilingual-e5-small"]


def item(id: int, text: str, *, days_ago: float = 10, role: str = "user", title: str = "Trip") -> RecallItem:
    return RecallItem(
        id=id,
        memory_key=f"chat-{id % 3}",
        chat_title=title,
        message_ids=(100 + id,),
        role=role,
        text=text,
        tokens=COUNTER.count_text(text),
        created_at=NOW - timedelta(days=days_ago),
    )


def lexical_candidates(items: list[RecallItem], query: str) -> list[RecallCandidate]:
    """What a full-text OR search over content words returns: every item sharing a query term,
    ranked by the number of shared terms (ties by id), no embedder."""
    terms = content_terms(query)
    hits = [(lexical_overlap(terms, it.text)[0], it) for it in items]
    ranked = sorted((h for h in hits if h[0] > 0), key=lambda h: (-h[0], h[1].id))
    return [
        RecallCandidate(item=it, lexical_rank=rank, cosine=None, identifier_match=False)
        for rank, (_, it) in enumerate(ranked, start=1)
    ]


# A realistic memory: an owner's earlier chats about a trip, cooking, a bug and a gym plan.
MEMORY = [
    item(1, "We booked the Hotel Gracery in Shinjuku for the Tokyo trip, check-in on March 3.", days_ago=400),
    item(2, "Great, I'll look at train passes for the Tokyo trip next week.", days_ago=399, role="assistant"),
    item(3, "My sourdough starter smells like acetone, should I feed it more often?", days_ago=200),
    item(4, "Feed it twice a day at room temperature and discard half before each feeding.", days_ago=200),
    item(5, "The deploy failed again with ECONNRESET from the payment service at 02:14.", days_ago=30),
    item(6, "I want to go to the gym three times a week and stop skipping leg day.", days_ago=5),
    item(7, "Can you remind me what time the team meeting is on Thursday?", days_ago=2),
    item(8, "Order A-48213 arrived damaged, I asked for a refund.", days_ago=60),
]


# --- decay -----------------------------------------------------------------------------------


def test_decay_is_floored_and_halves_the_remainder_every_half_life() -> None:
    assert decay(0) == 1.0
    assert decay(90) == pytest.approx(0.95)
    assert decay(180) == pytest.approx(0.925)
    assert decay(10_000) == pytest.approx(0.9, abs=1e-9)
    assert decay(-5) == 1.0  # a clock skew does not boost an item
    assert decay(90, floor=0.5, half_life_days=30) == pytest.approx(0.5625)


@pytest.mark.parametrize("kwargs", [{"floor": 1.5}, {"floor": -0.1}, {"half_life_days": 0}])
def test_decay_rejects_a_bad_floor_or_half_life(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="decay"):
        decay(1, **kwargs)


@given(st.floats(0, 1e5), st.floats(0, 1e5))
def test_decay_never_rises_with_age_and_stays_within_floor_and_one(a: float, b: float) -> None:
    young, old = sorted((a, b))
    assert 0.9 <= decay(old) <= decay(young) <= 1.0


# --- terms, overlap, gate ----------------------------------------------------------------------


def test_content_terms_drop_stop_words_and_match_inflections() -> None:
    assert content_terms("What is the name of the hotel we booked?") == content_terms("hotels name booking")
    assert "the" not in content_terms("the the the")
    assert content_terms("Shared families") == content_terms("share family")


def test_content_terms_use_character_pairs_for_cjk() -> None:
    assert content_terms("东京的酒店") == {"东京", "京的", "的酒", "酒店"}
    assert content_terms("猫") == {"猫"}
    assert content_terms("订单 A-48213 已发货") >= {"订单", "a-48213", "发货"}


def test_lexical_overlap_counts_query_terms_found_in_the_text() -> None:
    query = content_terms("Which hotel in Tokyo did we book?")  # hotel, tokyo, book
    assert lexical_overlap(query, MEMORY[0].text) == (3, 1.0)
    matched, share = lexical_overlap(query, MEMORY[1].text)
    assert matched == 1 and share == pytest.approx(1 / 3)
    assert lexical_overlap(frozenset(), "anything") == (0, 0.0)


def candidate(
    text: str, *, lexical_rank: int | None = 1, cosine: float | None = None, ident: bool = False
) -> RecallCandidate:
    return RecallCandidate(item=item(1, text), lexical_rank=lexical_rank, cosine=cosine, identifier_match=ident)


QUERY = content_terms("How often should I feed my sourdough starter?")  # often, feed, sourdough, starter


@pytest.mark.parametrize(
    ("cand", "admitted", "reason"),
    [
        (candidate("unrelated", lexical_rank=None, cosine=0.10, ident=True), True, "identifier match"),
        (candidate("unrelated", lexical_rank=None, cosine=0.90), True, "cosine 0.900 ≥ 0.88"),
        (candidate("Feed the starter daily."), True, "lexical: 2/4 query terms"),
        (candidate("Feed it daily.", cosine=0.83), True, "cosine 0.830 ≥ 0.82 and lexical hit (1/4 query terms)"),
        (candidate("Feed it daily.", lexical_rank=None, cosine=0.83), False, "but no lexical hit"),
        (candidate("Feed it daily.", cosine=0.81), False, "cosine 0.810 < 0.82"),
        (candidate("Nothing shared here.", cosine=0.85), False, "no lexical hit (0/4"),
    ],
)
def test_admit_with_the_e5_thresholds(cand: RecallCandidate, admitted: bool, reason: str) -> None:
    verdict, why = admit(cand, query_terms=QUERY, thresholds=E5)
    assert verdict is admitted
    assert reason in why


def test_admit_without_embedder_needs_the_lexical_floor() -> None:
    one_word = candidate("Feed the cat at six.")
    two_words = candidate("Feed the starter at six.")
    assert admit(one_word, query_terms=QUERY, thresholds=LEXICAL_THRESHOLDS) == (
        False,
        "lexical: only 1/4 query terms, needs 40%",
    )
    assert admit(two_words, query_terms=QUERY, thresholds=LEXICAL_THRESHOLDS)[0] is True
    # A one-word query is matched by that word.
    assert admit(one_word, query_terms=content_terms("feeding?"), thresholds=LEXICAL_THRESHOLDS)[0] is True
    # A query of stop words only has no terms: nothing but an identifier admits.
    assert admit(one_word, query_terms=content_terms("what is it?"), thresholds=LEXICAL_THRESHOLDS)[0] is False


def test_an_uncalibrated_model_ranks_by_cosine_but_admits_by_the_lexical_floor() -> None:
    thresholds = thresholds_for("text-embedding-3-small")
    assert thresholds.model == "text-embedding-3-small" and thresholds.high is None
    assert admit(candidate("unrelated", cosine=0.99), query_terms=QUERY, thresholds=thresholds)[0] is False
    assert thresholds_for(None) == LEXICAL_THRESHOLDS
    assert thresholds_for("multilingual-e5-small") is E5


# --- F-33: nothing relevant, nothing recalled -----------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "What is the boiling point of mercury?",
        "Can you explain how photosynthesis works in plants?",
        "Who won the football world cup in 1998?",
    ],
)
def test_f33_an_unrelated_question_recalls_nothing_lexical_only(query: str) -> None:
    result = select_recall(
        lexical_candidates(MEMORY, query),
        query=query,
        now=NOW,
        budget_tokens=1000,
        thresholds=LEXICAL_THRESHOLDS,
        counter=COUNTER,
    )
    assert result.items == () and result.message is None and result.tokens == 0


def test_f33_a_shared_common_word_is_not_relevance() -> None:
    query = "What time does the bakery open?"  # shares "time" with items 6 and 7
    cands = lexical_candidates(MEMORY, query)
    assert [c.item.id for c in cands] == [6, 7]
    result = select_recall(
        cands, query=query, now=NOW, budget_tokens=1000, thresholds=LEXICAL_THRESHOLDS, counter=COUNTER
    )
    assert result.items == ()
    assert {r.item.id for r in result.rejected} == {6, 7}
    assert {r.reason for r in result.rejected} == {"lexical: only 1/3 query terms, needs 40%"}


def test_f33_with_an_embedder_foreign_like_cosines_admit_nothing() -> None:
    # e5 cosines of unrelated text sit around 0.75-0.81 (bench/recall_calibrate.py).
    query = "What is the boiling point of mercury?"
    cands = [
        RecallCandidate(item=it, lexical_rank=None, cosine=0.75 + it.id * 0.008, identifier_match=False)
        for it in MEMORY
    ]
    result = select_recall(cands, query=query, now=NOW, budget_tokens=1000, thresholds=E5, counter=COUNTER)
    assert result.items == () and result.message is None
    assert len(result.rejected) == RECALL_MAX_REJECTED
    assert {r.item.id for r in result.rejected} == {8, 7, 6, 5, 4}  # the best cosines
    assert [r.score for r in result.rejected] == sorted((r.score for r in result.rejected), reverse=True)
    assert all("< 0.82" in r.reason for r in result.rejected)


# --- relevance, identifiers, CJK -------------------------------------------------------------


def test_a_relevant_question_recalls_its_turn_lexical_only() -> None:
    query = "Which hotel did we book in Tokyo?"
    result = select_recall(
        lexical_candidates(MEMORY, query),
        query=query,
        now=NOW,
        budget_tokens=1000,
        thresholds=LEXICAL_THRESHOLDS,
        counter=COUNTER,
    )
    assert [s.item.id for s in result.items] == [1]
    assert "Hotel Gracery" in result.message["content"]  # type: ignore[index]


def test_an_identifier_match_is_admitted_even_with_no_other_overlap() -> None:
    query = "status of A-48213?"
    cands = [RecallCandidate(item=MEMORY[7], lexical_rank=1, cosine=None, identifier_match=True)]
    result = select_recall(
        cands, query=query, now=NOW, budget_tokens=1000, thresholds=LEXICAL_THRESHOLDS, counter=COUNTER
    )
    assert [s.reason for s in result.items] == ["identifier match"]


def test_cjk_query_recalls_the_cjk_turn_and_not_the_unrelated_one() -> None:
    items = [
        item(1, "我们在东京订了新宿的格拉斯丽酒店，三月三日入住。", days_ago=100),
        item(2, "今天天气很好，我们去公园散步吧。", days_ago=3),
        item(3, "The Tokyo hotel is booked.", days_ago=50),
    ]
    query = "我们在东京订的酒店叫什么？"
    result = select_recall(
        lexical_candidates(items, query),
        query=query,
        now=NOW,
        budget_tokens=1000,
        thresholds=LEXICAL_THRESHOLDS,
        counter=COUNTER,
    )
    assert [s.item.id for s in result.items] == [1]
    assert "格拉斯丽酒店" in result.message["content"]  # type: ignore[index]


# --- fusion and F-35: decay breaks ties only --------------------------------------------------


def test_an_identifier_is_one_term_so_a_neighbouring_number_shares_nothing() -> None:
    """Found by a newcomer: "LN-4050" admitted a chunk holding only "LN-4049" (they shared "ln")."""
    assert content_terms("Payment for LN-4050 is due.") == {"payment", "ln-4050", "due"}
    assert content_terms("On 2023-05-08 the v2.1 build") == {"2023", "05", "08", "v2.1", "build"}
    right = item(1, "The payment for loan LN-4050 is due on Friday.")
    near = item(2, "Loan LN-4049 was closed and paid off.")
    rarity = TermRarity(documents=500, frequencies={"ln-4050": 1})
    cands = [
        RecallCandidate(item=near, lexical_rank=None, cosine=0.84, identifier_match=False),
        RecallCandidate(item=right, lexical_rank=1, cosine=0.83, identifier_match=True),
    ]
    scored = score_candidates(cands, query="LN-4050", now=NOW, thresholds=E5, rarity=rarity)
    assert {s.item.id: s.admitted for s in scored} == {1: True, 2: False}


def test_rrf_weights_the_dense_side_down() -> None:
    assert rrf(1, None) == pytest.approx(1 / 61)
    assert rrf(None, 1) == pytest.approx(0.5 / 61)
    assert rrf(1, 1) == pytest.approx(1.5 / 61)
    assert rrf(None, None) == 0.0
    assert rrf(1, 5) > rrf(5, 1)


def test_f35_a_year_old_answer_outranks_a_recent_message_that_does_not_answer() -> None:
    old = item(1, "My passport number is in the blue folder, it expires in 2031.", days_ago=365)
    recent = item(2, "I need to renew my gym membership soon.", days_ago=1)
    query = "When does my passport expire?"
    cands = [
        RecallCandidate(item=old, lexical_rank=1, cosine=0.86, identifier_match=False),
        RecallCandidate(item=recent, lexical_rank=None, cosine=0.80, identifier_match=False),
    ]
    scored = {s.item.id: s for s in score_candidates(cands, query=query, now=NOW, thresholds=E5)}
    assert scored[1].decay == pytest.approx(decay(365)) and scored[2].decay == pytest.approx(decay(1))
    assert scored[1].score > scored[2].score
    assert scored[1].admitted and not scored[2].admitted
    result = select_recall(cands, query=query, now=NOW, budget_tokens=1000, thresholds=E5, counter=COUNTER)
    assert [s.item.id for s in result.items] == [1]
    assert [s.item.id for s in result.rejected] == [2]


def test_f35_decay_does_not_reorder_clearly_different_matches() -> None:
    old = item(1, "My passport expires in 2031, it is in the blue folder.", days_ago=365)
    recent = item(2, "Passport photos are cheaper at the pharmacy near the gym.", days_ago=1)
    cands = [
        RecallCandidate(item=old, lexical_rank=1, cosine=0.87, identifier_match=False),
        RecallCandidate(item=recent, lexical_rank=8, cosine=0.83, identifier_match=False),
        *(
            RecallCandidate(
                item=item(i, f"filler {i}"), lexical_rank=None, cosine=0.86 - i / 1000, identifier_match=False
            )
            for i in range(10, 17)
        ),
    ]
    scored = score_candidates(cands, query="When does my passport expire?", now=NOW, thresholds=E5)
    assert [s.item.id for s in scored][:2] == [1, 2]
    assert scored[1].dense_rank == 9


def test_f35_between_equally_relevant_items_the_newer_wins() -> None:
    text = "The team meeting is on Thursday at 10:00 in room 4."
    older, newer = item(1, text, days_ago=300), item(2, text, days_ago=20)
    query = "When is the team meeting on Thursday?"
    # Equal evidence: same lexical rank and cosine; the listing order favours the older one.
    cands = [
        RecallCandidate(item=older, lexical_rank=1, cosine=0.85, identifier_match=False),
        RecallCandidate(item=newer, lexical_rank=1, cosine=0.85, identifier_match=False),
    ]
    scored = score_candidates(cands, query=query, now=NOW, thresholds=E5)
    assert [s.item.id for s in scored] == [2, 1]
    assert scored[0].rrf == scored[1].rrf and scored[0].score > scored[1].score
    line_tokens = COUNTER.count_message({"role": "system", "content": f"{RECALL_HEADER}\n{recall_line(newer)}"})
    result = select_recall(cands, query=query, now=NOW, budget_tokens=line_tokens, thresholds=E5, counter=COUNTER)
    assert [s.item.id for s in result.items] == [2]
    assert [s.item.id for s in result.over_budget] == [1]


@given(
    st.integers(1, 50),
    st.integers(1, 50),
    st.floats(0, 3650),
    st.floats(0, 3650),
)
def test_f35_decay_never_overturns_a_fused_gap_wider_than_its_floor(r1: int, r2: int, age1: float, age2: float) -> None:
    a = RecallCandidate(
        item=item(1, "feed starter", days_ago=age1), lexical_rank=r1, cosine=None, identifier_match=False
    )
    b = RecallCandidate(
        item=item(2, "feed starter", days_ago=age2), lexical_rank=r2, cosine=None, identifier_match=False
    )
    scored = {
        s.item.id: s for s in score_candidates([a, b], query="feed starter", now=NOW, thresholds=LEXICAL_THRESHOLDS)
    }
    if scored[1].rrf * 0.9 > scored[2].rrf:
        assert scored[1].score > scored[2].score
    if scored[2].rrf * 0.9 > scored[1].rrf:
        assert scored[2].score > scored[1].score


def test_dense_ranks_follow_cosine_and_a_duplicate_counts_once() -> None:
    a, b = item(1, "feed starter"), item(2, "feed starter often")
    cands = [
        RecallCandidate(item=a, lexical_rank=None, cosine=0.80, identifier_match=False),
        RecallCandidate(item=b, lexical_rank=3, cosine=0.90, identifier_match=False),
        RecallCandidate(item=a, lexical_rank=2, cosine=0.80, identifier_match=False),
    ]
    scored = {s.item.id: s for s in score_candidates(cands, query="feed starter", now=NOW, thresholds=E5)}
    assert len(scored) == 2
    assert (scored[2].dense_rank, scored[1].dense_rank) == (1, 2)
    assert scored[1].candidate.lexical_rank == 2
    # The dense side is fused at the model's calibrated weight (e5's is the default, 0.5).
    assert scored[1].rrf == pytest.approx(rrf(2, 2, dense_weight=E5.dense_weight))
    assert E5.dense_weight == LEXICAL_THRESHOLDS.dense_weight == DENSE_WEIGHT == 0.5
    plain = {
        s.item.id: s for s in score_candidates(cands, query="feed starter", now=NOW, thresholds=LEXICAL_THRESHOLDS)
    }
    assert plain[1].rrf == pytest.approx(rrf(2, 2)) == pytest.approx(1 / 62 + DENSE_WEIGHT / 62)


# --- budget and block --------------------------------------------------------------------------


def test_recall_block_renders_chronologically_with_provenance() -> None:
    first = item(1, "We booked Hotel Gracery.", days_ago=400)
    second = RecallItem(
        id=2,
        memory_key="chat-2",
        chat_title="",
        message_ids=(12, 13),
        role="tool",
        text='hotel_lookup({"city": "Tokyo"}) -> Gracery\nShinjuku',
        tokens=10,
        created_at=datetime(2024, 5, 20, 9, 0, tzinfo=UTC),
    )
    message, tokens = recall_block([second, first], role="system", counter=COUNTER)
    assert message == {
        "role": "system",
        "content": (
            "[Recalled from earlier — verbatim, may be outdated]\n"
            '- 2024-04-27 (chat "Trip", msg 101) User: We booked Hotel Gracery.\n'
            '- 2024-05-20 (msgs 12, 13) Tool: hotel_lookup({"city": "Tokyo"}) -> Gracery\n  Shinjuku'
        ),
    }
    assert tokens == COUNTER.count_message(message)
    with pytest.raises(ValueError, match="at least one item"):
        recall_block([], role="system", counter=COUNTER)


def budget_items() -> list[RecallCandidate]:
    texts = [
        (1, "Feed the starter twice a day.", 3, 1),
        (2, "The starter needs feeding when it smells of acetone; feed it more often.", 5, 2),
        (3, "Feed your starter daily and keep it warm.", 10, 3),
    ]
    return [
        RecallCandidate(item=item(i, text, days_ago=age), lexical_rank=rank, cosine=None, identifier_match=False)
        for i, text, age, rank in texts
    ]


def test_budget_evicts_the_lowest_score_and_renders_the_rest_chronologically() -> None:
    cands = budget_items()
    query = "How often should I feed my sourdough starter?"
    full = select_recall(
        cands, query=query, now=NOW, budget_tokens=1000, thresholds=LEXICAL_THRESHOLDS, counter=COUNTER
    )
    assert [s.item.id for s in full.items] == [3, 2, 1]  # oldest first
    two = recall_block([c.item for c in cands[:2]], role="system", counter=COUNTER)[1]
    result = select_recall(
        cands, query=query, now=NOW, budget_tokens=two, thresholds=LEXICAL_THRESHOLDS, counter=COUNTER
    )
    assert [s.item.id for s in result.items] == [2, 1]
    assert [s.item.id for s in result.over_budget] == [3]
    assert result.tokens == COUNTER.count_message(result.message) <= two  # type: ignore[arg-type]
    capped = select_recall(
        cands,
        query=query,
        now=NOW,
        budget_tokens=1000,
        thresholds=LEXICAL_THRESHOLDS,
        counter=COUNTER,
        max_items=1,
    )
    assert [s.item.id for s in capped.items] == [1]
    assert [s.item.id for s in capped.over_budget] == [2, 3]


def test_an_item_that_does_not_fit_is_skipped_and_a_smaller_one_taken() -> None:
    big = item(1, "Feed the starter. " + "It bubbles and rises and falls. " * 30, days_ago=1)
    small = item(2, "Feed the starter daily.", days_ago=1)
    cands = [
        RecallCandidate(item=big, lexical_rank=1, cosine=None, identifier_match=False),
        RecallCandidate(item=small, lexical_rank=2, cosine=None, identifier_match=False),
    ]
    result = select_recall(
        cands, query="feed starter", now=NOW, budget_tokens=60, thresholds=LEXICAL_THRESHOLDS, counter=COUNTER
    )
    assert [s.item.id for s in result.items] == [2]
    assert [s.item.id for s in result.over_budget] == [1]
    nothing = select_recall(
        cands, query="feed starter", now=NOW, budget_tokens=5, thresholds=LEXICAL_THRESHOLDS, counter=COUNTER
    )
    assert nothing.items == () and nothing.message is None and len(nothing.over_budget) == 2


WORDS = ["feed", "starter", "hotel", "tokyo", "meeting", "refund", "the", "is", "东京", "酒店", "gym"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(WORDS), min_size=1, max_size=12),
            st.one_of(st.none(), st.integers(1, 50)),
            st.one_of(st.none(), st.floats(0.6, 0.95)),
            st.booleans(),
            st.floats(0, 1000),
        ),
        max_size=25,
    ),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=5),
    st.integers(0, 400),
    st.integers(1, 12),
    st.dictionaries(st.integers(0, 24), st.lists(st.integers(0, 40), max_size=2), max_size=8),
)
def test_selection_invariants(
    specs: list[tuple[list[str], int | None, float | None, bool, float]],
    query_words: list[str],
    budget: int,
    max_items: int,
    around: dict[int, list[int]],
) -> None:
    cands = [
        RecallCandidate(
            item=item(i, " ".join(words), days_ago=age), lexical_rank=rank, cosine=cosine, identifier_match=ident
        )
        for i, (words, rank, cosine, ident, age) in enumerate(specs)
    ]
    query = " ".join(query_words)
    # Neighbours: ids 0..24 may be candidates, 25..40 only context (other items of the chats).
    by_id = {c.item.id: c.item for c in cands}
    neighbors = {
        anchor: [by_id.get(n) or item(n, f"context {n} said", days_ago=n) for n in around_ids]
        for anchor, around_ids in around.items()
    }
    result = select_recall(
        cands,
        query=query,
        now=NOW,
        budget_tokens=budget,
        thresholds=E5,
        counter=COUNTER,
        max_items=max_items,
        neighbors=neighbors,
    )
    scored = score_candidates(cands, query=query, now=NOW, thresholds=E5)
    admitted = {s.item.id for s in scored if s.admitted}
    context = [s for s in result.items if s.reason.startswith("context")]
    recalled = [s for s in result.items if not s.reason.startswith("context")]
    chosen = [s.item.id for s in recalled]
    assert all(s.admitted for s in result.items)
    assert len(chosen) <= max_items
    # Context only beside the best recalled items, at most two each, never without one (F-33).
    anchors = sorted(recalled, key=lambda s: -s.score)[:RECALL_CONTEXT_ANCHORS]
    beside = {n.id for a in anchors for n in neighbors.get(a.item.id, [])}
    assert {s.item.id for s in context} <= beside - set(chosen)
    assert len(context) <= 2 * len(anchors)
    assert len({s.item.id for s in result.items}) == len(result.items)
    assert set(chosen) | {s.item.id for s in result.over_budget} | ({s.item.id for s in context} & admitted) == admitted
    assert not {s.item.id for s in result.items} & {s.item.id for s in result.over_budget}
    assert all(not s.admitted for s in result.rejected) and len(result.rejected) <= RECALL_MAX_REJECTED
    times = [s.item.created_at for s in result.items]
    assert times == sorted(times)
    if result.items:
        assert result.message is not None
        assert result.tokens == COUNTER.count_message(result.message) <= budget
    else:
        assert result.message is None and result.tokens == 0


# --- the rarity floor (docs/memory.md §12, "gate") -------------------------------------------

# An owner's index of 1,000 items: "trip" is in 400 of them, "tokyo" in 3, "zanzibar" in one.
RARITY = TermRarity(documents=1000, frequencies={"trip": 400, "tokyo": 3, "zanzibar": 1, "hotel": 40})


def test_rarity_weights_a_rare_term_near_one_and_a_common_one_near_nothing() -> None:
    assert 0.9 < RARITY.weight("zanzibar") <= 1.0
    assert 0.7 < RARITY.weight("tokyo") < RARITY.weight("zanzibar")
    assert RARITY.weight("trip") < 0.15
    # A term the search did not count is taken as held by every item: it weighs next to nothing.
    assert RARITY.weight("unknown") < 0.01
    # A small index is measured as if it had RARITY_MIN_DOCUMENTS items: a word both of two items
    # hold is still rare, one nobody holds the rarest.
    two = TermRarity(documents=2, frequencies={"umbrella": 2, "blue": 0})
    assert 0.8 < two.weight("umbrella") < two.weight("blue")
    assert two.weight("umbrella") == pytest.approx(
        TermRarity(documents=RARITY_MIN_DOCUMENTS, frequencies={"umbrella": 2}).weight("umbrella")
    )
    mass, share = rarity_overlap(
        content_terms("Which hotel did we book on the Tokyo trip?"), "Tokyo, two nights", RARITY
    )
    assert mass == pytest.approx(RARITY.weight("tokyo"))
    assert share == pytest.approx(mass / sum(RARITY.weight(t) for t in ("hotel", "tokyo", "trip", "book")))


def test_one_rare_shared_word_admits_where_several_common_ones_do_not() -> None:
    query = content_terms("What did we eat on the Zanzibar trip?")  # eat, zanzibar, trip
    rare = candidate("The octopus curry in Zanzibar was the best meal.")
    common = candidate("What a trip! We ate so much.")  # trip, ate (not "eat": no match)
    # The count floor (no rarity known) admits neither: one term of three is under 40 %.
    assert admit(rare, query_terms=query, thresholds=LEXICAL_THRESHOLDS)[0] is False
    verdict, why = admit(rare, query_terms=query, thresholds=LEXICAL_THRESHOLDS, rarity=RARITY, best_mass=0.0)
    assert verdict is True and why.startswith("lexical: 1/3 query terms, rarity 0.9")
    verdict, why = admit(common, query_terms=query, thresholds=LEXICAL_THRESHOLDS, rarity=RARITY, best_mass=0.0)
    assert verdict is False and "needs 0.80" in why


def test_with_rarity_a_moderate_cosine_needs_a_lexical_hit_near_the_best() -> None:
    rarity = TermRarity(documents=1000, frequencies={"often": 300, "feed": 5, "sourdough": 2, "starter": 3})
    moderate = candidate("Feed it daily.", cosine=0.83)  # feed: ≈ 0.74, under the 0.8 floor
    verdict, why = admit(moderate, query_terms=QUERY, thresholds=E5, rarity=rarity, best_mass=0.0)
    assert verdict is True and "and lexical hit (1/4 query terms)" in why
    # Another candidate holds the whole question: this thin hit is under half of it, refused.
    best = rarity_overlap(QUERY, "Feed the sourdough starter often.", rarity)[0]
    verdict, why = admit(moderate, query_terms=QUERY, thresholds=E5, rarity=rarity, best_mass=best)
    assert verdict is False and "but a weak lexical hit" in why and "50% of the best" in why


def test_a_single_shared_word_must_be_most_of_what_the_query_asks_about() -> None:
    # A name in a greeting is rare in a small index, but the query is about a dinner nobody
    # mentioned (a term the index does not hold weighs the most): one word is not enough (F-33).
    small = TermRarity(documents=30, frequencies={"ann": 1, "dinner": 0})
    query = content_terms("What did Ann have for dinner?")  # ann, dinner
    greeting = candidate("Hi Ann! What is new with you?")
    verdict, why = admit(greeting, query_terms=query, thresholds=LEXICAL_THRESHOLDS, rarity=small, best_mass=0.0)
    assert verdict is False and "needs 0.80, 50%" in why
    # The same word with a second one of the query passes the lower share for several words.
    both = candidate("Ann cooked dinner for us.")
    assert admit(both, query_terms=query, thresholds=LEXICAL_THRESHOLDS, rarity=small, best_mass=0.0)[0] is True


def test_the_rarity_floor_is_relative_to_the_best_candidate_of_the_query() -> None:
    query = content_terms("Which hotel in Tokyo did we book for Zanzibar?")
    weak = candidate("The hotel in Tokyo was fine.")  # hotel + tokyo: ≈ 1.3
    strong_mass = rarity_overlap(query, "Tokyo hotel, then the Zanzibar flight", RARITY)[0]  # ≈ 2.2
    assert admit(weak, query_terms=query, thresholds=LEXICAL_THRESHOLDS, rarity=RARITY, best_mass=0.0)[0] is True
    # Under half of what the best candidate matched: refused, and the reason says so.
    verdict, why = admit(
        weak, query_terms=query, thresholds=LEXICAL_THRESHOLDS, rarity=RARITY, best_mass=3 * strong_mass
    )
    assert verdict is False and "50% of the best" in why


def test_select_recall_with_rarity_keeps_f33_nothing_shared_nothing_recalled() -> None:
    rarity = TermRarity(documents=len(MEMORY), frequencies={"quantum": 0, "chromodynamic": 0})
    result = select_recall(
        lexical_candidates(MEMORY, "quantum chromodynamics"),
        query="quantum chromodynamics",
        now=NOW,
        budget_tokens=500,
        thresholds=LEXICAL_THRESHOLDS,
        counter=COUNTER,
        rarity=rarity,
    )
    assert result.items == () and result.message is None
    # A rare word the memory does hold is recalled alone (the sourdough starter, 2 of 8 items).
    rarity = TermRarity(documents=len(MEMORY), frequencies={"sourdough": 1, "starter": 1, "smell": 1, "feed": 2})
    result = select_recall(
        lexical_candidates(MEMORY, "Why does my sourdough smell odd?"),
        query="Why does my sourdough smell odd?",
        now=NOW,
        budget_tokens=500,
        thresholds=LEXICAL_THRESHOLDS,
        counter=COUNTER,
        rarity=rarity,
    )
    assert [s.item.id for s in result.items] == [3]


def test_an_earlier_asking_of_the_same_question_is_refused_and_the_answer_admitted() -> None:
    query = "Tell me about the Zorblax quasicrystal samples"
    asked = item(1, "Tell me about the Zorblax quasicrystal samples?", days_ago=1)
    echoed = item(2, "Zorblax quasicrystal samples", days_ago=1, role="assistant")
    answer = item(3, "The Zorblax quasicrystal samples are stored in freezer B at minus 80 degrees.", days_ago=30)
    cands = [
        RecallCandidate(item=it, lexical_rank=rank, cosine=0.95, identifier_match=rank == 1)
        for rank, it in enumerate((asked, echoed, answer), start=1)
    ]
    result = select_recall(cands, query=query, now=NOW, budget_tokens=1000, thresholds=E5, counter=COUNTER)
    assert [s.item.id for s in result.items] == [3]
    assert {s.item.id: s.reason for s in result.rejected} == {
        1: "repeats the question: it holds nothing the question does not say",
        2: "repeats the question: it holds nothing the question does not say",
    }


# --- context: the items next to the best recalled ones (docs/memory.md §12, "context") -------


def chat_item(id: int, text: str, *, message_id: int, chat: str = "chat-1", role: str = "user") -> RecallItem:
    return RecallItem(
        id=id,
        memory_key=chat,
        chat_title="Trip",
        message_ids=(message_id,),
        role=role,
        text=text,
        tokens=COUNTER.count_text(text),
        created_at=NOW - timedelta(days=30, minutes=-message_id),
    )


# The question was asked in an earlier turn; the answer, next to it, names no hotel.
ASKED = chat_item(1, "Did you end up booking the Lisbon hotel?", message_id=11)
ANSWER = chat_item(2, "Yes, the one by the river, for three nights.", message_id=12, role="assistant")
BEFORE = chat_item(3, "I am planning a spring trip.", message_id=10)
LISBON_QUERY = "Which Lisbon hotel did we book?"


def test_the_best_recalled_item_brings_the_next_and_previous_items_of_its_chat() -> None:
    cands = [RecallCandidate(item=ASKED, lexical_rank=1, cosine=None, identifier_match=False)]

    def select(budget: int, neighbors: dict[int, list[RecallItem]] | None = None) -> RecallResult:
        return select_recall(
            cands,
            query=LISBON_QUERY,
            now=NOW,
            budget_tokens=budget,
            thresholds=LEXICAL_THRESHOLDS,
            counter=COUNTER,
            neighbors=neighbors,
        )

    assert [s.item.id for s in select(500).items] == [1]
    result = select(500, {1: [ANSWER, BEFORE]})
    # Chronological in the block, the answer (next) included, each with its provenance.
    assert [s.item.id for s in result.items] == [3, 1, 2]
    assert [s.reason for s in result.items if s.item.id != 1] == ["context: next to msg 11, recalled"] * 2
    assert [s.context_of for s in result.items] == [1, None, 1]
    assert result.message is not None
    assert '(chat "Trip", msg 12) Assistant: Yes, the one by the river' in result.message["content"]
    assert result.tokens == COUNTER.count_message(result.message)

    # The budget: the next item comes before the previous one, and context never displaces an
    # admitted item (it takes only the room left).
    with_answer = recall_block([ASKED, ANSWER], role="system", counter=COUNTER)[1]
    tight = select(with_answer, {1: [ANSWER, BEFORE]})
    assert [s.item.id for s in tight.items] == [1, 2] and tight.tokens <= with_answer
    only = select(recall_block([ASKED], role="system", counter=COUNTER)[1], {1: [ANSWER, BEFORE]})
    assert [s.item.id for s in only.items] == [1] and only.over_budget == ()


def test_f33_no_admitted_item_no_context() -> None:
    unrelated = [RecallCandidate(item=ASKED, lexical_rank=1, cosine=None, identifier_match=False)]
    result = select_recall(
        unrelated,
        query="What is the capital of Peru?",
        now=NOW,
        budget_tokens=500,
        thresholds=LEXICAL_THRESHOLDS,
        counter=COUNTER,
        neighbors={1: [ANSWER, BEFORE]},
    )
    assert result.items == () and result.message is None


def test_only_the_best_recalled_items_bring_context_and_an_admitted_neighbour_is_not_over_budget() -> None:
    lisbon = [
        chat_item(10 + n, f"Lisbon hotel note {n}: the Lisbon hotel booking, part {n}.", message_id=100 + 2 * n)
        for n in range(RECALL_CONTEXT_ANCHORS + 1)
    ]
    cands = [
        RecallCandidate(item=it, lexical_rank=rank, cosine=None, identifier_match=False)
        for rank, it in enumerate(lisbon, start=1)
    ]
    replies = {it.id: [chat_item(50 + it.id, f"Reply {it.id}.", message_id=it.message_ids[0] + 1)] for it in lisbon}

    def select(neighbors: dict[int, list[RecallItem]], max_items: int = 12) -> RecallResult:
        return select_recall(
            cands,
            query=LISBON_QUERY,
            now=NOW,
            budget_tokens=2000,
            thresholds=LEXICAL_THRESHOLDS,
            counter=COUNTER,
            max_items=max_items,
            neighbors=neighbors,
        )

    # Only the best three recalled items bring their replies; the fourth brings none.
    result = select(replies)
    brought = {s.item.id for s in result.items if s.reason.startswith("context")}
    assert brought == {50 + it.id for it in lisbon[:RECALL_CONTEXT_ANCHORS]}
    capped = select({lisbon[0].id: [lisbon[1]]}, max_items=1)
    # The second item, over the item limit, comes back as the first one's context instead.
    assert [s.item.id for s in capped.items] == [lisbon[0].id, lisbon[1].id]
    assert [s.item.id for s in capped.over_budget] == [it.id for it in lisbon[2:]]


def test_recall_anchors_are_the_best_admitted_items_of_this_chat_only() -> None:
    mine = chat_item(1, "Did you end up booking the Lisbon hotel?", message_id=11)
    other = chat_item(2, "The Lisbon hotel booking for the conference.", message_id=5, chat="chat-2")
    unrelated = chat_item(3, "Nothing to do with it.", message_id=7)
    cands = [
        RecallCandidate(item=other, lexical_rank=1, cosine=None, identifier_match=False),
        RecallCandidate(item=mine, lexical_rank=2, cosine=None, identifier_match=False),
        RecallCandidate(item=unrelated, lexical_rank=3, cosine=None, identifier_match=False),
    ]
    scored = recall_scored(cands, query=LISBON_QUERY, now=NOW, model=None, rarity=None)
    assert scored == tuple(score_candidates(cands, query=LISBON_QUERY, now=NOW, thresholds=LEXICAL_THRESHOLDS))
    assert recall_anchors(scored, memory_key="chat-1") == [mine]
    assert recall_anchors(scored, memory_key="chat-2") == [other]
    unrelated_only = recall_scored(cands, query="capital of Peru", now=NOW, model=None, rarity=None)
    assert recall_anchors(unrelated_only, memory_key="chat-1") == []
    # A selection given the scores selects what it would have scored itself.
    for budget in (0, 40, 500):
        kwargs: dict[str, Any] = {
            "query": LISBON_QUERY,
            "now": NOW,
            "budget_tokens": budget,
            "thresholds": LEXICAL_THRESHOLDS,
        }
        assert select_recall(cands, counter=COUNTER, scored=scored, **kwargs) == select_recall(
            cands, counter=COUNTER, **kwargs
        )
