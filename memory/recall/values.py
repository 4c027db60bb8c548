"""The values recall works with (docs/memory.md §12): indexed items, search candidates, the
search's input for one request and its scored, budgeted result."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, kw_only=True)
class RecallItem:
    """One indexed piece of a stored message (a :class:`memory.models.MemoryItem` row).

    ``id``: the row's primary key; ``memory_key``: its conversation; ``chat_title``: that
    conversation's title (``""`` when the owning app has not filled it); ``message_ids``: the
    stored messages it comes from, oldest first (a tool result: its call's message and itself);
    ``role``: ``user``, ``assistant`` or ``tool``; ``text``: the piece, verbatim (a tool result as
    ``name(arguments) -> result``); ``tokens``: its size in tokens; ``created_at``: when its
    newest message was stored (aware datetime).
    """

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
    """An item that may be recalled for one query, with what the search found.

    ``lexical_rank``: its place in the full-text hits (1 = best), None when the full-text search
    did not find it; ``cosine``: the cosine similarity of its embedding to the query's (-1..1),
    None when there is no embedder or the item has no embedding; ``identifier_match``: the query
    holds an identifier (an id, email or phone number by :func:`memory.facts.rule_facts`) that
    occurs verbatim in the item's text.
    """

    item: RecallItem
    lexical_rank: int | None
    cosine: float | None
    identifier_match: bool


@dataclass(frozen=True, kw_only=True)
class ScoredCandidate:
    """A candidate with the parts of its score, as the inspector shows them.

    ``dense_rank``: its place among the candidates by cosine (1 = best, equal cosines share a
    rank; None without a cosine);
    ``rrf``: :func:`rrf` of its lexical and dense ranks; ``decay``: :func:`decay` of its age;
    ``score``: ``rrf * decay``; ``admitted`` and ``reason``: the gate's verdict (:func:`admit`);
    ``context_of``: for an item brought as context (:func:`select_recall`), the id of the
    recalled item it is next to (it was not gated: score 0), else None.
    """

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
    """What recall brings into one request (docs/memory.md §12).

    ``items``: admitted candidates that fit the budget, in block (chronological) order;
    ``message``: the recall block (:func:`recall_block`), None when nothing was recalled;
    ``tokens``: its size in tokens (0 without one); ``rejected``: the best candidates the gate
    refused, best score first, at most :data:`RECALL_MAX_REJECTED`; ``over_budget``: admitted
    candidates left out for the token budget or the item limit, best score first.
    """

    items: tuple[ScoredCandidate, ...] = ()
    message: dict[str, Any] | None = None
    tokens: int = 0
    rejected: tuple[ScoredCandidate, ...] = ()
    over_budget: tuple[ScoredCandidate, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RecallInput:
    """What the owning app found for one request's recall (docs/memory.md §12), handed to the
    engine by :data:`memory.engine.RecallLoader`.

    ``query``: the current user message's text; ``candidates``: from the index, already scoped
    (this owner only; this conversation's items only up to its summary's boundary); ``model``:
    the embedding model whose cosines the candidates carry (None: lexical only, the gate is
    then :data:`LEXICAL_THRESHOLDS`); ``now``: the request's time (aware); ``notes``: what went
    wrong on the way (an embedder past its deadline or failing: lexical only); ``latency_ms``:
    milliseconds the request waited for the search (the query's embedding included, or what was
    left of it when the owning app started it earlier); ``embedding_ms``: milliseconds the query's
    embedding took from its start (0 without one); ``rarity``: how rare the query's
    terms are in the owner's index (the gate's rarity floor), None when unknown (the count
    floor); ``neighbors``: item id → the items next to it in its chat, next one first, for the
    context of the best recalled items (:func:`select_recall`; empty: no context); ``scored``:
    ``candidates`` already gated and scored (:func:`recall_scored` with ``query``, ``now``,
    ``model`` and ``rarity``), None to score them when selecting."""

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


# An index smaller than this cannot tell a rare word from a common one (in two items, a word
# both hold is "common"): rarity is measured as if it had this many items, the missing ones
# holding none of the query's words (docs/memory.md §12, "gate").
RARITY_MIN_DOCUMENTS = 200


@dataclass(frozen=True, kw_only=True)
class TermRarity:
    """How rare the query's terms are in the owner's index (docs/memory.md §12, "gate"): a single
    rare word shared with an item (a name, a place) says more than several common ones.

    ``documents``: the number of items in the owner's index; ``frequencies``: content term
    (:func:`content_terms`) of the query → the number of those items holding it, as the
    database's full-text search counts them. A query term missing from ``frequencies`` counts as
    held by every item (weight 0: it cannot admit anything on its own).
    """

    documents: int
    frequencies: dict[str, int] = field(default_factory=dict)
    # Weights already computed (a request scores a few hundred candidates against the same terms).
    _weights: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _totals: dict[frozenset[str], float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def weight(self, term: str) -> float:
        """The rarity weight of ``term``: its BM25 inverse document frequency
        ``ln(1 + (N - n + 0.5) / (n + 0.5))`` over ``ln(1 + N)`` (n: its frequency; N:
        ``documents``, at least :data:`RARITY_MIN_DOCUMENTS`), so a term held by one item of many
        weighs about 1, one held by half of them about ``ln 2 / ln(1 + N)``, one no item holds a
        little over 1. Never raises."""
        cached = self._weights.get(term)
        if cached is None:
            total = max(self.documents, RARITY_MIN_DOCUMENTS)
            held = min(total, max(0, self.frequencies.get(term, total)))
            cached = self._weights[term] = math.log(1.0 + (total - held + 0.5) / (held + 0.5)) / math.log(1.0 + total)
        return cached

    def total_weight(self, terms: frozenset[str]) -> float:
        """The sum of :meth:`weight` over ``terms`` (remembered per set of terms)."""
        cached = self._totals.get(terms)
        if cached is None:
            cached = self._totals[terms] = sum(self.weight(term) for term in terms)
        return cached


@dataclass(frozen=True, kw_only=True)
class LexicalHits:
    """The full-text side of one recall search (:meth:`memory.recall.index.RecallIndex.lexical`): ``lexical``, item
    ids matching any query term, best first; ``exact``, item ids holding an identifier of the
    query; ``identifiers``, those identifiers (ids, emails, phones, verbatim); ``items``, the
    rows of those hits by id (empty: read with the candidates)."""

    lexical: list[int]
    exact: list[int]
    identifiers: list[str]
    items: dict[int, RecallItem] = field(default_factory=dict)
