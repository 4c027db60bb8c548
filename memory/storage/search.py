"""Recall's search in the database (docs/memory.md §12): full-text hits (SQLite FTS5, PostgreSQL tsvector), term
rarity, the nearest items by cosine and neighbours, always within one owner's items."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from django.db import connection
from django.db.models import Q

from memory.facts import rules as fact_rules
from memory.models import MemoryItem
from memory.recall.gate import content_terms
from memory.recall.values import CosineBackground, LexicalHits, RecallCandidate, RecallItem, TermRarity
from memory.recall.vectors import VectorCache, VectorRow
from memory.text.fulltext import fts5_match, query_terms

# The stored, GIN-indexed full-text vector of an item on PostgreSQL (memory migration 0008).
_PG_BODY = "i.search_vector"


# Candidates per side of one search: a wide pool, since the gate decides (docs/memory.md §12 "Candidates").
RECALL_POOL = 200


# Nearest items by cosine per search; the dense thresholds were calibrated on 50 (bench/recall_calibrate.py).
RECALL_DENSE_POOL = 50


# Identifier kinds of memory.facts.rules.rule_facts that make an exact identifier match.
IDENTIFIER_KINDS = frozenset({"id", "email", "phone"})


vector_cache = VectorCache()


def _scope_sql(alias: str) -> str:
    """The owner-scope condition of a recall query; its parameters come from :func:`_scope_params`."""
    return (
        f"{alias}.scope_key = %s AND (({alias}.memory_key = %s AND {alias}.last_message_id <= %s) "
        f"OR (%s AND {alias}.memory_key <> %s))"
    )


def _scope_params(scope_key: str, memory_key: str, boundary: int | None, scope: str) -> list[Any]:
    # No boundary: nothing of this chat is in its summary yet (-1 is below every message id).
    return [scope_key, memory_key, boundary if boundary is not None else -1, scope == "owner", memory_key]


def _lexical_ids(terms: list[str], scope_params: list[Any], limit: int) -> list[int]:
    """Ids matching any of ``terms`` in scope, best first (``bm25``, ``ts_rank_cd``), at most ``limit``; else ``[]``."""
    if not terms:
        return []
    if connection.vendor == "sqlite":
        match = fts5_match(terms)
        if not match:
            return []
        sql = (
            "SELECT i.id FROM memory_memoryitem_fts JOIN memory_memoryitem i ON i.id = memory_memoryitem_fts.rowid "
            f"WHERE memory_memoryitem_fts MATCH %s AND {_scope_sql('i')} "
            "ORDER BY bm25(memory_memoryitem_fts), i.id LIMIT %s"
        )
        params: list[Any] = [match, *scope_params, limit]
    elif connection.vendor == "postgresql":
        any_term = " || ".join(["phraseto_tsquery('english', %s)"] * len(terms))
        sql = (
            f"SELECT i.id FROM memory_memoryitem i, (SELECT {any_term} AS query) q "
            f"WHERE {_PG_BODY} @@ q.query AND {_scope_sql('i')} "
            f"ORDER BY ts_rank_cd({_PG_BODY}, q.query) DESC, i.id LIMIT %s"
        )
        params = [*terms, *scope_params, limit]
    else:
        return []
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def recall_term_rarity(*, scope_key: str, query: str) -> TermRarity:
    """How rare ``query``'s content terms are among owner ``scope_key``'s items (docs/memory.md §12 "Admission
    gate"): the item count and, per term, the items the full-text search finds for it, in one statement. Other
    databases give no frequencies (only identifiers and cosines admit). Storage errors propagate."""
    terms = query_terms(query)
    # Each search term, and the content terms of the query it stands for ("东 京" for "东京").
    stands_for = {term: content_terms(term.replace(" ", "") if " " in term else term) for term in terms}
    searched = [term for term in terms if stands_for[term]]
    if connection.vendor == "sqlite":
        matches = [fts5_match([term]) for term in searched]
        searched = [term for term, match in zip(searched, matches, strict=True) if match]
        # The full-text match first: in a join SQLite tests MATCH row by row, far slower.
        counts = [
            "(SELECT count(*) FROM memory_memoryitem i WHERE i.scope_key = %s AND i.id IN "
            "(SELECT rowid FROM memory_memoryitem_fts WHERE memory_memoryitem_fts MATCH %s))"
        ] * len(searched)
        params: list[Any] = [value for match in matches if match for value in (scope_key, match)]
    elif connection.vendor == "postgresql":
        counts = [
            "(SELECT count(*) FROM memory_memoryitem i "
            f"WHERE {_PG_BODY} @@ phraseto_tsquery('english', %s) AND i.scope_key = %s)"
        ] * len(searched)
        params = [value for term in searched for value in (term, scope_key)]
    else:
        searched, counts, params = [], [], []
    sql = "SELECT " + ", ".join(["(SELECT count(*) FROM memory_memoryitem WHERE scope_key = %s)", *counts])
    with connection.cursor() as cursor:
        cursor.execute(sql, [scope_key, *params])
        row = cursor.fetchone()
    frequencies: dict[str, int] = {}
    for term, count in zip(searched, row[1:], strict=True):
        for content in stands_for[term]:
            frequencies[content] = max(frequencies.get(content, 0), int(count))
    return TermRarity(documents=int(row[0]), frequencies=frequencies)


# Rows per read of the vector cache: ordered and limited, a read walks the owner index, never the whole table.
VECTOR_READ_BATCH = 2000


def _vector_reader(scope_key: str) -> Callable[[int, Sequence[int]], Iterable[VectorRow]]:
    columns = ("id", "memory_key", "last_message_id", "embedding", "embedding_model", "embedding_dim")

    def read(after: int, ids: Sequence[int]) -> Iterable[VectorRow]:
        # Plain queries, no server-side cursor. Unordered, PostgreSQL's planner cannot know where the owner's newest
        # rows are and scanned the table for "id above the last read" (55 ms at 20,000 rows, bench/recall_scale.py).
        owner = MemoryItem.objects.filter(scope_key=scope_key)
        rows: list[VectorRow] = []
        while True:
            batch = list(owner.filter(id__gt=after).order_by("id").values_list(*columns)[:VECTOR_READ_BATCH])
            rows += batch
            if len(batch) < VECTOR_READ_BATCH:
                break
            after = batch[-1][0]
        if ids:
            rows += list(owner.filter(id__in=list(ids)).values_list(*columns))
        return rows

    return read


def recall_cache_warm(*, scope_key: str, model: str, dimension: int) -> None:
    """Read owner ``scope_key``'s vectors of ``model`` into this process's cache, so that the owner's first question
    does not wait for them (a socket opened). Storage errors propagate."""
    probe = np.zeros(dimension, dtype=np.float32)
    probe[0] = 1.0
    vector_cache.search(
        scope_key,
        model=model,
        query=probe,
        read=_vector_reader(scope_key),
        eligible=lambda chats, last_ids: np.zeros(len(chats), dtype=bool),
        limit=1,
    )


def recall_lexical_hits(
    *,
    scope_key: str,
    memory_key: str,
    boundary: int | None,
    scope: Literal["chat", "owner"],
    query: str,
    limit: int = RECALL_POOL,
    titles: Callable[[set[str]], Mapping[str, str]] | None = None,
) -> LexicalHits:
    """The full-text side of :func:`recall_candidates` alone, to run while the query is embedded: the ``limit``
    best hits and the items holding an identifier of ``query``, with their rows. Storage errors propagate."""
    scope_params = _scope_params(scope_key, memory_key, boundary, scope)
    identifiers = [
        candidate.value
        for candidate in fact_rules.rule_facts(query, message_id=0)
        if candidate.kind in IDENTIFIER_KINDS and candidate.value
    ]
    exact: list[int] = []
    for value in identifiers:
        exact.extend(_lexical_ids(query_terms(value), scope_params, limit))
    lexical = _lexical_ids(query_terms(query), scope_params, limit)
    found = list(dict.fromkeys([*lexical, *exact]))
    items = _scoped_items(found, scope_key, memory_key, boundary, scope, titles) if found else {}
    return LexicalHits(lexical=lexical, exact=exact, identifiers=identifiers, items=items)


def _scoped_items(
    ids: Sequence[int],
    scope_key: str,
    memory_key: str,
    boundary: int | None,
    scope: Literal["chat", "owner"],
    titles: Callable[[set[str]], Mapping[str, str]] | None,
) -> dict[int, RecallItem]:
    """The items ``ids`` in :func:`recall_candidates`' scope, by id, titled by ``titles`` (``""`` without)."""
    rows = MemoryItem.objects.filter(pk__in=list(ids), scope_key=scope_key).filter(
        (Q(memory_key=memory_key, last_message_id__lte=boundary) if boundary is not None else Q(pk__in=[]))
        | (~Q(memory_key=memory_key) if scope == "owner" else Q(pk__in=[]))
    )
    found = list(rows.values_list(*_ITEM_COLUMNS))
    named = titles({row[1] for row in found}) if titles is not None and found else {}
    return {row[0]: _item(row, title=named.get(row[1], "")) for row in found}


def recall_candidates(**search: Any) -> list[RecallCandidate]:
    """The candidates of :func:`recall_search` (same keyword arguments) without their background."""
    return recall_search(**search)[0]


def recall_search(
    *,
    scope_key: str,
    memory_key: str,
    boundary: int | None,
    scope: Literal["chat", "owner"],
    query: str,
    query_vector: np.ndarray | None,
    limit: int = RECALL_POOL,
    embedding_model: str | None = None,
    dense_limit: int | None = None,
    hits: LexicalHits | None = None,
    titles: Callable[[set[str]], Mapping[str, str]] | None = None,
) -> tuple[list[RecallCandidate], CosineBackground | None]:
    """The unranked items that may be recalled for ``query`` (docs/memory.md §12 "Candidates"; the caller's gate
    decides): only owner ``scope_key``'s, of this chat up to ``boundary`` or, with ``scope`` ``owner``, of its other
    chats. The best full-text hits, the nearest to ``query_vector`` (L2-normalised, compared within
    ``embedding_model``) and verbatim identifier matches; lexical hits first by rank, then by cosine. With the
    candidates, the query's cosine background over every item in scope (None without a vector). ``hits``: the
    full-text side already searched; ``titles``: memory keys → chat titles. Storage errors propagate."""
    if hits is None:
        hits = recall_lexical_hits(
            scope_key=scope_key,
            memory_key=memory_key,
            boundary=boundary,
            scope=scope,
            query=query,
            limit=limit,
            titles=titles,
        )
    lexical, exact, identifiers = hits.lexical, hits.exact, hits.identifiers
    cosines: dict[int, float] = {}
    dense: list[int] = []
    background: CosineBackground | None = None
    if query_vector is not None and query_vector.size:
        vector = np.asarray(query_vector, dtype=np.float32).reshape(-1)

        def eligible(chats: np.ndarray, last_ids: np.ndarray) -> np.ndarray:
            here = (chats == memory_key) & (last_ids <= (boundary if boundary is not None else -1))
            return here | (chats != memory_key) if scope == "owner" else here

        searched = vector_cache.search(
            scope_key,
            model=embedding_model,
            query=vector,
            read=_vector_reader(scope_key),
            eligible=eligible,
            limit=dense_limit if dense_limit is not None else min(limit, RECALL_DENSE_POOL),
            also=[*lexical, *exact],
        )
        dense = [hit.id for hit in searched.hits]
        cosines = {**searched.also, **{hit.id: hit.cosine for hit in searched.hits}}
        background = searched.background
    wanted = list(dict.fromkeys([*lexical, *exact, *dense]))
    if not wanted:
        return [], background
    # The full-text side's rows were read with its hits (while the query was being embedded).
    found = {item_id: hits.items[item_id] for item_id in wanted if item_id in hits.items}
    missing = [item_id for item_id in wanted if item_id not in hits.items]
    if missing:
        found.update(_scoped_items(missing, scope_key, memory_key, boundary, scope, titles))
    gone = [item_id for item_id in dense if item_id not in found]
    if gone:
        vector_cache.forget(scope_key, gone)
    ranks = {item_id: rank for rank, item_id in enumerate(lexical, start=1)}
    folded = [value.casefold() for value in identifiers]
    dense_ids = set(dense)
    candidates = []
    for item_id in wanted:
        item = found.get(item_id)
        if item is None:
            continue
        lowered = item.text.casefold()
        identifier_match = any(value in lowered for value in folded)
        if item_id not in ranks and item_id not in dense_ids and not identifier_match:
            continue  # found only by an identifier's phrase, without the identifier verbatim
        candidates.append(
            RecallCandidate(
                item=item,
                lexical_rank=ranks.get(item_id),
                cosine=cosines.get(item_id),
                identifier_match=identifier_match,
            )
        )
    candidates.sort(
        key=lambda c: (
            c.lexical_rank is None,
            c.lexical_rank or 0,
            -(c.cosine if c.cosine is not None else -2.0),
        )
    )
    return candidates, background


_ITEM_COLUMNS = ("id", "memory_key", "message_ids", "role", "text", "token_count", "created_at")


def _item(row: Sequence[Any], *, title: str) -> RecallItem:
    item_id, chat, message_ids, role, text, tokens, created_at = row
    return RecallItem(
        id=item_id,
        memory_key=chat,
        chat_title=title,
        message_ids=tuple(int(message_id) for message_id in message_ids),
        role=role,
        text=text,
        tokens=tokens,
        created_at=created_at,
    )


def recall_neighbors(
    *,
    scope_key: str,
    memory_key: str,
    boundary: int | None,
    scope: Literal["chat", "owner"],
    anchors: Sequence[RecallItem],
) -> dict[int, tuple[RecallItem, ...]]:
    """Per anchor id, its chat's next item then the one before (message id, then piece; docs/memory.md §12
    "Context"), each only if in :func:`recall_candidates`' scope, titled as the anchor. One statement for all
    anchors, one more for the rows. Storage errors propagate."""
    if not anchors:
        return {}
    scope_params = _scope_params(scope_key, memory_key, boundary, scope)
    # The first comparison lets the index seek; the second orders pieces of the same message.
    after = (
        "m.last_message_id >= a.last_message_id AND (m.last_message_id > a.last_message_id "
        "OR (m.last_message_id = a.last_message_id AND m.piece > a.piece))"
    )
    before = (
        "m.last_message_id <= a.last_message_id AND (m.last_message_id < a.last_message_id "
        "OR (m.last_message_id = a.last_message_id AND m.piece < a.piece))"
    )
    branches, params = [], []
    for anchor in anchors:
        for step, (condition, order) in enumerate(((after, ""), (before, " DESC"))):
            branches.append(
                f"SELECT {int(anchor.id)}, {step}, (SELECT m.id FROM memory_memoryitem m, memory_memoryitem a "
                f"WHERE a.id = {int(anchor.id)} AND m.memory_key = a.memory_key AND ({condition}) "
                f"AND {_scope_sql('m')} ORDER BY m.last_message_id{order}, m.piece{order} LIMIT 1)"
            )
            params.extend(scope_params)
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(branches), params)
        found = [(int(anchor_id), int(step), item_id) for anchor_id, step, item_id in cursor.fetchall() if item_id]
    rows = {row[0]: row for row in MemoryItem.objects.filter(pk__in=[f[2] for f in found]).values_list(*_ITEM_COLUMNS)}
    titles = {anchor.id: anchor.chat_title for anchor in anchors}
    neighbors: dict[int, list[RecallItem]] = {}
    for anchor_id, _, item_id in sorted(found, key=lambda f: (f[0], f[1])):
        if item_id in rows:
            neighbors.setdefault(anchor_id, []).append(_item(rows[item_id], title=titles[anchor_id]))
    return {anchor_id: tuple(items) for anchor_id, items in neighbors.items()}
