"""Memory jobs of this worker process (docs/memory.md §10, "memory job" and "pre-compression").

After every turn the session's memory job is scheduled (:func:`memory_job_schedule`), at once
when the next request may cross the trigger, else batched until the chat goes idle or a few
replies gathered (docs/memory.md §10 "when the job runs"): a
:class:`memory.api.MemoryJobRunner` per event loop runs it as an asyncio task, debounced and
coalescing, holding the session's lease in the database (:class:`memory.api.OrmJobStore`) so
that one job per session runs at a time across all workers. Its pipeline has four steps, in this
order: :class:`PreCompression` plans the session's next request as if a user message of
``MEMORY_PRECOMPRESS_TOKENS`` arrived and compresses now when that request would cross the
trigger, so the next turn finds itself under it and makes no summarizer call before its first
token (first, because the next request may wait for it); :class:`FactExtraction` then extracts
key facts from the messages stored since its watermark with the summarizer model (docs/memory.md
§11), in both compression modes; :class:`IndexMessages` indexes the new messages for recall and
:class:`EmbedItems` embeds the new items (docs/memory.md §12).

The request path reads only (``MEMORY_COMPRESSION=background``, the default): a request still
over the trigger waits at most ``MEMORY_SYNC_WAIT_MS`` for the session's job, then goes on with
the degraded context and schedules the job (:class:`memory.api.MemoryEngine`). With
``MEMORY_COMPRESSION=sync`` the request compresses itself, as earlier versions did, and the
pre-compression step does nothing (fact extraction still runs).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, cast

from asgiref.sync import async_to_sync
from django.conf import settings

from chatapp.chats import selectors, services
from chatapp.conversation import leases
from chatapp.conversation.agent import AGENT_PROMPT
from chatapp.conversation.quick_answer import quick_answer_system_prompt
from chatapp.conversation.tools import TOOL_SCHEMAS, UNINDEXED_TOOLS
from chatapp.conversation.turn import PASSAGES_TARGET_SHARE, memory_engine_build
from chatapp.llm.calibration import calibration_applies, token_factor_get
from chatapp.llm.clients import chat_endpoint, failover_endpoint, summary_endpoint
from chatapp.llm.embeddings import embedder_choice, embedder_get
from chatapp.llm.summarizer import build_summarizer_chain
from chatapp.models import ChatSession, Message
from chatapp.orm_threads import orm_async
from chatapp.realtime.broadcast import event_broadcast
from chatapp.realtime.protocol import MemoryCompressionEvent, MemoryFactsEvent, MemorySummaryEvent
from memory.api import (
    EXTRACTION_SCHEMA,
    EXTRACTION_SCHEMA_NAME,
    ContextRequest,
    Embedder,
    ExtractionInput,
    JobRun,
    KeyFact,
    MemoryEngine,
    MemoryJobRunner,
    Mode,
    OrmJobStore,
    SummarizerChain,
    SummaryRequest,
    extraction_prompt,
    get_counter,
    key_fact_list,
    key_fact_list_active,
    key_facts_apply,
    memory_index_status,
    memory_item_embeddings_save,
    memory_items_unembedded,
    memory_items_unembedded_exist,
    memory_items_write,
    memory_job_state_get,
    message_pieces,
    parse_extraction,
    session_memory_delete,
    session_summary_get,
    validate_extraction,
)

logger = logging.getLogger(__name__)

# This process's name in job leases: host, process id and a random part (a restarted process
# with the same pid must not inherit a lease).
WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

_runners: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, MemoryJobRunner] = weakref.WeakKeyDictionary()
# Broadcasts after jobs, held so the event loop cannot garbage-collect them mid-way.
_telling: set[asyncio.Task[None]] = set()


NextRequest = tuple[str, list[dict[str, Any]] | None, int]
"""What the session's next request will carry besides its history: the system prompt, the tool
schemas (None for none) and an allowance in tokens for what is not known yet (passages)."""


def next_request_of_mode(mode: str, engine: MemoryEngine) -> NextRequest:
    """The live app's next request in ``mode``: the agent's prompt and tools, or the quick-answer
    prompt with room for the next question's passages (at most a share of the target)."""
    if mode == ChatSession.Mode.AGENT:
        return AGENT_PROMPT, TOOL_SCHEMAS, 0
    return quick_answer_system_prompt([]), None, int(engine.budget.target_tokens * PASSAGES_TARGET_SHARE)


