"""The two entry points over one core (docs/memory.md §2-§4): :meth:`MemoryEngine.build_context`
for quick-answer requests and :meth:`AgentMemoryMiddleware.before_model` before every model call
of the agent loop. Each takes one :class:`ContextRequest`. The engine reads the summary through its
storage port (:class:`memory.store.SummaryStore`), plans (pure, :mod:`memory.planner`), runs the
summarizer chain, writes the new summary back with compare-and-set and records a compression
event. Nothing is written before the summarizer returns (docs/memory.md F-24)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from memory.budget import MemoryBudget, Mode
from memory.core import Message, raw_archive_merge, summary_block
from memory.planner import Plan, Request, build_request, plan_request, summary_output_tokens
from memory.prompts import build_summary_prompt, chunk_messages, fit_transcript, render_transcript, transcript_budget
from memory.store import CompressionRecord, EventKind, Summary, SummaryStore
from memory.summarizer import Attempt, SummarizerChain, SummaryRequest
from memory.tokens import TokenCounter

logger = logging.getLogger(__name__)

IncrementLoader = Callable[[int | None], Awaitable[list[Message]]]
"""``await load_increment(boundary)``: every persisted message of the conversation with an id
greater than ``boundary`` (all of them when None), ascending id, as wire dicts plus ``id`` and
optionally ``token_count``. Never a page: compaction must not read through a limited view
(docs/memory.md F-15)."""

# Compare-and-set rounds before a request gives up writing and uses the newest stored state.
CAS_ROUNDS = 3


@dataclass(frozen=True, kw_only=True)
class ContextRequest:
    """What one model call needs from memory, passed whole to the engine.

    ``memory_key``: the conversation. ``system_prompt``: sent first and verbatim (None for none).
    ``load_increment``: see :data:`IncrementLoader`. ``mode``: ``agent`` or ``quick-answer``.
    ``tools``: the tool schemas sent with the request (counted, docs/memory.md F-20).
    ``summarize_below``: the first message id that must not be summarized (another turn of the
    conversation still in flight, docs/memory.md F-26). ``force``: compress now, whatever the
    size: every history message before the current turn is folded into the summary.
    The agent loop builds a new request per step (``dataclasses.replace``) rather than mutating one.
    """

    memory_key: str
    system_prompt: str | None
    load_increment: IncrementLoader
    mode: Mode
    tools: list[dict[str, Any]] | None = None
    summarize_below: int | None = None
    force: bool = False

    @property
    def system(self) -> Message | None:
        """The system prompt as a wire message (None without one)."""
        return {"role": "system", "content": self.system_prompt} if self.system_prompt else None


@dataclass(kw_only=True)
class MemoryContext:
    """What one model call is sent, and why.

    ``messages``: the exact wire list; ``sources``: aligned ``{"id", "kind"}`` with kind
    ``system``/``summary``/``history``/``current``; ``tokens``: estimated request size (tokens);
    ``sections``: tokens per section (``system``, ``summary``, ``retained``, ``current``,
    ``tools``); ``summary``: the summary the request was built with; ``events``: compression
    events recorded by this call (their JSON form); ``elisions``: messages of the current turn
    shortened in the model-facing copy; ``repairs``: what was dropped to keep tool calls paired,
    and why a degraded context was used; ``overflow``: still over the context window (the caller
    must not send it).
    """

    messages: list[Message]
    sources: list[dict[str, Any]]
    tokens: int
    sections: dict[str, int]
    context_window: int
    trigger_tokens: int
    target_tokens: int
    summary: Summary
    events: list[dict[str, Any]] = field(default_factory=list)
    elisions: list[dict[str, Any]] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    overflow: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The JSON form stored with each model call and sent to the inspector."""
        return {
            "messages": self.messages,
            "sources": self.sources,
            "tokens": self.tokens,
            "sections": self.sections,
            "context_window": self.context_window,
            "trigger_tokens": self.trigger_tokens,
            "target_tokens": self.target_tokens,
            "summary": self.summary.as_dict(),
            "events": self.events,
            "elisions": self.elisions,
            "repairs": self.repairs,
            "overflow": self.overflow,
        }


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """A summarization result, before anything is written: the new ``summary`` (its version is
    still the one read), every summarizer ``attempts`` made, and whether it ``degraded`` to the
    raw archive."""

    summary: Summary
    attempts: list[Attempt]
    degraded: bool


