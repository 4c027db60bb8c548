"""Recall for one turn (docs/memory.md §12): the question embedded within a deadline while the
full-text side runs, then candidates, one scoring and the neighbours of the best, searched once
per summary boundary."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from memory.ports import Embedder
from memory.recall.index import Found, RecallIndex, Scope
from memory.recall.values import RecallInput

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class QueryEmbedding:
    """The question's embedding: a unit ``vector`` and its ``model`` (both None: lexical only),
    ``notes`` saying why it is lexical only, and ``ms`` it took."""

    vector: np.ndarray | None = None
    model: str | None = None
    notes: tuple[str, ...] = ()
    ms: int = 0


class TurnRecall:
    """The recall loader of one turn (a ``RecallLoader``): searches the owner's index for
    ``query`` once per boundary, so the steps of an agent turn do not search again.

    ``deadline_seconds`` bounds the question's embedding (None: wait, as replays do so that their
    records do not depend on the machine's load); past it the search is lexical only and says so.
    """

    def __init__(
        self,
        *,
        index: RecallIndex,
        embedder: Embedder | None,
        memory_key: str,
        scope_key: str,
        query: str,
        scope: Scope,
        deadline_seconds: float | None,
        now: datetime | None = None,
    ) -> None:
        self.now = now  # the request's time (a replay's recorded one); None: the clock's
        self.index = index
        self.embedder = embedder
        self.memory_key = memory_key
        self.scope_key = scope_key
        self.query = query
        self.scope: Scope = scope
        self.deadline_seconds = deadline_seconds
        self._found: dict[int | None, RecallInput] = {}
        self._embedding: asyncio.Future[QueryEmbedding] | None = None

    def prefetch(self) -> None:
        """Start embedding the question now (call as the turn opens), so the search awaits only
        what is left of it. Never raises: failures become the report's notes."""
        if self._embedding is None:
            self._embedding = asyncio.ensure_future(self._embed())

    async def __call__(self, boundary: int | None) -> RecallInput:
        found = self._found.get(boundary)
        if found is None:
            found = self._found[boundary] = await self._search(boundary)
        return found

    async def _search(self, boundary: int | None) -> RecallInput:
        started = time.perf_counter()
        if not self.query.strip():
            return RecallInput(query="", candidates=[], model=None, now=datetime.now(UTC))
        self.prefetch()
        assert self._embedding is not None
        hits, rarity = await self.index.lexical(
            scope_key=self.scope_key, memory_key=self.memory_key, boundary=boundary, scope=self.scope, query=self.query
        )
        embedded = await self._embedding
        now = self.now or datetime.now(UTC)
        found: Found = ([], None, None, {}, None)
        if embedded.vector is not None or hits.lexical or hits.exact:
            found = await self.index.candidates(
                scope_key=self.scope_key,
                memory_key=self.memory_key,
                boundary=boundary,
                scope=self.scope,
                query=self.query,
                vector=embedded.vector,
                model=embedded.model,
                hits=hits,
                rarity=rarity,
                now=now,
            )
        candidates, rarity, scored, neighbors, background = found
        return RecallInput(
            query=self.query,
            candidates=candidates,
            neighbors=neighbors,
            scored=scored,
            model=embedded.model,
            now=now,
            notes=list(embedded.notes),
            latency_ms=int((time.perf_counter() - started) * 1000),
            embedding_ms=embedded.ms,
            rarity=rarity,
            background=background,
        )

    async def _embed(self) -> QueryEmbedding:
        """The question's embedding, or why there is none. Nothing is computed without an
        embedder, for a blank question, or before the owner has an embedding of the model (a
        query vector would find nothing)."""
        embedder = self.embedder
        if embedder is None or not self.query.strip():
            return QueryEmbedding()
        started = time.perf_counter()
        try:
            known = self.index.embeddings_known(scope_key=self.scope_key, model=embedder.model)
            if known is None:
                known = await self.index.embeddings_exist(scope_key=self.scope_key, model=embedder.model)
        except Exception as exc:
            logger.warning("recall embedding lookup failed for %s: %s", self.scope_key, exc)
            return QueryEmbedding(
                notes=(f"the embeddings could not be looked up ({type(exc).__name__}): lexical only",)
            )
        if not known:
            return QueryEmbedding(notes=("nothing of this owner is embedded yet: lexical only",))
        try:
            vectors = await asyncio.wait_for(embedder.embed([self.query], kind="query"), timeout=self.deadline_seconds)
        except TimeoutError:
            deadline_ms = int((self.deadline_seconds or 0) * 1000)
            return QueryEmbedding(notes=(f"the query's embedding took over {deadline_ms} ms: lexical only",))
        except Exception as exc:  # an embedder failure degrades recall, never the request
            logger.warning("recall embedding failed for %s: %s", self.scope_key, exc)
            return QueryEmbedding(notes=(f"the embedder failed ({type(exc).__name__}: {exc}): lexical only",))
        return QueryEmbedding(vector=vectors[0], model=embedder.model, ms=int((time.perf_counter() - started) * 1000))
