"""Recall for the chat app's requests (docs/memory.md §12): the engine's
:data:`memory.api.RecallLoader` over the memory index of the session's owner.

The query is the turn's user message. Its embedding gets ``MEMORY_RECALL_DEADLINE_MS``
(150 ms by default); past that, or when the embedder fails, the search is lexical only and the
request's recall report says why. A turn that knows its question and owner when it opens starts
the embedding then (:meth:`TurnRecall.prefetch`), so it runs while the turn loads its history
and searches the knowledge base, and the request waits only for what is left of it. The
full-text and vector search itself is one call to :func:`memory.api.recall_candidates`, scoped
to the owner (never another owner's items) and, for this chat, to messages already folded into
its summary (never one in the retained window).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import numpy as np
from django.conf import settings
from django.utils import timezone

from chatapp.chats.services import chat_session_scope_key
from chatapp.llm.embeddings import embedder_choice, embedder_get
from chatapp.models import ChatSession, Message
from chatapp.orm_threads import orm_async
from memory.api import (
    LexicalHits,
    RecallCandidate,
    RecallInput,
    RecallItem,
    ScoredCandidate,
    TermRarity,
    memory_item_embeddings_exist,
    memory_item_embeddings_known,
    message_text,
    recall_anchors,
    recall_candidates,
    recall_lexical_hits,
    recall_neighbors,
    recall_scored,
    recall_term_rarity,
)

logger = logging.getLogger(__name__)


class TurnRecall:
    """The recall loader of one turn: searches once per boundary and keeps the result, so the
    steps of an agent turn do not search again (docs/memory.md §12: once per turn)."""

    def __init__(
        self,
        *,
        session_id: int,
        user_message_id: int | None,
        query: str | None = None,
        scope_key: str | None = None,
        orm: Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]] = orm_async,
        deadline: bool = True,
    ) -> None:
        """``user_message_id``: the stored user message whose text is the query; ``query``: the
        query's text itself, for a question that is not stored (a replay's question, docs/replay.md)
        or one already read (it takes precedence over the message); ``scope_key``: the session
        owner's scope key when already known (with ``query``, no query reads the session). ``orm``
        runs the storage reads (the ORM threads by default; a replay passes ``sync_to_async`` to
        stay on its own connection); ``deadline``: whether the query's embedding is held to
        ``MEMORY_RECALL_DEADLINE_MS`` (a replay passes False and waits for it, so that its records
        do not depend on the machine's load, docs/replay.md)."""
        self.session_id = session_id
        self.user_message_id = user_message_id
        self.query = query
        self.scope_key = scope_key
        self.orm = orm
        self.deadline = deadline
        self._found: dict[int | None, RecallInput] = {}
        self._embedding: asyncio.Future[QueryEmbedding] | None = None

    def prefetch(self) -> None:
        """Start embedding the query now, in the background (call from the event loop as the turn
        opens): the search then awaits it instead of starting it. Nothing without both the
        query's text and the owner's scope key (the search reads them first), or when started
        already. The embedding ends by itself within ``MEMORY_RECALL_DEADLINE_MS`` and never
        raises (its failures become the report's notes)."""
        if self._embedding is None and self.query is not None and self.scope_key is not None:
            self._embedding = asyncio.ensure_future(
                query_embed(scope_key=self.scope_key, query=self.query, orm=self.orm, deadline=self.deadline)
            )

    async def __call__(self, boundary: int | None) -> RecallInput:
        """Candidates for this turn's question at summary boundary ``boundary`` (see
        :data:`memory.api.RecallLoader`). Storage errors propagate (the engine goes on without
        recall and says so)."""
        found = self._found.get(boundary)
        if found is None:
            found = await recall_search(
                session_id=self.session_id,
                user_message_id=self.user_message_id,
                boundary=boundary,
                query=self.query,
                scope_key=self.scope_key,
                orm=self.orm,
                embedding=self._embedding,
                deadline=self.deadline,
            )
            self._found = {boundary: found}
        return found


@dataclass(frozen=True, kw_only=True)
class QueryEmbedding:
    """The query's embedding for one search: ``vector``, a unit float32 vector of the embedder's
    dimension, and ``model``, the embedding model's name, both None when the search is lexical
    only; ``notes``: why it is lexical only, for the recall report; ``ms``: milliseconds the
    embedding took (0 when none was computed)."""

    vector: np.ndarray | None = None
    model: str | None = None
    notes: tuple[str, ...] = ()
    ms: int = 0


async def query_embed(
    *,
    scope_key: str,
    query: str,
    orm: Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]] = orm_async,
    has_vectors: bool | None = None,
    deadline: bool = True,
) -> QueryEmbedding:
    """Embed ``query`` for a search of owner ``scope_key``'s index with the configured embedder
    (:func:`chatapp.llm.embeddings.embedder_choice`), within ``MEMORY_RECALL_DEADLINE_MS``.
    Nothing is computed without an embedder, for a blank query, or when no item of the owner has
    an embedding of the model yet (``has_vectors``; None: looked up here): a query vector would
    find nothing (about 6 ms of CPU per turn saved with the bundled model, bench/ws_load.py).
    Never raises: past the deadline, or when the lookup or the embedder fails, the result is
    lexical only and its notes say why. ``orm`` and ``deadline`` (False: no deadline) as for
    :class:`TurnRecall`."""
    choice = embedder_choice()
    if choice.backend == "none" or not query.strip():
        return QueryEmbedding()
    started = time.perf_counter()
    try:
        if has_vectors is None:
            has_vectors = memory_item_embeddings_known(scope_key=scope_key, model=choice.model)
        if has_vectors is None:
            has_vectors = await orm(memory_item_embeddings_exist)(scope_key=scope_key, model=choice.model)
    except Exception as exc:
        logger.warning("recall embedding lookup failed for %s: %s", scope_key, exc)
        return QueryEmbedding(notes=(f"the embeddings could not be looked up ({type(exc).__name__}): lexical only",))
    if not has_vectors:
        return QueryEmbedding(notes=("nothing of this owner is embedded yet: lexical only",))
    deadline_ms = settings.MEMORY_RECALL_DEADLINE_MS
    try:
        embedder = await orm(embedder_get)()
        if embedder is None:
            return QueryEmbedding()
        vectors = await asyncio.wait_for(
            embedder.embed([query], kind="query"), timeout=deadline_ms / 1000 if deadline else None
        )
    except TimeoutError:
        return QueryEmbedding(notes=(f"the query's embedding took over {deadline_ms} ms: lexical only",))
    except Exception as exc:  # an embedder failure degrades recall, never the request
        logger.warning("recall embedding failed for %s: %s", scope_key, exc)
        return QueryEmbedding(notes=(f"the embedder failed ({type(exc).__name__}: {exc}): lexical only",))
    return QueryEmbedding(vector=vectors[0], model=embedder.model, ms=int((time.perf_counter() - started) * 1000))