def live_engine(token_factor: float = 1.0) -> MemoryEngine:
    """The engine a live turn uses (no jobs: a job never hands work to itself), budgeted with
    the chat model's estimate calibration ``token_factor`` (docs/memory.md §5, "Calibration")."""
    return memory_engine_build(chat_endpoint(), token_factor=token_factor)


class PreCompression:
    """The pipeline step that compresses ahead of the next request (docs/memory.md §10,
    "pre-compression"). Its watermark is the id of the newest message it planned with.

    ``engine_build(token_factor)`` makes the engine to compress with (the live app's by default),
    given the chat model's estimate calibration, so that it plans as the next request will;
    ``next_request`` says what the next request carries (:func:`next_request_of_mode` by default;
    the replay command passes its recorded system prompt); ``orm`` turns the synchronous ORM
    functions it calls into awaitables (:func:`chatapp.orm_threads.orm_async` by default; the
    replay command, whose caller holds the database connection, passes ``sync_to_async``).
    ``last_events``: the compression events its last run recorded (their JSON form).
    """

    name = "precompress"

    def __init__(
        self,
        *,
        engine_build: Callable[[float], MemoryEngine] = live_engine,
        next_request: Callable[[str, MemoryEngine], NextRequest] = next_request_of_mode,
        orm: Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]] = orm_async,
    ) -> None:
        self.engine_build = engine_build
        self.next_request = next_request
        self.orm = orm
        self.last_events: list[dict[str, Any]] = []

    async def due(self, memory_key: str) -> bool:
        """Whether the session's next request would cross the trigger now (reads only); never in
        ``MEMORY_COMPRESSION=sync`` mode, nor for a session that is gone or empty."""
        planned = await self._next_request(memory_key)
        if planned is None:
            return False
        engine, request, tokens, _ = planned
        return await engine.precompress_due(request, next_message_tokens=tokens)

    async def run(self, memory_key: str, watermark: int | None) -> int | None:
        """Plan the next request of the session named ``memory_key`` and compress when it would
        cross the trigger (through the summarizer chain and compare-and-set, like a request).
        Returns the newest message id it planned with. When the session is gone (deleted while
        this ran), its memory state is deleted, job state included, so nothing of it remains
        (docs/memory.md F-41). Storage errors propagate (the attempt fails)."""
        self.last_events = []
        planned = await self._next_request(memory_key)
        if planned is None:
            await self.orm(session_memory_delete)(memory_key=memory_key)
            return watermark
        engine, request, tokens, last_id = planned
        context = await engine.precompress(request, next_message_tokens=tokens)
        self.last_events = context.events if context is not None else []
        session_id = ChatSession.session_id_for(memory_key)
        if not await self.orm(selectors.chat_session_exists)(session_id=session_id):
            await self.orm(session_memory_delete)(memory_key=memory_key)
        elif context is not None:
            for event in context.events:
                await event_broadcast(session_id, MemoryCompressionEvent(turn_id=None, step=0, event=event))
        return last_id

    async def _next_request(self, memory_key: str) -> tuple[MemoryEngine, ContextRequest, int, int] | None:
        """The engine, the imagined next request, its next-message tokens and the session's
        newest message id; None in sync mode or when the session is gone or empty."""
        if settings.MEMORY_COMPRESSION != "background":
            return None
        session_id = ChatSession.session_id_for(memory_key)
        subject = await self.orm(selectors.memory_job_subject_get)(session_id=session_id)
        if subject is None:
            return None
        mode, last_id = subject
        endpoint = chat_endpoint()
        factor = await self.orm(token_factor_get)(endpoint=endpoint) if calibration_applies(endpoint) else 1.0
        engine = self.engine_build(factor)
        system_prompt, tools, allowance = self.next_request(mode, engine)

        async def load_increment(boundary: int | None) -> list[dict[str, Any]]:
            return await self.orm(selectors.message_list_for_context)(
                session_id=session_id, boundary=boundary, turn_message_id=last_id
            )

        async def load_facts() -> list[KeyFact]:
            return await self.orm(key_fact_list_active)(memory_key=memory_key)

        request = ContextRequest(
            memory_key=memory_key,
            system_prompt=system_prompt,
            load_increment=load_increment,
            load_facts=load_facts,
            mode=cast(Mode, mode),
            tools=tools,
            summarize_below=await self.orm(leases.turn_in_flight_first_id)(session_id=session_id),
            origin="job",
        )
        # Room for the next request's recall block too, which only its question decides (§12).
        recall = engine.budget.recall_budget_tokens
        return engine, request, settings.MEMORY_PRECOMPRESS_TOKENS + allowance + recall, last_id


