"""Recall ranking (docs/memory.md §12): fused ranks, floored time decay, the selection within the budget. Pure."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from memory.recall.block import RECALL_HEADER, recall_block, recall_line
from memory.recall.gate import DENSE_WEIGHT, RecallThresholds, admit, content_terms, rarity_overlap, thresholds_for
from memory.recall.values import (
    CosineBackground,
    RecallCandidate,
    RecallInput,
    RecallItem,
    RecallResult,
    ScoredCandidate,
    TermRarity,
)
from memory.tokens.counter import TokenCounter

if TYPE_CHECKING:
    pass

# How far the line-by-line token sum may overshoot the budget before a block is counted exactly.
_NEAR_MISS_TOKENS = 8


# Reciprocal-rank fusion constant (docs/memory.md §12).
RRF_K = 60


# The floored time decay (docs/memory.md §12, F-35).
DECAY_FLOOR = 0.9


DECAY_HALF_LIFE_DAYS = 90.0


# Most items in one recall block, and most rejected candidates reported to the inspector.
RECALL_MAX_ITEMS = 12


RECALL_MAX_REJECTED = 5


# The best this many recalled items of the request's own chat bring their neighbours (docs/memory.md §12).
RECALL_CONTEXT_ANCHORS = 3


def decay(age_days: float, *, floor: float = DECAY_FLOOR, half_life_days: float = DECAY_HALF_LIFE_DAYS) -> float:
    """``floor + (1 - floor) * 0.5 ** (age_days / half_life_days)`` (docs/memory.md §12, F-35): it breaks ties, never
    filters; a negative age counts as 0. Raises ValueError for ``floor`` outside 0..1 or ``half_life_days`` ≤ 0."""
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"decay floor must be within 0..1, got {floor}")
    if half_life_days <= 0:
        raise ValueError(f"decay half-life must be positive, got {half_life_days}")
    return floor + (1.0 - floor) * 0.5 ** (max(0.0, age_days) / half_life_days)


def rrf(
    lexical_rank: int | None, dense_rank: int | None, *, k: int = RRF_K, dense_weight: float = DENSE_WEIGHT
) -> float:
    """``1/(k + lexical_rank) + dense_weight/(k + dense_rank)``; a side that did not find the item adds 0."""
    lexical = 1.0 / (k + lexical_rank) if lexical_rank is not None else 0.0
    dense = dense_weight / (k + dense_rank) if dense_rank is not None else 0.0
    return lexical + dense


def score_candidates(
    candidates: Sequence[RecallCandidate],
    *,
    query: str,
    now: datetime,
    thresholds: RecallThresholds,
    rarity: TermRarity | None = None,
    background: CosineBackground | None = None,
) -> list[ScoredCandidate]:
    """Every candidate gated (:func:`admit`, ``background``: the query's cosines to all the owner's eligible items)
    and scored ``rrf * decay`` (docs/memory.md §12), best first, then newer, then higher id; an item listed twice
    counts once, with its best lexical rank."""
    unique: dict[int, RecallCandidate] = {}
    for candidate in candidates:
        seen = unique.get(candidate.item.id)
        if seen is None or (candidate.lexical_rank or 10**9) < (seen.lexical_rank or 10**9):
            unique[candidate.item.id] = candidate
    # Competition ranking: equal cosines share a rank (1, 2, 2, 4).
    cosines = sorted((c.cosine for c in unique.values() if c.cosine is not None), reverse=True)
    dense_ranks = {
        c.item.id: 1 + bisect_left(cosines, -c.cosine, key=lambda value: -value)
        for c in unique.values()
        if c.cosine is not None
    }
    query_terms = content_terms(query)
    best_mass = 0.0
    if rarity is not None:
        best_mass = max((rarity_overlap(query_terms, c.item.text, rarity)[0] for c in unique.values()), default=0.0)
    scored = []
    for candidate in unique.values():
        admitted, reason = admit(
            candidate,
            query_terms=query_terms,
            thresholds=thresholds,
            rarity=rarity,
            best_mass=best_mass,
            background=background,
        )
        dense_rank = dense_ranks.get(candidate.item.id)
        fused = rrf(candidate.lexical_rank, dense_rank, dense_weight=thresholds.dense_weight)
        factor = decay((now - candidate.item.created_at).total_seconds() / 86400.0)
        scored.append(
            ScoredCandidate(
                candidate=candidate,
                dense_rank=dense_rank,
                rrf=fused,
                decay=factor,
                score=fused * factor,
                admitted=admitted,
                reason=reason,
            )
        )
    scored.sort(key=lambda s: (-s.score, -s.item.created_at.timestamp(), -s.item.id))
    return scored


def _chronological(items: Sequence[ScoredCandidate]) -> list[ScoredCandidate]:
    return sorted(items, key=lambda s: (s.item.created_at, s.item.message_ids, s.item.id))


def select_recall(
    candidates: Sequence[RecallCandidate],
    *,
    query: str,
    now: datetime,
    budget_tokens: int,
    thresholds: RecallThresholds,
    counter: TokenCounter,
    role: str = "system",
    max_items: int = RECALL_MAX_ITEMS,
    rarity: TermRarity | None = None,
    neighbors: Mapping[int, Sequence[RecallItem]] | None = None,
    scored: Sequence[ScoredCandidate] | None = None,
    background: CosineBackground | None = None,
) -> RecallResult:
    """What to recall for ``query`` (docs/memory.md §12, F-33, F-35): admitted candidates best first while the block
    stays within ``budget_tokens`` and ``max_items`` (one that does not fit is skipped), then the ``neighbors`` of the
    :data:`RECALL_CONTEXT_ANCHORS` best in the room left (ungated, no item limit). ``scored``: from
    :func:`recall_scored`. ``item.tokens`` is trusted as a lower bound of a line. Empty when nothing is admitted or
    fits; never raises."""
    if scored is None:
        scored = score_candidates(
            candidates, query=query, now=now, thresholds=thresholds, rarity=rarity, background=background
        )
    admitted = [s for s in scored if s.admitted]
    rejected = tuple(s for s in scored if not s.admitted)[:RECALL_MAX_REJECTED]
    if not admitted or budget_tokens <= 0:
        return RecallResult(rejected=rejected, over_budget=tuple(admitted))
    # Lines are counted one by one; a token merge across a line break may make the sum differ, so a near miss is
    # counted exactly and the whole block is checked at the end.
    position = {s.item.id: i for i, s in enumerate(admitted)}
    taken: list[ScoredCandidate] = []
    over: list[ScoredCandidate] = []
    total = counter.count_message({"role": role, "content": RECALL_HEADER})

    def fits(entry: ScoredCandidate) -> int | None:
        """The block's size with ``entry`` added to ``taken``, or None when it would pass the budget."""
        if total + entry.item.tokens > budget_tokens + _NEAR_MISS_TOKENS:
            return None
        cost = counter.count_text("\n" + recall_line(entry.item))
        if total + cost <= budget_tokens:
            return total + cost
        if total + cost > budget_tokens + _NEAR_MISS_TOKENS:
            return None
        exact = recall_block([s.item for s in (*taken, entry)], role=role, counter=counter)[1]
        return exact if exact <= budget_tokens else None

    for entry in admitted:
        size = fits(entry) if len(taken) < max_items else None
        if size is None:
            over.append(entry)
        else:
            taken.append(entry)
            total = size
    # The context of the best items taken, in the room left.
    context_ids: set[int] = set()
    for entry in _context(taken, neighbors or {}, now=now):
        size = fits(entry)
        if size is not None:
            taken.append(entry)
            context_ids.add(entry.item.id)
            total = size
    by_id = {s.item.id: s for s in admitted}
    over = [s for s in over if s.item.id not in context_ids]
    if context_ids:
        rejected = tuple(s for s in scored if not s.admitted and s.item.id not in context_ids)[:RECALL_MAX_REJECTED]
    while taken:
        message, tokens = recall_block([s.item for s in taken], role=role, counter=counter)
        if tokens <= budget_tokens:
            return RecallResult(
                items=tuple(_chronological(taken)),
                message=message,
                tokens=tokens,
                rejected=rejected,
                over_budget=tuple(sorted(over, key=lambda s: position[s.item.id])),
            )
        dropped = taken.pop()
        if dropped.item.id in by_id:  # context is dropped first; an admitted item is over budget
            over.append(by_id[dropped.item.id])
    return RecallResult(rejected=rejected, over_budget=tuple(sorted(over, key=lambda s: position[s.item.id])))