async def recall_search(
    *,
    session_id: int,
    user_message_id: int | None,
    boundary: int | None,
    query: str | None = None,
    scope_key: str | None = None,
    orm: Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]] = orm_async,
    embedding: asyncio.Future[QueryEmbedding] | None = None,
    deadline: bool = True,
) -> RecallInput:
    """Search the owner's memory index for the text of message ``user_message_id`` of session
    ``session_id``, or for ``query`` when given (see the module docstring): the query embedded
    (:func:`query_embed`) while the full-text side runs (:func:`memory.api.recall_lexical_hits`,
    with the rarity of the query's terms for the gate, :func:`memory.api.recall_term_rarity`),
    then :func:`memory.api.recall_candidates` with ``MEMORY_RECALL_SCOPE`` over those hits and
    the query's vector, chat titles filled. An empty query (no text, or the session or message
    gone) finds nothing. ``scope_key``: the owner's, when known (with ``query``, the session is
    not read). ``embedding``: the query's embedding started earlier (:meth:`TurnRecall.prefetch`,
    for this ``query`` and ``scope_key``), awaited instead of started here. ``orm`` and
    ``deadline`` as for :class:`TurnRecall`. The result's ``latency_ms`` is the time this search
    took, which is what the request waits for (a prefetched embedding counts only for what was
    left of it). Storage errors of the full-text side propagate."""
    started = time.perf_counter()
    prefetched = embedding is not None and query is not None and scope_key is not None
    if embedding is None or query is None or scope_key is None:
        choice = embedder_choice()
        configured = None if choice.backend == "none" else choice.model
        subject: tuple[str, str, bool | None] | None
        if query is not None and scope_key is not None:
            subject = scope_key, query, None
        else:
            subject = await orm(_subject)(
                session_id=session_id, user_message_id=user_message_id, query=query, embedding_model=configured
            )
        if subject is None:
            return RecallInput(query="", candidates=[], model=None, now=timezone.now())
        scope_key, query, has_vectors = subject
        # The query is embedded (a task of its own) while the full-text side runs on the ORM
        # thread: the search takes the longer of the two, not their sum.
        embedding = asyncio.ensure_future(
            query_embed(scope_key=scope_key, query=query, orm=orm, has_vectors=has_vectors, deadline=deadline)
        )
    memory_key = ChatSession.memory_key_for(session_id)
    try:
        hits, rarity = await orm(_lexical)(scope_key=scope_key, memory_key=memory_key, boundary=boundary, query=query)
    except BaseException:
        if not prefetched:  # a prefetched one is the turn's: a later search may still use it
            embedding.cancel()
        raise
    embedded = await embedding
    now = timezone.now()
    if embedded.vector is None and not hits.lexical and not hits.exact:
        # Nothing found and no dense side: no candidates, and no trip to the database thread.
        candidates, rarity, scored, neighbors = [], None, None, {}
    else:
        candidates, rarity, scored, neighbors = await orm(_candidates)(
            scope_key=scope_key,
            memory_key=memory_key,
            boundary=boundary,
            query=query,
            vector=embedded.vector,
            model=embedded.model,
            hits=hits,
            rarity=rarity,
            now=now,
        )
    return RecallInput(
        query=query,
        candidates=candidates,
        neighbors=neighbors,
        scored=scored,
        model=embedded.model,
        now=now,
        notes=list(embedded.notes),
        latency_ms=int((time.perf_counter() - started) * 1000),
        embedding_ms=embedded.ms,
        rarity=rarity,
    )