class FactExtraction:
    """The pipeline step that extracts key facts with the summarizer model (docs/memory.md §11,
    "LLM extraction"). Its watermark is the id of the newest message it extracted from.

    Each run reads the session's messages after the watermark (every role; rows the app wrote,
    ``origin`` ``app``, are left out, docs/memory.md F-37), oldest first, in batches of at most
    ``batch_size`` (fewer when their prompt would not fit the summarizer's window, or when the
    reply was cut off at ``max_tokens``, itself at most a quarter of that window: the batch is
    halved), at most ``max_batches`` per run (None: all; the live app's 3 keep one job short, and
    a run that stops early queues the next); for each batch it sends one extraction request
    (:func:`memory.api.extraction_prompt`: the new messages as numbered lines with their dates, the chat's active
    facts with handles) through the summarizer's degradation chain with the JSON schema
    (``response_format``; :class:`chatapp.llm.summarizer.OpenAISummarizer` falls back to
    ``json_object``, then to none), parses the reply tolerantly, validates it in code
    (grounding, supersession within a slot, never a pinned fact: :func:`memory.api.
    validate_extraction`) and stores the accepted facts with ``extractor`` ``llm:<model>``
    (:func:`memory.api.key_facts_apply`). Runs in both ``MEMORY_COMPRESSION`` modes.

    F-29: a batch whose chain fails (every attempt), or whose reply is not a JSON object with a
    ``facts`` list, changes nothing and raises, so the watermark stays before it and a later job
    picks the same messages up. When an earlier batch of the same run succeeded, the run returns
    the watermark of that batch instead (its facts are stored) and logs the failure.

    ``chain_build`` makes the summarizer chain (:func:`chatapp.llm.summarizer.
    build_summarizer_chain` by default); ``orm`` as for :class:`PreCompression`. After a run that
    created facts, the session's sockets get ``memory.facts`` (every fact of the chat, superseded
    ones included). ``last_rejected``: the items the last run's validation rejected, with the
    reason (also logged at INFO); ``last_created``: the facts it created.
    """

    name = "extract_facts"
    batch_size = 40
    max_tokens = 800
    # Active facts listed in one extraction prompt, newest last.
    max_prompt_facts = 80

    def __init__(
        self,
        *,
        chain_build: Callable[[], SummarizerChain] = build_summarizer_chain,
        orm: Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]] = orm_async,
        max_batches: int | None = 3,
    ) -> None:
        self.chain_build = chain_build
        self.orm = orm
        self.max_batches = max_batches
        self._chain: tuple[tuple[Any, ...], SummarizerChain] | None = None
        self.last_rejected: list[dict[str, Any]] = []
        self.last_created: list[KeyFact] = []

    async def due(self, memory_key: str) -> bool:
        """Whether the session has stored messages after this step's watermark (two indexed
        reads); False when extraction is switched off (:func:`fact_extraction_enabled`) or the
        session is gone."""
        if not fact_extraction_enabled():
            return False
        return await _messages_after_watermark(self.orm, memory_key, self.name)

    async def run(self, memory_key: str, watermark: int | None) -> int | None:
        """Extract from every message after ``watermark`` and return the id of the newest one
        dealt with (``watermark`` itself when there was none, or when the session is gone).
        Raises :class:`FactExtractionFailed` (chain failed) or :class:`memory.api.ExtractionError`
        (unparsable reply) for a failed first batch; storage errors propagate."""
        self.last_rejected, self.last_created = [], []
        session_id = ChatSession.session_id_for(memory_key)
        chain: SummarizerChain | None = None
        done = watermark
        batches = 0
        while True:
            if self.max_batches is not None and batches >= self.max_batches:
                # A long backlog (or a small summarizer window) must not hold the session's job,
                # and the pre-compression after it, for minutes: the rest waits for the next run.
                memory_job_runner().schedule(memory_key)
                break
            batches += 1
            batch = await self.orm(_extraction_batch)(session_id=session_id, after=done, limit=self.batch_size)
            if batch is None or not batch[1]:
                break
            scope_key, messages = batch
            chain = chain or self._chain_now()
            try:
                included = await self._extract(memory_key, scope_key, messages, chain)
            except Exception as exc:
                if done == watermark:
                    raise
                logger.warning("key-fact extraction of %s stopped after message %s: %s", memory_key, done, exc)
                break
            done = messages[included - 1]["id"]
            if included == len(messages) < self.batch_size:
                break
        if not await self.orm(selectors.chat_session_exists)(session_id=session_id):
            await self.orm(session_memory_delete)(memory_key=memory_key)
            return watermark
        if self.last_created:
            facts = await self.orm(key_fact_list)(memory_key=memory_key)
            await event_broadcast(
                session_id, MemoryFactsEvent(turn_id=None, step=0, facts=[fact.as_dict() for fact in facts])
            )
        return done

    def _max_tokens(self) -> int:
        """The reply's cap in tokens: ``max_tokens``, at most a quarter of the smallest summarizer
        window, so that a small window still leaves room for more than one message per request."""
        windows = [settings.LLM_SUMMARY_CONTEXT_WINDOW]
        if settings.LLM_FAILOVER_MODEL:
            windows.append(settings.LLM_FAILOVER_CONTEXT_WINDOW)
        return max(64, min(self.max_tokens, min(windows) // 4))

    def _chain_now(self) -> SummarizerChain:
        """The summarizer chain, built again only when the summarizer settings changed: its
        summarizers remember which ``response_format`` their endpoint rejected, so later runs
        skip it (:class:`chatapp.llm.summarizer.OpenAISummarizer`)."""
        key = (
            summary_endpoint(),
            failover_endpoint(),
            settings.MEMORY_SUMMARY_ATTEMPTS,
            settings.LLM_SUMMARY_TIMEOUT,
            settings.LLM_SUMMARY_TEMPERATURE,
            settings.LLM_SUMMARY_STREAM,
        )
        if self._chain is None or self._chain[0] != key:
            self._chain = (key, self.chain_build())
        return self._chain[1]

    async def _extract(
        self, memory_key: str, scope_key: str, messages: list[dict[str, Any]], chain: SummarizerChain
    ) -> int:
        """One batch: request, parse, validate, store (see the class docstring). Returns how
        many of ``messages`` (the first ones) it extracted from: all, unless their prompt would
        not fit the summarizer's window (:meth:`_fitting`) or the reply was cut off at
        ``max_tokens`` (too many facts for one reply: the first half is tried, down to one
        message)."""
        # The newest facts only: a chat with hundreds of facts must still fit a small summarizer
        # window (key_facts_apply skips a value that is already active anyway).
        active = (await self.orm(key_fact_list_active)(memory_key=memory_key))[-self.max_prompt_facts :]
        data, prompt = self._fitting(messages, active)
        while True:
            result = await chain.run(
                SummaryRequest(
                    previous_summary="",
                    messages=data.messages,
                    prompt=prompt,
                    max_tokens=self._max_tokens(),
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
        model = result.attempts[-1].model
        validation = validate_extraction(parse_extraction(result.text), data, extractor=f"llm:{model}")
        if validation.rejected:
            logger.info(
                "key-fact extraction of %s rejected %s item(s): %s",
                memory_key,
                len(validation.rejected),
                validation.rejected,
            )
            self.last_rejected.extend(validation.rejected)
        created = await self.orm(key_facts_apply)(
            memory_key=memory_key,
            scope_key=scope_key,
            candidates=validation.accepted,
            valid_from={message["id"]: message["created_at"] for message in messages},
            alive=services.chat_session_memory_alive,
        )
        self.last_created.extend(created)
        return len(messages)

    def _fitting(
        self, messages: list[dict[str, Any]], facts: list[KeyFact]
    ) -> tuple[ExtractionInput, list[dict[str, Any]]]:
        """The extraction input and prompt of the longest prefix of ``messages`` (at least one
        message) whose prompt plus ``max_tokens`` of reply stays within 90 % of the smallest
        summarizer window (``LLM_SUMMARY_CONTEXT_WINDOW``, and ``LLM_FAILOVER_CONTEXT_WINDOW`` with
        a failover model): the margin covers tokenizers that count more than ``cl100k``. The
        prefix is halved until it fits, so a batch never fails on every attempt for its size."""
        windows = [settings.LLM_SUMMARY_CONTEXT_WINDOW]
        if settings.LLM_FAILOVER_MODEL:
            windows.append(settings.LLM_FAILOVER_CONTEXT_WINDOW)
        room = int(min(windows) * 0.9) - self._max_tokens()
        counter = get_counter(settings.LLM_SUMMARY_MODEL)
        count = len(messages)
        while True:
            data = ExtractionInput(
                messages=[{**message, "created_at": message["created_at"].isoformat()} for message in messages[:count]],
                facts=facts,
            )
            prompt = extraction_prompt(data)
            if count == 1 or counter.count_request(prompt) <= room:
                return data, prompt
            count = max(1, count // 2)


class FactExtractionFailed(Exception):
    """Every attempt of the summarizer chain failed for a key-fact extraction (docs/memory.md
    F-29): nothing was changed and the step's watermark stays."""


def fact_extraction_enabled() -> bool:
    """Whether the memory job extracts key facts with the summarizer model
    (``MEMORY_FACTS_EXTRACTION``, on unless set to False)."""
    return bool(settings.MEMORY_FACTS_EXTRACTION)


def _messages_after_exist(*, session_id: int, after: int | None) -> bool:
    """Whether session ``session_id`` has a message with an id above ``after`` (any when None)
    that was not written by the app. One indexed query."""
    rows = Message.objects.filter(session_id=session_id).exclude(origin=Message.Origin.APP)
    return (rows.filter(id__gt=after) if after is not None else rows).exists()


def _extraction_batch(*, session_id: int, after: int | None, limit: int) -> tuple[str, list[dict[str, Any]]] | None:
    """``(scope_key, messages)``: the session owner's ``scope_key`` and up to ``limit`` of its
    messages with an id above ``after``, oldest first, not written by the app, as dicts with
    ``id``, ``role``, ``content``, ``tool_calls`` and ``created_at`` (aware datetime); None when
    the session is gone. Two queries."""
    owner = ChatSession.objects.filter(pk=session_id).values_list("owner_id", "owner_session_key").first()
    if owner is None:
        return None
    rows = Message.objects.filter(session_id=session_id).exclude(origin=Message.Origin.APP)
    if after is not None:
        rows = rows.filter(id__gt=after)
    messages = [
        {"id": pk, "role": role, "content": content, "tool_calls": tool_calls, "created_at": created}
        for pk, role, content, tool_calls, created in rows.order_by("id").values_list(
            "id", "role", "content", "tool_calls", "created"
        )[:limit]
    ]
    return services.chat_session_scope_key(owner_id=owner[0], owner_session_key=owner[1]), messages


class IndexMessages:
    """The pipeline step that indexes stored messages for recall (docs/memory.md §12, "the
    index"). Its watermark is the id of the newest message it indexed.

    Each run reads the session's messages after the watermark (rows the app wrote, ``origin``
    ``app``, are left out, docs/memory.md F-37), oldest first, in batches of ``batch_size``;
    each message becomes one or more items (:func:`memory.api.message_pieces`: pieces of at most
    about 120 tokens of the chat model's tokenizer, a tool result rendered with its call; the
    knowledge-base search's results are left out, :data:`chatapp.conversation.tools.UNINDEXED_TOOLS`) written
    by :func:`memory.api.memory_items_write` without embeddings (:class:`EmbedItems` adds them),
    so full-text recall never waits for an embedding endpoint. ``orm`` as for
    :class:`PreCompression`. Storage errors propagate (the watermark stays)."""

    name = "index"
    batch_size = 200

    def __init__(self, *, orm: Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]] = orm_async) -> None:
        self.orm = orm

    async def due(self, memory_key: str) -> bool:
        """Whether the session has stored messages after this step's watermark (two indexed reads)."""
        return await _messages_after_watermark(self.orm, memory_key, self.name)

    async def run(self, memory_key: str, watermark: int | None) -> int | None:
        """Index every message after ``watermark``; returns the id of the newest one indexed
        (``watermark`` itself when there was none or the session is gone)."""
        session_id = ChatSession.session_id_for(memory_key)
        counter = get_counter(settings.LLM_CHAT_MODEL)
        done = watermark
        while True:
            batch = await self.orm(_index_batch)(session_id=session_id, after=done, limit=self.batch_size)
            if batch is None:
                return watermark
            scope_key, messages, calls = batch
            if not messages:
                break
            pieces = message_pieces(messages, counter=counter, calls=calls, skip_tools=UNINDEXED_TOOLS)
            await self.orm(memory_items_write)(
                memory_key=memory_key,
                scope_key=scope_key,
                message_ids=[message["id"] for message in messages],
                pieces=pieces,
                alive=services.chat_session_memory_alive,
            )
            done = messages[-1]["id"]
            if len(messages) < self.batch_size:
                break
        return done


class EmbeddingFailed(Exception):
    """The embedder failed on the first batch of an :class:`EmbedItems` run: nothing was stored,
    the step's attempt is recorded as failed and a later job tries again (docs/memory.md §12,
    "failures never lose memory")."""


class EmbedItems:
    """The pipeline step that embeds indexed items (docs/memory.md §12, "embeddings"), after
    :class:`IndexMessages`. Its watermark is the newest message id among the items it embedded.

    Due when an embedder is configured (:func:`chatapp.llm.embeddings.embedder_choice`) and the
    session has items without an embedding of its model (new items, items left over by a failed
    run, or all items after the model changed). Each run embeds them oldest first, in batches of
    :func:`memory.api.memory_items_unembedded` (16) ``passage`` texts, at most ``max_items`` per run (the rest
    stays due for the next job; ``manage.py memory_reindex`` does a whole history).

    Failure rule (the F-29 rule applied to embeddings): an embedder failure stores nothing and
    raises :class:`EmbeddingFailed` for the first batch, so the attempt is recorded with its
    error and the watermark stays; after an earlier batch of the same run succeeded, the run
    stops there (logged) and returns that batch's watermark. Items without an embedding are
    still found by full-text search, so a dead endpoint never blocks lexical recall.
    ``embedder_get`` gives the embedder (None: nothing to do) and ``model_get`` the name of the
    model it would use without loading it (None: none configured; both from the settings by
    default); ``orm`` as for :class:`PreCompression`."""

    name = "embed"
    max_items = 512

    def __init__(
        self,
        *,
        embedder_get: Callable[[], Embedder | None] = embedder_get,
        model_get: Callable[[], str | None] | None = None,
        orm: Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]] = orm_async,
    ) -> None:
        self.embedder_get = embedder_get
        self.model_get = model_get or _configured_model
        self.orm = orm

    async def due(self, memory_key: str) -> bool:
        """Whether an embedder is configured and the session has items it has not embedded, or
        messages the ``index`` step has still to index (the job asks every step before running
        any; at most three indexed reads; the model is not loaded)."""
        model = self.model_get()
        if model is None:
            return False
        if await self.orm(memory_items_unembedded_exist)(memory_key=memory_key, model=model):
            return True
        return await _messages_after_watermark(self.orm, memory_key, IndexMessages.name)

    async def run(self, memory_key: str, watermark: int | None) -> int | None:
        """Embed the session's items that lack an embedding (see the class docstring)."""
        embedder = await asyncio.to_thread(self.embedder_get)
        if embedder is None:
            return watermark
        done = watermark
        embedded = 0
        while embedded < self.max_items:
            items = await self.orm(memory_items_unembedded)(memory_key=memory_key, model=embedder.model)
            if not items:
                break
            try:
                vectors = await embedder.embed([text for _, text, _ in items], kind="passage")
                if vectors.shape[0] != len(items):
                    raise ValueError(f"{vectors.shape[0]} vectors for {len(items)} texts")
            except Exception as exc:
                if embedded == 0:
                    raise EmbeddingFailed(f"{type(exc).__name__}: {exc}"[:500]) from exc
                logger.warning("embedding of %s stopped after %s item(s): %s", memory_key, embedded, exc)
                break
            await self.orm(memory_item_embeddings_save)(
                vectors={item_id: vectors[row] for row, (item_id, _, _) in enumerate(items)}, model=embedder.model
            )
            embedded += len(items)
            newest = max(last_id for _, _, last_id in items)
            done = newest if done is None else max(done, newest)
        return done


def _configured_model() -> str | None:
    """The embedding model the settings select, None for none (:func:`embedder_choice`)."""
    choice = embedder_choice()
    return None if choice.backend == "none" else choice.model


def _index_batch(
    *, session_id: int, after: int | None, limit: int
) -> tuple[str, list[dict[str, Any]], dict[str, tuple[int, dict[str, Any]]]] | None:
    """``(scope_key, messages, calls)``: the session owner's ``scope_key``, up to ``limit`` of its
    messages with an id above ``after``, oldest first, not written by the app, as dicts with
    ``id``, ``role``, ``content``, ``tool_calls``, ``tool_call_id``, ``name`` and ``created_at``,
    and the earlier tool calls their tool results answer (tool-call id → (message id, call)),
    read from the 50 assistant messages before the batch. None when the session is gone. Two or
    three queries."""
    owner = ChatSession.objects.filter(pk=session_id).values_list("owner_id", "owner_session_key").first()
    if owner is None:
        return None
    rows = Message.objects.filter(session_id=session_id).exclude(origin=Message.Origin.APP)
    if after is not None:
        rows = rows.filter(id__gt=after)
    messages: list[dict[str, Any]] = [
        {
            "id": pk,
            "role": role,
            "content": content,
            "tool_calls": tool_calls,
            "tool_call_id": tool_call_id,
            "name": name,
            "created_at": created,
        }
        for pk, role, content, tool_calls, tool_call_id, name, created in rows.order_by("id").values_list(
            "id", "role", "content", "tool_calls", "tool_call_id", "name", "created"
        )[:limit]
    ]
    made = {str(call.get("id")) for message in messages for call in message["tool_calls"] or () if call.get("id")}
    wanted = {message["tool_call_id"] for message in messages if message["role"] == "tool"} - made - {""}
    calls: dict[str, tuple[int, dict[str, Any]]] = {}
    if wanted:
        earlier = (
            Message.objects.filter(session_id=session_id, role=Message.Role.ASSISTANT, id__lt=messages[0]["id"])
            .exclude(tool_calls__isnull=True)
            .order_by("-id")
            .values_list("id", "tool_calls")[:50]
        )
        for message_id, tool_calls in earlier:
            for call in tool_calls or ():
                if isinstance(call, dict) and str(call.get("id")) in wanted:
                    calls.setdefault(str(call["id"]), (message_id, call))
    return (
        services.chat_session_scope_key(owner_id=owner[0], owner_session_key=owner[1]),
        messages,
        calls,
    )


IndexProgress = Callable[[str, int, int], object]
"""``progress(phase, done, total)``: ``phase`` ``index`` (messages) or ``embed`` (items)."""


def memory_index_rebuild(
    *, session_id: int, embedder: Embedder | None, progress: IndexProgress | None = None, batch_size: int = 200
) -> dict[str, int]:
    """Rebuild the recall index of chat session ``session_id`` from its stored messages
    (``manage.py memory_reindex``, docs/memory.md §12), synchronously: every message is split
    again and written with :func:`memory.api.memory_items_write` (unchanged items keep their
    id and embedding, changed ones are replaced), then, with ``embedder``, every item without
    its embedding is embedded. Idempotent: a second run changes no row. ``progress`` is called
    after each batch. Returns ``messages``, ``inserted``, ``deleted`` and ``embedded`` counts.
    Embedder and storage errors propagate (what was written stays written). Call it outside an
    event loop (it runs the embedder with ``async_to_sync``)."""
    memory_key = ChatSession.memory_key_for(session_id)
    counter = get_counter(settings.LLM_CHAT_MODEL)
    total = Message.objects.filter(session_id=session_id).exclude(origin=Message.Origin.APP).count()
    counts = {"messages": 0, "inserted": 0, "deleted": 0, "embedded": 0}
    after: int | None = None
    while True:
        batch = _index_batch(session_id=session_id, after=after, limit=batch_size)
        if batch is None or not batch[1]:
            break
        scope_key, messages, calls = batch
        inserted, deleted = memory_items_write(
            memory_key=memory_key,
            scope_key=scope_key,
            message_ids=[message["id"] for message in messages],
            pieces=message_pieces(messages, counter=counter, calls=calls, skip_tools=UNINDEXED_TOOLS),
            alive=services.chat_session_memory_alive,
        )
        counts["messages"] += len(messages)
        counts["inserted"] += inserted
        counts["deleted"] += deleted
        after = messages[-1]["id"]
        if progress is not None:
            progress("index", counts["messages"], total)
    if embedder is None:
        return counts
    status = memory_index_status(memory_key=memory_key)
    missing = status["items"] - status["models"].get(embedder.model, 0)
    while items := memory_items_unembedded(memory_key=memory_key, model=embedder.model):
        vectors = async_to_sync(embedder.embed)([text for _, text, _ in items], kind="passage")
        if vectors.shape[0] != len(items):
            raise ValueError(f"the embedder returned {vectors.shape[0]} vectors for {len(items)} texts")
        memory_item_embeddings_save(
            vectors={item_id: vectors[row] for row, (item_id, _, _) in enumerate(items)}, model=embedder.model
        )
        counts["embedded"] += len(items)
        if progress is not None:
            progress("embed", counts["embedded"], missing)
    return counts


async def _messages_after_watermark(
    orm: Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]], memory_key: str, step: str
) -> bool:
    """Whether the session has stored messages after the watermark of job step ``step`` (two
    indexed reads): the ``due`` check of the steps that work through new messages."""
    state = await orm(memory_job_state_get)(memory_key=memory_key)
    after = state.watermarks.get(step)
    return bool(await orm(_messages_after_exist)(session_id=ChatSession.session_id_for(memory_key), after=after))


