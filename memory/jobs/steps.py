"""The four steps of a conversation's memory job (docs/memory.md §10), in the order they run:
pre-compression, key-fact extraction, indexing for recall, embedding. Each keeps its own
watermark; a step that raises leaves it where it was (no loss on failure)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from memory.context.builder import ContextBuilder
from memory.facts.extraction import (
    EXTRACTION_SCHEMA,
    EXTRACTION_SCHEMA_NAME,
    ExtractionInput,
    extraction_prompt,
    parse_extraction,
    validate_extraction,
)
from memory.facts.store import FactStore
from memory.facts.values import KeyFact
from memory.jobs.state import JobStore
from memory.ports import ConversationSource, Embedder, Notice, SummaryRequest
from memory.recall.index import RecallIndex
from memory.recall.pieces import message_pieces
from memory.summary.chain import SummarizerChain
from memory.tokens.counter import TokenCounter

logger = logging.getLogger(__name__)


class FactExtractionFailed(Exception):
    """Every summarizer attempt failed for a key-fact extraction (docs/memory.md F-29): nothing
    changed and the step's watermark stays."""


class EmbeddingFailed(Exception):
    """The embedder failed on the first batch of a run: nothing stored, the watermark stays."""


async def _new_messages(jobs: JobStore, source: ConversationSource, memory_key: str, step: str) -> bool:
    """Whether the conversation has stored messages after step ``step``'s watermark."""
    state = await jobs.get(memory_key)
    return await source.has_messages_after(memory_key, after=state.watermarks.get(step))


class PreCompression:
    """Compresses ahead of the next request (docs/memory.md §10, "pre-compression"): plans it as
    if a user message of ``next_message_tokens`` arrived and compresses now when it would cross
    the trigger, so the next turn makes no summarizer call before its first token. Watermark: the
    newest message it planned with. ``builder()`` gives the engine to plan with (as the next
    request will be budgeted); ``forget`` removes the memory state of a conversation found gone
    (docs/memory.md F-41)."""

    name = "precompress"

    def __init__(
        self,
        *,
        builder: Callable[[], Awaitable[ContextBuilder]],
        source: ConversationSource,
        next_message_tokens: int,
        forget: Callable[[str], Awaitable[None]],
    ) -> None:
        self.builder = builder
        self.source = source
        self.next_message_tokens = next_message_tokens
        self.forget = forget

    async def due(self, memory_key: str) -> bool:
        planned = await self._plan(memory_key)
        if planned is None:
            return False
        engine, request, tokens, _ = planned
        return await engine.precompress_due(request, next_message_tokens=tokens)

    async def run(self, memory_key: str, watermark: int | None) -> int | None:
        planned = await self._plan(memory_key)
        if planned is None:
            await self.forget(memory_key)
            return watermark
        engine, request, tokens, last_id = planned
        context = await engine.precompress(request, next_message_tokens=tokens)
        if not await self.source.has_messages_after(memory_key, after=None):
            await self.forget(memory_key)
        elif context is not None and context.events:
            await self.source.notify(memory_key, Notice(compressions=context.events))
        return last_id

    async def _plan(self, memory_key: str) -> tuple[ContextBuilder, Any, int, int] | None:
        """The engine, the imagined next request, the tokens of its next message (with room for
        the recall block and the app's reserve) and the newest message id."""
        nxt = await self.source.next_request(memory_key)
        if nxt is None:
            return None
        engine = await self.builder()
        budget = engine.budget
        reserve = int(budget.target_tokens * nxt.reserve_share) + budget.recall_budget_tokens
        request = replace(nxt.request, compression="sync", origin="job")
        return engine, request, self.next_message_tokens + reserve, nxt.last_message_id