class MemoryEngine:
    """Managed short-term memory for one model configuration.

    ``budget``: the token budget; ``chain``: the summarizer degradation chain (layers 1-2; the
    raw archive is layer 3, built here); ``counter``: the token counter of the chat model;
    ``store``: where summaries and compression events are kept.
    """

    def __init__(
        self, *, budget: MemoryBudget, chain: SummarizerChain, counter: TokenCounter, store: SummaryStore
    ) -> None:
        self.budget = budget
        self.chain = chain
        self.counter = counter
        self.store = store

    async def build_context(self, request: ContextRequest) -> MemoryContext:
        """Load the summary and the increment, compress when over the trigger (or forced), write
        the new summary back (compare-and-set) and return the model-facing context.

        A failing summarizer never raises here: it degrades to the raw archive (docs/memory.md
        §4). After :data:`CAS_ROUNDS` lost compare-and-set rounds the context is built degraded,
        with nothing written. Storage errors propagate.
        """
        events: list[dict[str, Any]] = []
        for _ in range(CAS_ROUNDS):
            before = await self.store.get(request.memory_key)
            plan = await self._plan(request, before)
            if not plan.needs_compression:
                return self._context(plan, before, events)
            if not plan.to_summarize:
                events.append(await self._record(request, plan, kind="no_progress", before=before))
                return await self._finish(request, plan, before, events)
            started = time.perf_counter()
            outcome = await self.summarize(before, plan.summarized_messages)
            duration_ms = int((time.perf_counter() - started) * 1000)
            saved = await self.store.compare_and_set(
                request.memory_key,
                expected_version=before.version,
                new=outcome.summary,
                token_count=self.counter.count_text(outcome.summary.content),
            )
            if not saved:
                events.append(
                    await self._record(
                        request, plan, kind="superseded", before=before, outcome=outcome, duration_ms=duration_ms
                    )
                )
                continue
            after = replace(outcome.summary, version=before.version + 1)
            built = self._build(plan, after)
            events.append(
                await self._record(
                    request,
                    plan,
                    kind="compression",
                    before=before,
                    after=after,
                    outcome=outcome,
                    duration_ms=duration_ms,
                    tokens_after=built.assembly.tokens,
                )
            )
            return await self._finish(request, plan, after, events, built)
        context = await self.degraded_context(
            request, reason=f"{CAS_ROUNDS} concurrent compressions won the race: degraded context, nothing written"
        )
        context.events[:0] = events
        return context

    async def degraded_context(self, request: ContextRequest, *, reason: str) -> MemoryContext:
        """A context built with no summarizer and no write: the stored summary plus, when the
        request is over the trigger, a raw archive of what does not fit (docs/memory.md §4,
        layer 3, kept in memory only). ``reason`` is recorded in ``repairs``."""
        summary = await self.store.get(request.memory_key)
        plan = await self._plan(request, summary)
        if plan.to_summarize:
            messages = plan.summarized_messages
            summary = Summary(
                content=raw_archive_merge(summary.content, messages, max_tokens=self.summary_cap, counter=self.counter),
                summary_type="raw",
                last_message_id=max(m["id"] for m in messages),
                compressed_count=summary.compressed_count + len(messages),
                version=summary.version,
            )
        context = self._context(plan, summary, [])
        context.repairs.append(reason)
        return context

    async def summarize(self, summary: Summary, messages: list[Message]) -> Outcome:
        """Fold ``messages`` into ``summary``: chunks that fit the summarizer's window are merged
        one after another (docs/memory.md F-17); when the chain fails for a chunk, that chunk and
        the rest go to the raw archive appended to the summary so far (layer 3). Nothing is
        written; only the summarizer is called."""
        cap = self.summary_cap
        transcript_tokens = self.counter.count_text(render_transcript(messages))
        max_tokens = summary_output_tokens(
            previous_summary_tokens=self.counter.count_text(summary.content),
            transcript_tokens=transcript_tokens,
            cap=cap,
            ratio=self.budget.summary_ratio,
        )
        budget = transcript_budget(
            previous_summary_tokens=cap,
            max_output_tokens=max_tokens,
            window=self.budget.summarizer_window,
            counter=self.counter,
        )
        chunks = chunk_messages(messages, budget=budget, counter=self.counter)
        content, attempts, degraded = summary.content, [], False
        for index, chunk in enumerate(chunks):
            transcript = fit_transcript(chunk, max_tokens=budget, counter=self.counter)
            result = await self.chain.run(
                SummaryRequest(
                    previous_summary=content,
                    messages=chunk,
                    prompt=build_summary_prompt(previous_summary=content, transcript=transcript, max_tokens=max_tokens),
                    max_tokens=max_tokens,
                )
            )
            attempts.extend(result.attempts)
            if result.text is None:
                rest = [message for later in chunks[index:] for message in later]
                content = raw_archive_merge(content, rest, max_tokens=cap, counter=self.counter)
                degraded = True
                break
            content = self.counter.truncate_text(result.text, cap)
        new = Summary(
            content=content,
            summary_type="raw" if degraded else "llm",
            last_message_id=max(max(message["id"] for message in messages), summary.last_message_id or 0),
            compressed_count=summary.compressed_count + len(messages),
            version=summary.version,
        )
        return Outcome(summary=new, attempts=attempts, degraded=degraded)

    @property
    def summary_cap(self) -> int:
        """Hard cap of the summary text in tokens: the reserve minus the block's header line and
        message overhead, so the whole block fits the reserve."""
        empty_block = summary_block(content="", summary_type="raw", compressed_count=10**6, role="system")
        return max(16, self.budget.summary_reserve_tokens - self.counter.count_message(empty_block) - 1)

    async def _plan(self, request: ContextRequest, summary: Summary) -> Plan:
        return plan_request(
            system=request.system,
            summary=summary,
            increment=await request.load_increment(summary.last_message_id),
            budget=self.budget,
            counter=self.counter,
            tools=request.tools,
            mode=request.mode,
            summarize_below=request.summarize_below,
            force=request.force,
        )

    def _build(self, plan: Plan, summary: Summary) -> Request:
        return build_request(
            plan=plan,
            summary=summary,
            retained=plan.retained,
            budget=self.budget,
            counter=self.counter,
            tools=plan.tools,
        )

    def _context(
        self, plan: Plan, summary: Summary, events: list[dict[str, Any]], built: Request | None = None
    ) -> MemoryContext:
        built = built or self._build(plan, summary)
        assembly = built.assembly
        return MemoryContext(
            messages=assembly.messages,
            sources=assembly.sources,
            tokens=assembly.tokens,
            sections=assembly.sections,
            context_window=self.budget.context_window,
            trigger_tokens=self.budget.trigger_tokens,
            target_tokens=self.budget.target_tokens,
            summary=summary,
            events=events,
            elisions=built.elisions,
            repairs=[note for unit in [*plan.retained, *plan.current] for note in unit.repairs],
            overflow=built.overflow,
        )

    async def _finish(
        self,
        request: ContextRequest,
        plan: Plan,
        summary: Summary,
        events: list[dict[str, Any]],
        built: Request | None = None,
    ) -> MemoryContext:
        """The context of a compressing request, with an ``overflow`` event when its current
        turn had to be elided or it is still over the context window."""
        built = built or self._build(plan, summary)
        if built.elisions or built.overflow:
            notes = [f"elided {len(built.elisions)} message(s) of the current turn in the model-facing copy"]
            if built.overflow:
                notes.append(
                    f"request is {built.assembly.tokens} tokens, over the context window of {self.budget.context_window}"
                )
            events.append(
                await self._record(
                    request,
                    plan,
                    kind="overflow",
                    before=summary,
                    tokens_after=built.assembly.tokens,
                    notes=notes,
                    elisions=built.elisions,
                )
            )
        return self._context(plan, summary, events, built)

    async def _record(
        self,
        request: ContextRequest,
        plan: Plan,
        *,
        kind: EventKind,
        before: Summary,
        after: Summary | None = None,
        outcome: Outcome | None = None,
        duration_ms: int = 0,
        tokens_after: int | None = None,
        notes: list[str] | None = None,
        elisions: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Record one compression event; ``outcome`` is the summarization it reports (None for
        ``no_progress`` and ``overflow``), ``after`` the summary written (``compression`` only)."""
        written = after if kind == "compression" else None
        record = CompressionRecord(
            kind=kind,
            mode=request.mode,
            context_window=self.budget.context_window,
            trigger_tokens=self.budget.trigger_tokens,
            target_tokens=self.budget.target_tokens,
            tokens_before=plan.tokens_before,
            tokens_after=plan.tokens_before if tokens_after is None else tokens_after,
            messages_summarized=len(plan.summarized_messages) if outcome else 0,
            boundary_before=before.last_message_id,
            boundary_after=written.last_message_id if written else before.last_message_id,
            result_type=outcome.summary.summary_type if outcome else "none",
            degraded=bool(outcome and outcome.degraded),
            attempts=[attempt.as_dict() for attempt in outcome.attempts] if outcome else [],
            duration_ms=duration_ms,
            summary_content=outcome.summary.content if outcome else "",
            summary_version=written.version if written else None,
            notes=[*plan.notes, *(notes or [])],
            elisions=elisions or [],
        )
        event = await self.store.record(request.memory_key, record)
        if outcome is not None:
            logger.info(
                "memory %s key=%s mode=%s tokens %d->%d summarized=%d type=%s attempts=%d",
                kind,
                request.memory_key,
                request.mode,
                record.tokens_before,
                record.tokens_after,
                record.messages_summarized,
                record.result_type,
                len(record.attempts),
            )
        return event


class AgentMemoryMiddleware:
    """The before-model hook of agent mode: call :meth:`before_model` before every model call
    (after the previous step's messages are stored) with that step's :class:`ContextRequest`,
    and send the returned context's messages.

    If building the context fails for any reason other than cancellation, the agent continues on
    a degraded context (old summary plus a raw archive of what did not fit, nothing written)
    instead of aborting the run (docs/memory.md §4).
    """

    def __init__(self, engine: MemoryEngine) -> None:
        self.engine = engine

    async def before_model(self, request: ContextRequest) -> MemoryContext:
        try:
            return await self.engine.build_context(request)
        except Exception:
            logger.exception("memory engine failed for %s; continuing on a degraded context", request.memory_key)
            return await self.engine.degraded_context(
                request, reason="memory engine failed: degraded context, nothing written"
            )