def memory_job_runner() -> MemoryJobRunner:
    """This process's job runner for the running event loop (created on first use)."""
    loop = asyncio.get_running_loop()
    runner = _runners.get(loop)
    if runner is None:
        runner = MemoryJobRunner(
            store=OrmJobStore(),
            steps=[PreCompression(), FactExtraction(), IndexMessages(), EmbedItems()],
            owner=WORKER_NAME,
            debounce_seconds=settings.MEMORY_JOB_DEBOUNCE_MS / 1000,
            lease_seconds=settings.MEMORY_JOB_LEASE_SECONDS,
            on_done=_job_done,
            idle_seconds=settings.MEMORY_JOB_IDLE_SECONDS,
            batch_turns=settings.MEMORY_JOB_BATCH_TURNS,
        )
        _runners[loop] = runner
    return runner


def _job_done(run: JobRun) -> None:
    """After each job, tell the session's sockets (``memory.summary``), so that the inspector
    shows the summary and the job as they are now."""
    if not run.lost_lease:
        task = asyncio.get_running_loop().create_task(_job_tell(ChatSession.session_id_for(run.memory_key)))
        _telling.add(task)
        task.add_done_callback(_telling.discard)


async def _job_tell(session_id: int) -> None:
    try:
        summary = await orm_async(session_summary_get)(memory_key=ChatSession.memory_key_for(session_id))
        await event_broadcast(session_id, MemorySummaryEvent(turn_id=None, step=0, summary=summary.as_dict()))
    except Exception:
        logger.exception("could not tell chat session %s that its memory job ended", session_id)