class FactExtraction:
    """Extracts key facts with the summarizer model (docs/memory.md §11, "LLM extraction").
    Watermark: the newest message extracted from.

    Each run reads the messages after the watermark in batches of ``batch_size`` (fewer when the
    prompt would not fit the smallest summarizer window, or when the reply was cut off), at most
    ``max_batches`` per run (None: all; then ``more`` queues the next run), asks the chain with
    the JSON schema, validates in code and stores the accepted facts. A failed first batch
    changes nothing and raises (F-29); after a good batch the run stops there.
    """

    name = "extract_facts"
    batch_size = 40
    max_tokens = 800
    max_prompt_facts = 80

    def __init__(
        self,
        *,
        chain: SummarizerChain,
        source: ConversationSource,
        facts: FactStore,
        jobs: JobStore,
        counter: TokenCounter,
        windows: list[int],
        enabled: bool = True,
        max_batches: int | None = 3,
        more: Callable[[str], object] | None = None,
        forget: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.forget = forget
        self.chain = chain
        self.source = source
        self.facts = facts
        self.jobs = jobs
        self.counter = counter
        self.windows = windows
        self.enabled = enabled
        self.max_batches = max_batches
        self.more = more
        self.last_rejected: list[dict[str, Any]] = []
        self.last_created: list[KeyFact] = []

    async def due(self, memory_key: str) -> bool:
        return self.enabled and await _new_messages(self.jobs, self.source, memory_key, self.name)

    async def run(self, memory_key: str, watermark: int | None) -> int | None:
        self.last_rejected, self.last_created = [], []
        done, batches = watermark, 0
        while True:
            if self.max_batches is not None and batches >= self.max_batches:
                # A long backlog must not hold the job (and the pre-compression after it) for minutes.
                if self.more is not None:
                    self.more(memory_key)
                break
            batches += 1
            batch = await self.source.messages_after(memory_key, after=done, limit=self.batch_size)
            if batch is None or not batch.messages:
                break
            try:
                included = await self._extract(memory_key, batch.scope_key, batch.messages)
            except Exception as exc:
                if done == watermark:
                    raise
                logger.warning("key-fact extraction of %s stopped after message %s: %s", memory_key, done, exc)
                break
            done = batch.messages[included - 1]["id"]
            if included == len(batch.messages) < self.batch_size:
                break
        if not await self.source.has_messages_after(memory_key, after=None):
            if self.forget is not None:
                await self.forget(memory_key)
            return watermark
        if self.last_created:
            await self.source.notify(memory_key, Notice(facts=await self.facts.every(memory_key)))
        return done

    @property
    def reply_tokens(self) -> int:
        """The reply's cap: ``max_tokens``, at most a quarter of the smallest summarizer window."""
        return max(64, min(self.max_tokens, min(self.windows) // 4))

    async def _extract(self, memory_key: str, scope_key: str, messages: list[dict[str, Any]]) -> int:
        """One batch: request, parse, validate, store. Returns how many of ``messages`` (the first
        ones) it covered: all, unless the prompt had to be shortened or the reply was cut off."""
        # The newest facts only: a chat with hundreds of facts must still fit a small window.
        active = (await self.facts.active(memory_key))[-self.max_prompt_facts :]
        data, prompt = self._fitting(messages, active)
        while True:
            result = await self.chain.run(
                SummaryRequest(
                    previous_summary="",
                    messages=data.messages,
                    prompt=prompt,
                    max_tokens=self.reply_tokens,
                    response_format={
                        "type": "json_schema",
                        "json_schema": {"name": EXTRACTION_SCHEMA_NAME, "schema": EXTRACTION_SCHEMA, "strict": True},
                    },
                )
            )
            if result.text is not None:
                break
            errors = "; ".join(attempt.error for attempt in result.attempts if attempt.error)
            cut_off = any(attempt.error.startswith("TruncatedSummaryError") for attempt in result.attempts)
            if not cut_off or len(data.messages) == 1:
                raise FactExtractionFailed(f"every summarizer attempt failed: {errors}"[:500])
            data = ExtractionInput(messages=data.messages[: len(data.messages) // 2], facts=active)
            prompt = extraction_prompt(data)
        messages = messages[: len(data.messages)]
        validation = validate_extraction(
            parse_extraction(result.text), data, extractor=f"llm:{result.attempts[-1].model}"
        )
        if validation.rejected:
            logger.info(
                "key-fact extraction of %s rejected %s item(s): %s",
                memory_key,
                len(validation.rejected),
                validation.rejected,
            )
            self.last_rejected.extend(validation.rejected)
        created = await self.facts.apply(
            memory_key,
            scope_key=scope_key,
            candidates=validation.accepted,
            valid_from={message["id"]: message["created_at"] for message in messages},
        )
        self.last_created.extend(created)
        return len(messages)

    def _fitting(
        self, messages: list[dict[str, Any]], facts: list[KeyFact]
    ) -> tuple[ExtractionInput, list[dict[str, Any]]]:
        """The input and prompt of the longest prefix of ``messages`` (at least one) whose prompt
        plus the reply stays within 90 % of the smallest summarizer window (tokenizers that count
        more than ours), halving until it fits."""
        room = int(min(self.windows) * 0.9) - self.reply_tokens
        count = len(messages)
        while True:
            data = ExtractionInput(
                messages=[{**message, "created_at": message["created_at"].isoformat()} for message in messages[:count]],
                facts=facts,
            )
            prompt = extraction_prompt(data)
            if count == 1 or self.counter.count_request(prompt) <= room:
                return data, prompt
            count = max(1, count // 2)


class IndexMessages:
    """Indexes stored messages for recall (docs/memory.md §12, "the index"): each becomes pieces
    of about 120 tokens, written without embeddings (so full-text recall never waits for an
    embedder); results of ``unindexed_tools`` and results that found nothing are left out. Watermark: the newest message indexed."""

    name = "index"
    batch_size = 200

    def __init__(
        self,
        *,
        source: ConversationSource,
        index: RecallIndex,
        jobs: JobStore,
        counter: TokenCounter,
        unindexed_tools: frozenset[str],
        empty_results: tuple[str, ...] = (),
    ) -> None:
        self.source = source
        self.index = index
        self.jobs = jobs
        self.counter = counter
        self.unindexed_tools = unindexed_tools
        self.empty_results = empty_results

    async def due(self, memory_key: str) -> bool:
        return await _new_messages(self.jobs, self.source, memory_key, self.name)

    async def run(self, memory_key: str, watermark: int | None) -> int | None:
        done, _ = await self.index_after(memory_key, watermark)
        return done

    async def index_after(
        self, memory_key: str, after: int | None, progress: Callable[[int, int, int], object] | None = None
    ) -> tuple[int | None, dict[str, int]]:
        """Index every message after ``after``; the newest id indexed (``after`` when none or the
        conversation is gone) and the counts ``messages``, ``inserted``, ``deleted``."""
        counts = {"messages": 0, "inserted": 0, "deleted": 0}
        done = after
        while True:
            batch = await self.source.messages_after(memory_key, after=done, limit=self.batch_size)
            if batch is None:
                return after, counts
            if not batch.messages:
                break
            pieces = message_pieces(
                batch.messages,
                counter=self.counter,
                calls=batch.calls,
                skip_tools=self.unindexed_tools,
                empty_results=self.empty_results,
            )
            inserted, deleted = await self.index.write(
                memory_key=memory_key,
                scope_key=batch.scope_key,
                message_ids=[message["id"] for message in batch.messages],
                pieces=pieces,
            )
            counts["messages"] += len(batch.messages)
            counts["inserted"] += inserted
            counts["deleted"] += deleted
            done = batch.messages[-1]["id"]
            if progress is not None:
                progress(counts["messages"], inserted, deleted)
            if len(batch.messages) < self.batch_size:
                break
        return done, counts


class EmbedItems:
    """Embeds indexed items (docs/memory.md §12, "embeddings"), oldest first, at most
    ``max_items`` per run. Watermark: the newest message id among the items embedded. An
    embedder failure on the first batch stores nothing and raises :class:`EmbeddingFailed`;
    items without an embedding are still found by full-text search."""

    name = "embed"
    max_items = 512

    def __init__(
        self, *, index: RecallIndex, embedder: Embedder | None, jobs: JobStore, source: ConversationSource
    ) -> None:
        self.index = index
        self.embedder = embedder
        self.jobs = jobs
        self.source = source

    async def due(self, memory_key: str) -> bool:
        if self.embedder is None:
            return False
        if await self.index.unembedded_exist(memory_key=memory_key, model=self.embedder.model):
            return True
        return await _new_messages(self.jobs, self.source, memory_key, IndexMessages.name)

    async def run(self, memory_key: str, watermark: int | None) -> int | None:
        done, _ = await self.embed(memory_key, watermark, limit=self.max_items)
        return done

    async def embed(
        self,
        memory_key: str,
        watermark: int | None,
        *,
        limit: int | None,
        progress: Callable[[int], object] | None = None,
    ) -> tuple[int | None, int]:
        """Embed up to ``limit`` items (None: all); the new watermark and how many were embedded."""
        embedder = self.embedder
        if embedder is None:
            return watermark, 0
        done, embedded = watermark, 0
        while limit is None or embedded < limit:
            items = await self.index.unembedded(memory_key=memory_key, model=embedder.model)
            if not items:
                break
            try:
                vectors = await embedder.embed([text for _, text, _ in items], kind="passage")
                if vectors.shape[0] != len(items):
                    raise ValueError(f"{vectors.shape[0]} vectors for {len(items)} texts")
            except Exception as exc:
                if embedded == 0 and limit is not None:
                    raise EmbeddingFailed(f"{type(exc).__name__}: {exc}"[:500]) from exc
                if limit is None:
                    raise
                logger.warning("embedding of %s stopped after %s item(s): %s", memory_key, embedded, exc)
                break
            await self.index.save_embeddings(
                vectors={item_id: vectors[row] for row, (item_id, _, _) in enumerate(items)}, model=embedder.model
            )
            embedded += len(items)
            newest = max(last_id for _, _, last_id in items)
            done = newest if done is None else max(done, newest)
            if progress is not None:
                progress(embedded)
        return done, embedded
