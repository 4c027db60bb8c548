"""The margin above the owner's cosine background (docs/memory.md §12 "Admission gate", F-53, F-33).

A question worded unlike the message that answers it shares no word with it; with an embedder its
cosine is told apart from the rest of the owner's items by how far it stands above them. The
cosines are controlled: each item's vector is built to have an exact cosine to the query, and the
dense search runs through the real vector cache, which computes the background.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memory.recall.gate import RECALL_THRESHOLDS, admit, content_terms
from memory.recall.rank import select_recall
from memory.recall.values import BACKGROUND_MIN_ITEMS, CosineBackground, RecallCandidate, RecallItem, RecallResult
from memory.recall.vectors import VectorCache, vector_bytes
from memory.tokens.counter import get_counter

COUNTER = get_counter("gpt-4o-mini")
NOW = datetime(2026, 11, 21, 9, 0, tzinfo=UTC)
MODEL = "multilingual-e5-small"
E5 = RECALL_THRESHOLDS[MODEL]
MARGIN = E5.margin if E5.margin is not None else 0.0
OWNER = "owner-1"

QUESTION = "What kind of dogs do I have?"
SCHNAUZERS = "Ana: We share the house with two giant schnauzers who bark at every delivery van."
FILLER = [
    "Ana: Can you suggest a quick pasta dinner for tonight?",
    "Assistant: Spaghetti aglio e olio takes fifteen minutes.",
    "Ana: My laptop fan is loud when I open many browser tabs.",
    "Assistant: Closing background tabs usually quiets it.",
    "Ana: The train to work was late again this morning.",
    "Assistant: That is frustrating, I hope it improves.",
    "Ana: I started reading a novel about a lighthouse keeper.",
    "Assistant: Lighthouse stories are often quiet and moving.",
    "Ana: Remind me to renew the car insurance in March.",
    "Assistant: Noted, car insurance renewal in March.",
    "Ana: We painted the kitchen a pale green last weekend.",
    "Assistant: Pale green brightens a kitchen.",
]


def test_the_margin_is_calibrated_for_e5() -> None:
    assert E5.margin is not None and 0 < E5.margin < 0.2


def vectors_with_cosines(cosines: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """A unit query and unit item vectors whose cosines to it are exactly ``cosines``."""
    dimension = len(cosines) + 1
    query = np.zeros(dimension, dtype=np.float32)
    query[0] = 1.0
    items = np.zeros((len(cosines), dimension), dtype=np.float32)
    for k, cosine in enumerate(cosines):
        items[k, 0] = cosine
        items[k, k + 1] = np.sqrt(1.0 - cosine**2)
    return query, items


def recalled(texts: Sequence[str], cosines: Sequence[float], question: str = QUESTION) -> RecallResult:
    """Recall for ``question`` over the owner's items ``texts`` with the given cosines, as the product runs it:
    the vector cache's nearest items and background, no lexical hit (the question shares no word), the gate."""
    query, vectors = vectors_with_cosines(cosines)
    rows = [(k + 1, "chat-1", k + 1, vector_bytes(vectors[k]), MODEL, len(query)) for k in range(len(texts))]
    found = VectorCache().search(
        OWNER,
        model=MODEL,
        query=query,
        read=lambda after, ids: [row for row in rows if row[0] > after or row[0] in ids],
        eligible=lambda chats, last_ids: chats == chats,
        limit=50,
    )
    candidates = [
        RecallCandidate(
            item=item(hit.id, texts[hit.id - 1]), lexical_rank=None, cosine=hit.cosine, identifier_match=False
        )
        for hit in found.hits
    ]
    return select_recall(
        candidates,
        query=question,
        now=NOW,
        budget_tokens=1000,
        thresholds=E5,
        counter=COUNTER,
        background=found.background,
    )


def item(id: int, text: str) -> RecallItem:
    return RecallItem(
        id=id,
        memory_key="chat-1",
        chat_title="House",
        message_ids=(id,),
        role="assistant" if text.startswith("Assistant:") else "user",
        text=text,
        tokens=COUNTER.count_text(text),
        created_at=NOW - timedelta(days=7),
    )


# The paraphrase's cosine with the bundled model; the owner's other items sit a little more than the margin below
# it, spread as e5's cosines of unrelated text are (bench/recall_calibrate.py).
COSINE = 0.842
OFFSETS = [0.004, -0.003, 0.006, -0.005, 0.001, -0.002, 0.003, -0.006, 0.002, 0.0, -0.001, 0.005]
FILLER_COSINES = [round(COSINE - MARGIN - 0.01 + offset, 3) for offset in OFFSETS]