async def memory_jobs_close() -> None:
    """Cancel this event loop's pending and running memory jobs and wait until they have ended (a
    step's database call in a thread finishes first: a thread cannot be interrupted). For a
    test's teardown, before its database is flushed, and a graceful shutdown; a job scheduled
    later starts a new runner."""
    runner = _runners.pop(asyncio.get_running_loop(), None)
    if runner is not None:
        await runner.close()


def memory_job_local_status(*, session_id: int) -> str | None:
    """``running``, ``queued`` or ``batched`` (waiting for the chat to go idle, docs/memory.md §10)
    while a job of this process is running or pending for session ``session_id`` (any event
    loop), else None. Safe to call from the database threads."""
    memory_key = ChatSession.memory_key_for(session_id)
    statuses = {runner.status(memory_key) for runner in list(_runners.values())} - {None}
    return next((status for status in ("running", "queued", "batched") if status in statuses), None)


def memory_job_schedule(*, session_id: int, idle: bool = False) -> None:
    """Queue the memory job of session ``session_id`` in this process (returns at once);
    ``idle=True`` when nothing is urgent: the job waits for ``MEMORY_JOB_IDLE_SECONDS`` without
    a reply, or for the ``MEMORY_JOB_BATCH_TURNS``-th such reply (:meth:`memory.api.
    MemoryJobRunner.schedule`, docs/memory.md §10 "when the job runs")."""
    memory_job_runner().schedule(ChatSession.memory_key_for(session_id), idle=idle)


async def memory_job_run_now(*, session_id: int) -> None:
    """Run the memory job of session ``session_id`` to completion (after one already pending or
    running here), e.g. between the turns of a replay so that it is deterministic."""
    await memory_job_runner().run_now(ChatSession.memory_key_for(session_id))
