"""The values recall works with (docs/memory.md §12): items, candidates, one request's input and result."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np


@dataclass(frozen=True, kw_only=True)
class RecallItem:
    """One indexed piece of a stored message (a ``MemoryItem`` row), verbatim; ``tokens`` is its size."""

    id: int
    memory_key: str
    chat_title: str
    message_ids: tuple[int, ...]
    role: str
    text: str
    tokens: int
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class RecallCandidate:
    """An item found for one query: ``lexical_rank`` (1 = best) and ``cosine`` (-1..1), None where missed."""

    item: RecallItem
    lexical_rank: int | None
    cosine: float | None
    identifier_match: bool


@dataclass(frozen=True, kw_only=True)
class ScoredCandidate:
    """A candidate with its score parts (``score = rrf * decay``); ``context_of``: a context item's anchor."""

    candidate: RecallCandidate
    dense_rank: int | None
    rrf: float
    decay: float
    score: float
    admitted: bool
    reason: str
    context_of: int | None = None

    @property
    def item(self) -> RecallItem:
        return self.candidate.item


@dataclass(frozen=True, kw_only=True)
class RecallResult:
    """What recall brings into one request: admitted ``items`` in block order, the block and its tokens."""

    items: tuple[ScoredCandidate, ...] = ()
    message: dict[str, Any] | None = None
    tokens: int = 0
    rejected: tuple[ScoredCandidate, ...] = ()
    over_budget: tuple[ScoredCandidate, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RecallInput:
    """What the owning app found for one request's recall (docs/memory.md §12 "Recall in the request");
    ``model`` None: lexical only; ``scored`` None: score when selecting."""

    query: str
    candidates: list[RecallCandidate]
    model: str | None
    now: datetime
    notes: list[str] = field(default_factory=list)
    latency_ms: int = 0
    embedding_ms: int = 0
    rarity: TermRarity | None = None
    neighbors: Mapping[int, Sequence[RecallItem]] = field(default_factory=dict)
    scored: tuple[ScoredCandidate, ...] | None = None
    background: CosineBackground | None = None


# Fewer eligible items give no background a margin could be measured against (docs/memory.md §12 "Admission gate").
BACKGROUND_MIN_ITEMS = 8


@dataclass(frozen=True, kw_only=True)
class CosineBackground:
    """How close the query sits to the owner's eligible items in general: their number, median cosine and median
    absolute deviation. e5 cosines are compressed, so a candidate is told apart by its height above this, not by
    its cosine alone (docs/memory.md §12 "Admission gate")."""

    items: int
    median: float
    spread: float

    @property
    def usable(self) -> bool:
        """Whether there are enough items for the median to be a background at all."""
        return self.items >= BACKGROUND_MIN_ITEMS

    @classmethod
    def of(cls, cosines: Sequence[float] | np.ndarray) -> CosineBackground:
        """The background of ``cosines``, the query's cosine to each eligible item; none at all has no items."""
        values = np.asarray(cosines, dtype=np.float64).reshape(-1)
        if not values.size:
            return cls(items=0, median=0.0, spread=0.0)
        median = float(np.median(values))
        return cls(items=int(values.size), median=median, spread=float(np.median(np.abs(values - median))))


# A smaller index cannot tell a rare word from a common one (docs/memory.md §12 "Admission gate").
RARITY_MIN_DOCUMENTS = 200


@dataclass(frozen=True, kw_only=True)
class TermRarity:
    """Query term → items of the owner's ``documents`` holding it (the gate's rarity floor); a missing term weighs 0."""

    documents: int
    frequencies: dict[str, int] = field(default_factory=dict)
    _weights: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _totals: dict[frozenset[str], float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def weight(self, term: str) -> float:
        """BM25's IDF over its maximum (docs/memory.md §12): about 1 for a term one item holds, never raises."""
        cached = self._weights.get(term)
        if cached is None:
            total = max(self.documents, RARITY_MIN_DOCUMENTS)
            held = min(total, max(0, self.frequencies.get(term, total)))
            cached = self._weights[term] = math.log(1.0 + (total - held + 0.5) / (held + 0.5)) / math.log(1.0 + total)
        return cached

    def total_weight(self, terms: frozenset[str]) -> float:
        cached = self._totals.get(terms)
        if cached is None:
            cached = self._totals[terms] = sum(self.weight(term) for term in terms)
        return cached


@dataclass(frozen=True, kw_only=True)
class LexicalHits:
    """The full-text side of one search: item ids best first, ids holding a query identifier, and their rows."""

    lexical: list[int]
    exact: list[int]
    identifiers: list[str]
    items: dict[int, RecallItem] = field(default_factory=dict)