def test_f53_a_paraphrase_standing_clearly_above_the_owners_background_is_recalled() -> None:
    median = float(np.median([*FILLER_COSINES, COSINE]))  # the paraphrase is one of the owner's items too
    cosine = COSINE
    assert E5.moderate is not None and E5.high is not None and E5.moderate <= cosine < E5.high
    assert cosine - median >= MARGIN + 0.005
    assert not content_terms(QUESTION) & content_terms(SCHNAUZERS), "the question shares no word with it"

    result = recalled([SCHNAUZERS, *FILLER], [cosine, *FILLER_COSINES])

    assert [s.item.text for s in result.items] == [SCHNAUZERS]
    (entry,) = result.items
    assert entry.reason == (
        f"cosine {cosine:.3f}, {cosine - median:.3f} above this owner's background "
        f"(needs {MARGIN:.2f}; median {median:.3f} of 13 items)"
    )
    assert result.message is not None and "giant schnauzers" in result.message["content"]
    # Only the paraphrase: the owner's other items stay in their background.
    assert all("above this owner's background" in r.reason and not r.admitted for r in result.rejected)


def test_f53_the_same_cosine_without_a_background_is_refused_as_before() -> None:
    cosine = COSINE
    candidate = RecallCandidate(item=item(1, SCHNAUZERS), lexical_rank=None, cosine=cosine, identifier_match=False)
    verdict, reason = admit(candidate, query_terms=content_terms(QUESTION), thresholds=E5)
    assert (verdict, reason) == (False, f"cosine {cosine:.3f} ≥ {E5.moderate:.2f} but no lexical hit (0/2 query terms)")
    # Too few items of the owner for a background to mean anything: today's gate.
    few = BACKGROUND_MIN_ITEMS - 1
    result = recalled([SCHNAUZERS, *FILLER[: few - 1]], [cosine, *FILLER_COSINES[: few - 1]])
    assert result.items == ()
    assert [r.reason for r in result.rejected][:1] == [reason]


def test_f53_a_background_as_high_as_the_candidate_admits_nothing() -> None:
    cosine = COSINE
    high_background = [cosine - 0.002 - 0.004 * (k % 5) for k in range(len(FILLER))]
    result = recalled([SCHNAUZERS, *FILLER], [cosine, *high_background])
    assert result.items == ()
    best = result.rejected[0]
    assert best.item.text == SCHNAUZERS
    assert f"above this owner's background (needs {MARGIN:.2f}; " in best.reason


def test_f33_a_question_about_nothing_in_the_history_recalls_nothing_with_the_margin_rule() -> None:
    """400 items whose cosines to the question are e5's for unrelated text: around 0.75 with a median absolute
    deviation of 0.012 (bench/recall_calibrate.py on LoCoMo); the best of them stands out by chance only."""
    rng = np.random.default_rng(33)
    cosines = np.clip(rng.normal(0.75, 0.012 * 1.4826, size=400), 0.6, 0.87)
    texts = [f"{FILLER[k % len(FILLER)]} ({k})" for k in range(len(cosines))]
    result = recalled(texts, [float(c) for c in cosines], question="What is the boiling point of mercury?")
    assert result.items == () and result.message is None
    assert result.rejected and all(not r.admitted for r in result.rejected)


def test_the_background_is_the_median_and_median_absolute_deviation_of_the_eligible_items_only() -> None:
    assert CosineBackground.of([]) == CosineBackground(items=0, median=0.0, spread=0.0)
    background = CosineBackground.of(np.array([0.70, 0.74, 0.75, 0.76, 0.90]))
    assert background.items == 5 and background.median == pytest.approx(0.75)
    assert background.spread == pytest.approx(0.01)
    assert not background.usable and CosineBackground.of([0.7] * BACKGROUND_MIN_ITEMS).usable

    query, vectors = vectors_with_cosines([0.9, 0.8, 0.7, 0.6])
    rows = [(k + 1, f"chat-{k % 2}", k + 1, vector_bytes(vectors[k]), MODEL, len(query)) for k in range(4)]
    found = VectorCache().search(
        OWNER,
        model=MODEL,
        query=query,
        read=lambda after, ids: [row for row in rows if row[0] > after],
        eligible=lambda chats, last_ids: chats == "chat-1",  # items 2 and 4
        limit=1,
    )
    assert [hit.id for hit in found.hits] == [2]
    assert found.background.items == 2 and found.background.median == pytest.approx(0.7, abs=1e-6)