def _subject(
    *, session_id: int, user_message_id: int | None, query: str | None, embedding_model: str | None = None
) -> tuple[str, str, bool | None] | None:
    """The owner's scope key, the question's text (``query`` when given, else the text of message
    ``user_message_id``) and whether any item of the owner has an embedding of
    ``embedding_model`` (False when None); None when the session or message is gone, or neither
    is given. One query, two with a model."""
    if query is not None:
        owner = ChatSession.objects.filter(pk=session_id).values_list("owner_id", "owner_session_key").first()
        if owner is None:
            return None
        scope_key, text = chat_session_scope_key(owner_id=owner[0], owner_session_key=owner[1]), query
    elif user_message_id is None:
        return None
    else:
        row = (
            Message.objects.filter(pk=user_message_id, session_id=session_id)
            .values_list("content", "session__owner_id", "session__owner_session_key")
            .first()
        )
        if row is None:
            return None
        content, owner_id, owner_session_key = row
        scope_key = chat_session_scope_key(owner_id=owner_id, owner_session_key=owner_session_key)
        text = message_text(content)
    has_vectors = bool(embedding_model) and memory_item_embeddings_exist(
        scope_key=scope_key, model=embedding_model or ""
    )
    return scope_key, text, has_vectors


def _lexical(
    *, scope_key: str, memory_key: str, boundary: int | None, query: str
) -> tuple[LexicalHits, TermRarity | None]:
    """The full-text side of the search (:func:`memory.api.recall_lexical_hits` with
    ``MEMORY_RECALL_SCOPE``, its hits' rows and chat titles read too, all while the query is
    being embedded) and, when it found something, the rarity of the query's terms in the owner's
    index (:func:`memory.api.recall_term_rarity`; None otherwise)."""
    hits = recall_lexical_hits(
        scope_key=scope_key,
        memory_key=memory_key,
        boundary=boundary,
        scope=cast(Any, settings.MEMORY_RECALL_SCOPE),  # validated by settings
        query=query,
        titles=_titles,
    )
    rarity = recall_term_rarity(scope_key=scope_key, query=query) if hits.lexical or hits.exact else None
    return hits, rarity


def _candidates(
    *,
    scope_key: str,
    memory_key: str,
    boundary: int | None,
    query: str,
    vector: np.ndarray | None,
    model: str | None,
    hits: LexicalHits,
    rarity: TermRarity | None,
    now: datetime,
) -> tuple[
    list[RecallCandidate], TermRarity | None, tuple[ScoredCandidate, ...] | None, dict[int, tuple[RecallItem, ...]]
]:
    """:func:`memory.api.recall_candidates` over the full-text ``hits`` already found, with each
    item's chat title filled (one query), ``rarity`` (computed here when the full-text side
    found nothing but the dense side did; None when nothing was found, so no gate needs it), the
    candidates gated and scored once for the request (:func:`memory.api.recall_scored`), and the
    neighbours of the best admitted ones for the block's context
    (:func:`memory.api.recall_anchors`, :func:`memory.api.recall_neighbors`; one query)."""
    found = recall_candidates(
        scope_key=scope_key,
        memory_key=memory_key,
        boundary=boundary,
        scope=cast(Any, settings.MEMORY_RECALL_SCOPE),  # validated by settings
        query=query,
        query_vector=vector,
        embedding_model=model,
        hits=hits,
        titles=_titles,
    )
    if not found:
        return found, None, None, {}
    if rarity is None:
        rarity = recall_term_rarity(scope_key=scope_key, query=query)
    scored = recall_scored(found, query=query, now=now, model=model, rarity=rarity)
    neighbors = recall_neighbors(
        scope_key=scope_key,
        memory_key=memory_key,
        boundary=boundary,
        scope=cast(Any, settings.MEMORY_RECALL_SCOPE),
        anchors=recall_anchors(scored, memory_key=memory_key),
    )
    return found, rarity, scored, neighbors


def _titles(memory_keys: set[str]) -> dict[str, str]:
    """Chat titles by memory key (one query); ``untitled`` for a chat without one."""
    ids = {ChatSession.session_id_for(key): key for key in memory_keys}
    titles = dict(ChatSession.objects.filter(pk__in=ids).values_list("pk", "title"))
    return {key: titles.get(pk) or "untitled" for pk, key in ids.items()}
