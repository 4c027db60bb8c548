"""The memory engine: one object, from a :class:`MemoryConfig` and three ports, owning every memory algorithm."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async

from memory.config import MemoryConfig
from memory.context.budget import MemoryBudget
from memory.context.builder import AgentMemoryMiddleware, ContextBuilder
from memory.context.request import CompressionJobs, ContextRequest, MemoryContext
from memory.facts.operations import withdrawal_sentences
from memory.facts.rules import message_rule_facts
from memory.facts.values import KeyFact
from memory.jobs.runner import JobRun, MemoryJobRunner
from memory.jobs.state import JobState, JobStep
from memory.jobs.steps import EmbedItems, FactExtraction, IndexMessages, PreCompression
from memory.ports import ConversationSource, Embedder, JobQueue, Notice, RunSync, Summarizer
from memory.recall.search import TurnRecall
from memory.storage import calibration as stored_calibration
from memory.storage import facts as stored_facts
from memory.storage import index as stored_index
from memory.storage import search as stored_search
from memory.storage import summaries as stored_summaries
from memory.storage.facts import OrmFactStore
from memory.storage.index import OrmRecallIndex
from memory.storage.job_state import OrmJobStore, memory_job_state_get
from memory.summary.archive import summary_block
from memory.summary.chain import SummarizerChain
from memory.summary.extractive import ExtractiveSummarizer
from memory.summary.store import CompressionRecord, Summary
from memory.tokens.calibration import Calibration
from memory.tokens.counter import TokenCounter, get_counter

logger = logging.getLogger(__name__)

# This process's name in job leases: a restarted process with the same pid must not inherit one.
WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

_runners: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, MemoryJobRunner] = weakref.WeakKeyDictionary()


class MemoryEngine:
    """Managed memory for one owning app's conversations (docs/architecture.md "memory engine"): ``summarizer`` and
    ``failover`` are degradation layers 1 and 2 (default: extractive); no ``embedder``, full-text recall only."""

    def __init__(
        self,
        *,
        config: MemoryConfig,
        source: ConversationSource,
        summarizer: Summarizer | None = None,
        failover: Summarizer | None = None,
        embedder: Embedder | None = None,
        run_sync: RunSync = sync_to_async,
        compression_jobs: CompressionJobs | None = None,
        queue: JobQueue | None = None,
    ) -> None:
        self.config = config
        self.source = source
        self.embedder = embedder
        self.run_sync = run_sync
        self.chain = SummarizerChain(
            primary=summarizer or ExtractiveSummarizer(),
            failover=failover,
            attempts=config.summary_attempts,
            timeout=config.summary_timeout_seconds,
        )
        self.counter: TokenCounter = get_counter(config.chat_model)
        self.summaries = stored_summaries.OrmSummaryStore(alive=source.alive, run_sync=run_sync)
        self.job_store = OrmJobStore(run_sync=run_sync)
        self.fact_store = OrmFactStore(run_sync=run_sync, alive=source.alive)
        self.index = OrmRecallIndex(run_sync=run_sync, titles=source.titles, alive=source.alive)
        self._compression_jobs = compression_jobs
        self.queue = queue
        stored_search.vector_cache.max_bytes = config.recall_cache_mb * 2**20  # the process's one cache
        self._token_factor: float | None = None
        self._builder: ContextBuilder | None = None

    @property
    def budget(self) -> MemoryBudget:
        """The request budget of the chat model, with the calibration known so far."""
        return self.config.budget(self._token_factor or 1.0)

    async def context(self, request: ContextRequest) -> MemoryContext:
        """The model-facing context of ``request`` (docs/memory.md §2-§4): compressed over the trigger in ``sync``
        mode, read only in ``background``. A failing summarizer degrades; storage errors propagate."""
        builder = await self.builder()
        return await builder.build_context(self._completed(request))

    async def before_model(self, request: ContextRequest) -> MemoryContext:
        """:meth:`context` for an agent step: a failure gives a degraded context, not an abort (docs/memory.md §4)."""
        builder = await self.builder()
        return await AgentMemoryMiddleware(builder).before_model(self._completed(request))

    def recall(self, *, memory_key: str, scope_key: str, question: str, now: datetime | None = None) -> TurnRecall:
        """One turn's recall for ``question``: pass it as ``load_recall``, call ``prefetch`` as the turn opens; ``now``
        ages the candidates (default: the clock)."""
        return TurnRecall(
            index=self.index,
            embedder=self.embedder,
            memory_key=memory_key,
            scope_key=scope_key,
            query=question,
            scope=self.config.recall_scope,
            deadline_seconds=self.config.recall_deadline_seconds,
            now=now,
        )

    async def recall_warm(self, scope_key: str) -> None:
        """Read the owner's vectors into this process's cache ahead of their first question (a socket opened), so
        that a cold read of a long history is not on a request's path; nothing without an embedder of known
        dimension. Storage errors propagate."""
        if self.embedder is None or not self.embedder.dimension:
            return
        await self.run_sync(stored_search.recall_cache_warm)(
            scope_key=scope_key, model=self.embedder.model, dimension=self.embedder.dimension
        )

    def _completed(self, request: ContextRequest) -> ContextRequest:
        return request if request.compression is not None else replace(request, compression=self.config.compression)

    async def builder(self) -> ContextBuilder:
        """The context builder of the chat model, budgeted with its calibration (read once)."""
        if self._token_factor is None:
            self._token_factor = await self.run_sync(self.token_factor)() if self.config.calibrate else 1.0
        if self._builder is None or self._builder.budget != self.budget:
            self._builder = ContextBuilder(
                budget=self.budget,
                chain=self.chain,
                counter=self.counter,
                store=self.summaries,
                jobs=self._compression_jobs or (self._scheduler() if self.config.compression == "background" else None),
                facts=self.fact_store,
                facts_scope=self.config.facts_scope,
                sync_wait_seconds=self.config.sync_wait_seconds,
                empty_results=self.config.empty_results,
            )
        return self._builder

    def token_factor(self) -> float:
        """The chat model's stored estimate factor, 1.0 without calibration (one query)."""
        if not self.config.calibrate:
            return 1.0
        return stored_calibration.token_calibration_get(model=self.config.chat_model).factor

    def use_token_factor(self, factor: float) -> None:
        """Budget the next requests with ``factor`` (read by the caller, e.g. as a turn opens)."""
        self._token_factor = factor

    def calibration(self) -> Calibration:
        """The chat model's stored calibration (one query)."""
        return stored_calibration.token_calibration_get(model=self.config.chat_model)

    async def calibrate(self, *, estimated_tokens: int, prompt_tokens: int | None) -> Calibration | None:
        """Count one finished call in the calibration and budget the next with it; None without a sample."""
        if not self.config.calibrate or prompt_tokens is None:
            return None
        now: Calibration = await self.run_sync(stored_calibration.token_calibration_record)(
            model=self.config.chat_model, estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens
        )
        self._token_factor = now.factor
        return now

    def jobs(self) -> MemoryJobRunner:
        """This event loop's job runner, running this engine's steps from now on."""
        loop = asyncio.get_running_loop()
        runner = _runners.get(loop)
        if runner is None:
            runner = _runners[loop] = MemoryJobRunner(
                store=self.job_store,
                steps=[],
                owner=WORKER_NAME,
                debounce_seconds=self.config.job_debounce_seconds,
                lease_seconds=self.config.job_lease_seconds,
                idle_seconds=self.config.job_idle_seconds,
                batch_turns=self.config.job_batch_turns,
            )
        runner.steps = self.job_steps()
        runner.on_done = self._job_done
        return runner

    def _scheduler(self) -> JobQueue | MemoryJobRunner:
        return self.queue if self.queue is not None else self.jobs()

    def schedule(self, memory_key: str, *, idle: bool = False) -> None:
        """Queue the conversation's memory job, on the durable ``queue`` when there is one, else in this process
        (returns at once; ``idle``: nothing is urgent)."""
        self._scheduler().schedule(memory_key, idle=idle)

    async def run_jobs(self, memory_key: str) -> JobRun | None:
        """Run the conversation's memory job to completion now (after one pending or running)."""
        return await self.jobs().run_now(memory_key)

    @staticmethod
    async def close_jobs() -> None:
        """Cancel this event loop's memory jobs and wait for them to end (tests, shutdown)."""
        runner = _runners.pop(asyncio.get_running_loop(), None)
        if runner is not None:
            await runner.close()

    @staticmethod
    def caches_clear() -> None:
        """Forget this process's cached vectors and embedding lookups (tests; after a model change)."""
        stored_index.recall_cache_clear()

    def job_activity(self, memory_key: str) -> str | None:
        """``running``, ``queued`` or ``batched`` while the queue, or else this process (any event loop), has the
        job; None when none has it."""
        if self.queue is not None:
            return self.queue.activity(memory_key)
        statuses = {runner.status(memory_key) for runner in list(_runners.values())} - {None}
        return next((status for status in ("running", "queued", "batched") if status in statuses), None)

    def job_steps(self) -> list[JobStep]:
        """The pipeline: pre-compression (background mode only), fact extraction, indexing, embedding."""
        steps: list[JobStep] = []
        if self.config.compression == "background":
            steps.append(
                PreCompression(
                    builder=self._job_builder,
                    source=self.source,
                    next_message_tokens=self.config.precompress_tokens,
                    forget=self._forget,
                )
            )
        summary_counter = get_counter(self.config.summary_model or self.config.chat_model)
        steps += [
            FactExtraction(
                chain=self.chain,
                source=self.source,
                facts=self.fact_store,
                jobs=self.job_store,
                counter=summary_counter,
                windows=self.config.summarizer_windows,
                enabled=self.config.facts_extraction,
                max_batches=self.config.facts_max_batches,
                more=self.schedule,
                forget=self._forget,
            ),
            IndexMessages(
                source=self.source,
                index=self.index,
                jobs=self.job_store,
                counter=self.counter,
                unindexed_tools=self.config.unindexed_tools,
                empty_results=self.config.empty_results,
            ),
            EmbedItems(index=self.index, embedder=self.embedder, jobs=self.job_store, source=self.source),
        ]
        return steps

    async def _job_builder(self) -> ContextBuilder:
        """The builder pre-compression plans with: the live one, without handing work to jobs."""
        live = await self.builder()
        return ContextBuilder(
            budget=live.budget,
            chain=self.chain,
            counter=self.counter,
            store=self.summaries,
            facts=self.fact_store,
            facts_scope=self.config.facts_scope,
            empty_results=self.config.empty_results,
        )

    async def _forget(self, memory_key: str) -> None:
        await self.run_sync(self.forget)(memory_key)

    async def _job_done(self, run: JobRun) -> None:
        if not run.lost_lease:
            summary = await self.summaries.get(run.memory_key)
            await self.source.notify(run.memory_key, Notice(summary=summary))

    async def reindex(
        self, memory_key: str, *, progress: Callable[[str, int, int], object] | None = None
    ) -> dict[str, int]:
        """Rebuild the recall index from stored messages, then embed (``manage.py memory_reindex``). Idempotent;
        ``progress(phase, done, total)`` after each batch. Embedder and storage errors propagate."""
        indexer = IndexMessages(
            source=self.source,
            index=self.index,
            jobs=self.job_store,
            counter=self.counter,
            unindexed_tools=self.config.unindexed_tools,
            empty_results=self.config.empty_results,
        )
        _, counts = await indexer.index_after(
            memory_key, None, progress=lambda done, *_: progress and progress("index", done, 0)
        )
        counts["embedded"] = 0
        if self.embedder is not None:
            status = await self.index.status(memory_key=memory_key)
            missing = status["items"] - status["models"].get(self.embedder.model, 0)
            embedder = EmbedItems(index=self.index, embedder=self.embedder, jobs=self.job_store, source=self.source)
            _, counts["embedded"] = await embedder.embed(
                memory_key, None, limit=None, progress=lambda done: progress and progress("embed", done, missing)
            )
        return counts

    # --- what is stored: synchronous, call on a database thread ---------------------------------

    def summary(self, memory_key: str) -> Summary:
        """The conversation's current summary (an empty one, version 0, before the first)."""
        return stored_summaries.session_summary_get(memory_key=memory_key)

    def summary_kind(self, memory_key: str, summary: Summary) -> str:
        """Who wrote ``summary``: ``none``, ``llm``, ``extractive`` or ``raw``."""
        return stored_summaries.session_summary_kind(memory_key=memory_key, summary=summary)

    def summary_block_tokens(self, summary: Summary) -> int:
        """Tokens the summary block of ``summary`` takes in a request (0 without a summary)."""
        if not summary.content:
            return 0
        block = summary_block(
            content=summary.content,
            summary_type=summary.summary_type,
            compressed_count=summary.compressed_count,
            role=self.config.summary_role,
        )
        return self.counter.count_message(block)

    def events(self, memory_key: str, *, limit: int = 50) -> list[CompressionRecord]:
        """The conversation's newest ``limit`` compression events, oldest first."""
        rows = stored_summaries.compression_event_list(memory_key=memory_key, limit=limit)
        return [row.as_record() for row in rows]

    def events_page(self, memory_key: str, *, after_id: int, up_to_id: int, limit: int) -> list[CompressionRecord]:
        rows = stored_summaries.compression_event_list_after(
            memory_key=memory_key, after_id=after_id, up_to_id=up_to_id, limit=limit
        )
        return [row.as_record() for row in rows]

    def health(self, memory_key: str) -> dict[str, Any]:
        """The summarizer's health at the last compression (``status``, ``last_error``, ``attempts``, ``at``)."""
        return stored_summaries.summarizer_health_get(memory_key=memory_key)

    def job_state(self, memory_key: str) -> JobState:
        return memory_job_state_get(memory_key=memory_key)

    def index_status(self, memory_key: str) -> dict[str, Any]:
        """The conversation's recall index: ``items``, ``embedded``, ``models``."""
        return stored_index.memory_index_status(memory_key=memory_key)

    def facts(self, memory_key: str, *, current_only: bool = False) -> list[KeyFact]:
        """The key facts, oldest first: every one (retired and hidden included), or only the current ones."""
        if current_only:
            return stored_facts.key_fact_list_active(memory_key=memory_key)
        return stored_facts.key_fact_list(memory_key=memory_key)

    def facts_on_store(self, memory_key: str, *, scope_key: str, messages: Sequence[dict[str, Any]]) -> list[KeyFact]:
        """Store the rule facts of just-stored ``messages`` (inside the caller's transaction); in ``owner`` scope a
        withdrawal also reaches the owner's personal facts of other chats (docs/memory.md §11 "Owner-wide")."""
        return stored_facts.key_facts_store_rule(
            memory_key=memory_key,
            scope_key=scope_key,
            messages=list(messages),
            owner_wide=self.config.facts_scope == "owner",
        )

    @staticmethod
    def has_rule_facts(message: dict[str, Any]) -> bool:
        """Whether :meth:`facts_on_store` would find anything in ``message``: a value or a withdrawal (no query)."""
        content = message.get("content") if message.get("role") == "user" else None
        return bool(message_rule_facts(message)) or (isinstance(content, str) and bool(withdrawal_sentences(content)))

    def fact_pin(self, memory_key: str, fact_id: int, *, pinned: bool) -> KeyFact:
        """Pin or unpin a fact for the owner. Raises ``KeyFactNotFound``."""
        return stored_facts.key_fact_pin(memory_key=memory_key, fact_id=fact_id, pinned=pinned)

    def fact_hide(self, memory_key: str, fact_id: int, *, hidden: bool) -> KeyFact:
        """Hide or restore a fact for the owner. Raises ``KeyFactNotFound``."""
        return stored_facts.key_fact_hide(memory_key=memory_key, fact_id=fact_id, hidden=hidden)

    def fact_edit(self, memory_key: str, fact_id: int, *, value: str) -> KeyFact:
        """The owner's correction of a fact. Raises ``KeyFactNotFound`` and ``ValueError``."""
        return stored_facts.key_fact_edit(memory_key=memory_key, fact_id=fact_id, value=value)

    def forget_after(self, memory_key: str, message_id: int) -> None:
        """Forget what memory derived from the messages after ``message_id``, which the app deleted (a regenerated
        reply): recall items go, key facts are retired as ``forget``. Raises ``ValueError`` when the summary already
        holds a message after ``message_id`` (folded text cannot be taken back out)."""
        boundary = self.summary(memory_key).last_message_id
        if boundary is not None and boundary > message_id:
            raise ValueError(f"the summary holds messages up to #{boundary}, after #{message_id}")
        stored_summaries.session_memory_forget_after(memory_key=memory_key, message_id=message_id)

    def summary_adopt(self, memory_key: str, *, source_key: str, id_map: Mapping[int, int], fork_point: int) -> bool:
        """Start conversation ``memory_key`` (a copy of ``source_key``'s messages before ``fork_point``, their ids
        mapped by ``id_map``) with the source's summary when all it folded precedes the fork point: its boundary
        becomes the copy's id of the newest folded message. Returns whether it did; otherwise the memory job builds
        the copy's summary from its own messages. Writes only into an empty ``memory_key``."""
        summary = self.summary(source_key)
        if summary.last_message_id is None or summary.last_message_id >= fork_point:
            return False
        folded = [new for old, new in id_map.items() if old <= summary.last_message_id]
        if not folded:
            return False
        copy = replace(summary, last_message_id=max(folded), version=0)
        return stored_summaries.session_summary_adopt(
            memory_key=memory_key,
            source_key=source_key,
            summary=copy,
            token_count=self.counter.count_text(copy.content),
            note=f"adopted from conversation {source_key}: it folded only messages before the edited one",
        )

    def forget(self, memory_key: str) -> None:
        """Delete every memory record of the conversation (its stored messages are the app's)."""
        stored_summaries.session_memory_delete(memory_key=memory_key)
