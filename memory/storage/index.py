"""The recall index in the database (docs/memory.md §12): items, embeddings and the owner-scoped search."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
from asgiref.sync import sync_to_async
from django.db import transaction

from memory.models import MemoryItem
from memory.ports import ConversationAlive, RunSync
from memory.recall.index import Found, Scope
from memory.recall.pieces import IndexPiece
from memory.recall.rank import recall_anchors, recall_scored
from memory.recall.values import LexicalHits, TermRarity
from memory.recall.vectors import vector_bytes
from memory.storage.search import (
    recall_lexical_hits,
    recall_neighbors,
    recall_search,
    recall_term_rarity,
    vector_cache,
)

# Items embedded per batch by the memory job and by memory_reindex.
EMBED_BATCH = 16


def memory_items_write(
    *,
    memory_key: str,
    scope_key: str,
    message_ids: Iterable[int],
    pieces: Sequence[IndexPiece],
    alive: ConversationAlive | None = None,
) -> tuple[int, int]:
    """Make the stored items of messages ``message_ids`` equal ``pieces`` (docs/memory.md §12 "The index"); returns
    ``(inserted, deleted)``. An unchanged piece keeps its row and embedding, a changed one gets a new id, so a rewrite
    is idempotent. Nothing is written once ``alive`` fails (F-41)."""
    ids = sorted(set(message_ids))
    if not ids:
        return (0, 0)
    wanted = {piece.slot: piece for piece in pieces}
    with transaction.atomic():
        if alive is not None and not alive(memory_key):
            return (0, 0)
        stale: list[int] = []
        kept: set[tuple[int, int]] = set()
        for chunk_start in range(0, len(ids), 500):
            chunk = ids[chunk_start : chunk_start + 500]
            rows = MemoryItem.objects.filter(memory_key=memory_key, last_message_id__in=chunk).values_list(
                "id", "last_message_id", "piece", "text", "scope_key"
            )
            for item_id, last_id, number, text, owner in rows:
                piece = wanted.get((last_id, number))
                if piece is not None and piece.text == text and owner == scope_key:
                    kept.add(piece.slot)
                else:
                    stale.append(item_id)
        if stale:
            MemoryItem.objects.filter(pk__in=stale).delete()
        new = [
            MemoryItem(
                scope_key=scope_key,
                memory_key=memory_key,
                message_ids=list(piece.message_ids),
                last_message_id=piece.last_message_id,
                piece=piece.piece,
                role=piece.role,
                text=piece.text,
                search_text=piece.search_text,
                token_count=piece.tokens,
                created_at=piece.created_at,
            )
            for piece in pieces
            if piece.slot not in kept
        ]
        MemoryItem.objects.bulk_create(new, batch_size=500)
    return (len(new), len(stale))


def memory_items_unembedded(*, memory_key: str, model: str, limit: int = EMBED_BATCH) -> list[tuple[int, str, int]]:
    """``(id, text, last_message_id)`` of up to ``limit`` items of the conversation without an
    embedding of ``model`` (none, or another model's), oldest first."""
    rows = MemoryItem.objects.filter(memory_key=memory_key).exclude(embedding_model=model).order_by("id")
    return list(rows.values_list("id", "text", "last_message_id")[:limit])


def memory_item_embeddings_exist(*, scope_key: str, model: str) -> bool:
    """Whether an item of owner ``scope_key`` has an embedding of ``model`` (without one a query vector finds
    nothing); one query unless :func:`memory_item_embeddings_known` knows."""
    known = memory_item_embeddings_known(scope_key=scope_key, model=model)
    if known is not None:
        return known
    key = (scope_key, model)
    found = MemoryItem.objects.filter(scope_key=scope_key, embedding_model=model).exists()
    if found:
        _embedded_owners.add(key)
        _unembedded_until.pop(key, None)
    else:
        _unembedded_until[key] = time.monotonic() + UNEMBEDDED_RECHECK_SECONDS
    return found


# (owner, model) pairs known to have embedded items, never forgotten (a stale yes costs one futile query vector):
# a turn asks the database only until the first embedding exists.
_embedded_owners: set[tuple[str, str]] = set()


# ...and pairs known to have none, asked again after this many seconds or once this process stores one: a new
# owner's turns do not ask on every request, and another worker's first embeddings are seen within it.
UNEMBEDDED_RECHECK_SECONDS = 10.0


_unembedded_until: dict[tuple[str, str], float] = {}


def memory_item_embeddings_known(*, scope_key: str, model: str) -> bool | None:
    """What this process knows of :func:`memory_item_embeddings_exist` without a query (None: ask the database).
    Safe on the event loop, so an async caller that knows skips a database thread."""
    key = (scope_key, model)
    if key in _embedded_owners:
        return True
    if _unembedded_until.get(key, 0.0) > time.monotonic():
        return False
    return None


def memory_items_unembedded_exist(*, memory_key: str, model: str) -> bool:
    """Whether the conversation has an item without an embedding of ``model``."""
    return MemoryItem.objects.filter(memory_key=memory_key).exclude(embedding_model=model).exists()


def memory_item_embeddings_save(*, vectors: dict[int, np.ndarray], model: str) -> int:
    """Store ``model`` embeddings, item id → L2-normalised vector, skipping items deleted meanwhile; returns how
    many were stored. Touches neither the text nor the full-text index."""
    if not vectors:
        return 0
    rows = list(MemoryItem.objects.filter(pk__in=list(vectors)).only("id"))
    for row in rows:
        vector = vectors[row.pk]
        row.embedding, row.embedding_model, row.embedding_dim = vector_bytes(vector), model, int(vector.shape[-1])
    MemoryItem.objects.bulk_update(rows, ["embedding", "embedding_model", "embedding_dim"], batch_size=200)
    # Some owner has embeddings now: ask again, now and after commit (a request in between may have found none).
    _unembedded_until.clear()
    transaction.on_commit(_unembedded_until.clear)
    return len(rows)


def memory_index_status(*, memory_key: str) -> dict[str, Any]:
    """The index for the inspector: ``items``, ``embedded`` and ``models`` (model → items), in one query."""
    counts: dict[str, int] = {}
    for model in MemoryItem.objects.filter(memory_key=memory_key).values_list("embedding_model", flat=True):
        counts[model] = counts.get(model, 0) + 1
    return {
        "items": sum(counts.values()),
        "embedded": sum(count for model, count in counts.items() if model),
        "models": {model: count for model, count in counts.items() if model},
    }


def recall_cache_clear() -> None:
    """Forget this process's cached vectors and embedding lookups (tests; after an embedding model change)."""
    vector_cache.clear()
    _embedded_owners.clear()
    _unembedded_until.clear()


class OrmRecallIndex:
    """:class:`memory.recall.index.RecallIndex` over the database; ``titles`` names chats for provenance,
    ``alive`` guards every write (docs/memory.md F-41)."""

    def __init__(
        self,
        *,
        run_sync: RunSync = sync_to_async,
        titles: Callable[[set[str]], Mapping[str, str]] | None = None,
        alive: ConversationAlive | None = None,
    ) -> None:
        self.run_sync = run_sync
        self.titles = titles
        self.alive = alive

    def embeddings_known(self, *, scope_key: str, model: str) -> bool | None:
        return memory_item_embeddings_known(scope_key=scope_key, model=model)

    async def embeddings_exist(self, *, scope_key: str, model: str) -> bool:
        return bool(await self.run_sync(memory_item_embeddings_exist)(scope_key=scope_key, model=model))

    async def lexical(
        self, *, scope_key: str, memory_key: str, boundary: int | None, scope: Scope, query: str
    ) -> tuple[LexicalHits, TermRarity | None]:
        def read() -> tuple[LexicalHits, TermRarity | None]:
            hits = recall_lexical_hits(
                scope_key=scope_key,
                memory_key=memory_key,
                boundary=boundary,
                scope=scope,
                query=query,
                titles=self.titles,
            )
            rarity = recall_term_rarity(scope_key=scope_key, query=query) if hits.lexical or hits.exact else None
            return hits, rarity

        found: tuple[LexicalHits, TermRarity | None] = await self.run_sync(read)()
        return found

    async def candidates(
        self,
        *,
        scope_key: str,
        memory_key: str,
        boundary: int | None,
        scope: Scope,
        query: str,
        vector: np.ndarray | None,
        model: str | None,
        hits: LexicalHits,
        rarity: TermRarity | None,
        now: datetime,
    ) -> Found:
        def read() -> Found:
            found, background = recall_search(
                scope_key=scope_key,
                memory_key=memory_key,
                boundary=boundary,
                scope=scope,
                query=query,
                query_vector=vector,
                embedding_model=model,
                hits=hits,
                titles=self.titles,
            )
            if not found:
                return found, None, None, {}, background
            known = rarity if rarity is not None else recall_term_rarity(scope_key=scope_key, query=query)
            scored = recall_scored(found, query=query, now=now, model=model, rarity=known, background=background)
            neighbors = recall_neighbors(
                scope_key=scope_key,
                memory_key=memory_key,
                boundary=boundary,
                scope=scope,
                anchors=recall_anchors(scored, memory_key=memory_key),
            )
            return found, known, scored, neighbors, background

        result: Found = await self.run_sync(read)()
        return result

    async def write(
        self, *, memory_key: str, scope_key: str, message_ids: Sequence[int], pieces: Sequence[IndexPiece]
    ) -> tuple[int, int]:
        written: tuple[int, int] = await self.run_sync(memory_items_write)(
            memory_key=memory_key, scope_key=scope_key, message_ids=message_ids, pieces=pieces, alive=self.alive
        )
        return written

    async def unembedded(self, *, memory_key: str, model: str) -> list[tuple[int, str, int]]:
        items: list[tuple[int, str, int]] = await self.run_sync(memory_items_unembedded)(
            memory_key=memory_key, model=model
        )
        return items

    async def unembedded_exist(self, *, memory_key: str, model: str) -> bool:
        return bool(await self.run_sync(memory_items_unembedded_exist)(memory_key=memory_key, model=model))

    async def save_embeddings(self, *, vectors: dict[int, np.ndarray], model: str) -> int:
        return int(await self.run_sync(memory_item_embeddings_save)(vectors=vectors, model=model))

    async def status(self, *, memory_key: str) -> dict[str, Any]:
        status: dict[str, Any] = await self.run_sync(memory_index_status)(memory_key=memory_key)
        return status