def recall_scored(
    candidates: Sequence[RecallCandidate],
    *,
    query: str,
    now: datetime,
    model: str | None,
    rarity: TermRarity | None,
    background: CosineBackground | None = None,
) -> tuple[ScoredCandidate, ...]:
    """:func:`score_candidates` under the gate of ``model`` (:func:`thresholds_for`), so one request scores once."""
    thresholds = thresholds_for(model)
    return tuple(
        score_candidates(candidates, query=query, now=now, thresholds=thresholds, rarity=rarity, background=background)
    )


def recall_anchors(
    scored: Sequence[ScoredCandidate], *, memory_key: str, limit: int = RECALL_CONTEXT_ANCHORS + 2
) -> list[RecallItem]:
    """The items whose neighbours the app should fetch for the context (docs/memory.md §12): the request chat's among
    the ``limit`` best admitted, a little over the anchors, since one that does not fit brings none."""
    best = [s.item for s in scored if s.admitted][:limit]
    return [item for item in best if item.memory_key == memory_key]


def _context(
    taken: Sequence[ScoredCandidate], neighbors: Mapping[int, Sequence[RecallItem]], *, now: datetime
) -> list[ScoredCandidate]:
    """The context items the best anchors of ``taken`` offer, in order, each scored 0 and naming its anchor."""
    seen = {s.item.id for s in taken}
    offered: list[ScoredCandidate] = []
    for anchor in sorted(taken, key=lambda s: -s.score)[:RECALL_CONTEXT_ANCHORS]:
        where = ", ".join(str(i) for i in anchor.item.message_ids)
        for item in neighbors.get(anchor.item.id, ()):
            if item.id in seen:
                continue
            seen.add(item.id)
            offered.append(
                ScoredCandidate(
                    candidate=RecallCandidate(item=item, lexical_rank=None, cosine=None, identifier_match=False),
                    dense_rank=None,
                    rrf=0.0,
                    decay=decay((now - item.created_at).total_seconds() / 86400.0),
                    score=0.0,
                    admitted=True,
                    reason=f"context: next to msg {where}, recalled",
                    context_of=anchor.item.id,
                )
            )
    return offered


def recall_for(data: RecallInput, *, budget_tokens: int, counter: TokenCounter, role: str) -> RecallResult:
    """:func:`select_recall` of ``data`` under the gate of its embedding model; ``role``: the summary block's."""
    return select_recall(
        data.candidates,
        query=data.query,
        now=data.now,
        budget_tokens=budget_tokens,
        thresholds=thresholds_for(data.model),
        counter=counter,
        role=role,
        rarity=data.rarity,
        neighbors=data.neighbors,
        scored=data.scored,
        background=data.background,
    )
