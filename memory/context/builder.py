"""Builds the context of one model call (docs/memory.md §2-§4): reads the summary, plans,
summarizes when over the trigger, writes back with compare-and-set and records the event."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from memory.context.budget import MemoryBudget
from memory.context.planner import (
    Plan,
    Request,
    StepsNote,
    build_request,
    foldable_steps,
    folded_facts,
    plan_request,
    steps_note_room,
)
from memory.context.request import CompressionJobs, ContextRequest, MemoryContext
from memory.facts.scope import FactsScope
from memory.facts.store import FactStore
from memory.facts.values import KeyFact
from memory.messages import Message
from memory.recall.block import recall_report
from memory.recall.rank import recall_for
from memory.recall.values import RecallInput, RecallResult
from memory.summary.archive import raw_archive_merge, trim_summary
from memory.summary.chain import SummarizerChain
from memory.summary.incremental import MIN_SUMMARY_TOKENS, IncrementalSummarizer, Outcome, summary_cap
from memory.summary.store import CompressionRecord, EventKind, Summary, SummaryStore
from memory.tokens.counter import TokenCounter

logger = logging.getLogger(__name__)


# Compare-and-set rounds before a request gives up writing and uses the newest stored state.
CAS_ROUNDS = 3


# Default wait in seconds of a background-mode request for a running compression (docs/memory.md §10).
SYNC_WAIT_SECONDS = 0.25


# "Steps so far" notes kept per engine for incremental in-turn folding (one per turn).
STEPS_CACHE_SIZE = 64


class ContextBuilder:
    """Managed short-term memory for one model configuration: ``chain`` is the summarizer degradation chain (layers 1-2;
    the raw archive, layer 3, is built here); recent turns' "steps so far" notes stay in memory (at most
    :data:`STEPS_CACHE_SIZE`) so in-turn compaction folds only new steps; without ``jobs`` background requests read."""

    def __init__(
        self,
        *,
        budget: MemoryBudget,
        chain: SummarizerChain,
        counter: TokenCounter,
        store: SummaryStore,
        jobs: CompressionJobs | None = None,
        facts: FactStore | None = None,
        facts_scope: FactsScope = "owner",
        sync_wait_seconds: float = SYNC_WAIT_SECONDS,
        empty_results: tuple[str, ...] = (),
    ) -> None:
        self.budget = budget
        self.chain = chain
        self.counter = counter
        self.store = store
        self.jobs = jobs
        self.facts = facts
        self.facts_scope = facts_scope
        self.sync_wait_seconds = sync_wait_seconds
        self.empty_results = empty_results
        self._steps: OrderedDict[tuple[str, int | None], StepsNote] = OrderedDict()
        # The last request's recall (request, boundary, (input, selection)): see _recall.
        self._recalled: tuple[ContextRequest, int | None, tuple[RecallInput, RecallResult]] | None = None

    async def build_context(self, request: ContextRequest) -> MemoryContext:
        """Load the summary and the increment, compress when over the trigger (or forced), write the summary back
        (compare-and-set) and return the context. A failing summarizer degrades (docs/memory.md §4); after
        :data:`CAS_ROUNDS` lost rounds nothing is written; a summary over the cap is rewritten (F-40); an oversized turn
        is folded before it is refused (I5). Background mode: :meth:`read_context`. Storage errors propagate."""
        if request.compression == "background" and not request.force:
            return await self.read_context(request)
        events: list[CompressionRecord] = []
        for _ in range(CAS_ROUNDS):
            before = await self.store.get(request.memory_key)
            plan = await self._plan(request, before)
            if not plan.needs_compression:
                return await self._context(request, plan, before, events)
            summary_tokens = self.counter.count_text(before.content)
            oversized = summary_tokens > self.summary_cap
            if not plan.to_summarize and not oversized:
                events.append(await self._record(request, plan, kind="no_progress", before=before))
                context = await self._finish(request, plan, before, events)
                context.path = "no_progress"
                return context
            if oversized:
                # F-40: a summary over the cap (a lowered window) is shrunk now rather than block every request.
                plan.notes.append(
                    f"the stored summary ({summary_tokens} tokens) is over the summary cap of {self.summary_cap} "
                    "tokens: it is rewritten within the cap"
                )
            started = time.perf_counter()
            outcome = await self.summarize(before, plan.summarized_messages)
            duration_ms = int((time.perf_counter() - started) * 1000)
            saved = await self.store.compare_and_set(
                request.memory_key,
                expected_version=before.version,
                new=outcome.summary,
                token_count=self.counter.count_text(outcome.summary.content),
                same_boundary=not plan.to_summarize,
            )
            if not saved:
                events.append(
                    await self._record(
                        request, plan, kind="superseded", before=before, outcome=outcome, duration_ms=duration_ms
                    )
                )
                continue
            after = replace(outcome.summary, version=before.version + 1)
            built = await self._build(request, plan, after)
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
            context = await self._finish(request, plan, after, events, built)
            context.path = "compressed"
            return context
        context = await self.degraded_context(
            request, reason=f"{CAS_ROUNDS} concurrent compressions won the race: degraded context, nothing written"
        )
        context.events[:0] = events
        return context

    async def read_context(self, request: ContextRequest) -> MemoryContext:
        """The context of a request that neither summarizes history nor writes (docs/memory.md §10, "fast first token"):
        over the trigger it waits up to ``sync_wait_seconds`` for the memory job (``waited``), else schedules it and
        sends a degraded context (``deferred``); a turn too big alone is built as in sync mode (I5). Storage errors
        propagate."""
        before = await self.store.get(request.memory_key)
        plan = await self._plan(request, before)
        if not plan.needs_compression:
            return await self._context(request, plan, before, [])
        if not plan.to_summarize and self.counter.count_text(before.content) <= self.summary_cap:
            context = await self._finish(request, plan, before, [])
            context.path = "no_progress"
            return context
        waited_ms = 0
        if self.jobs is not None:
            started = time.perf_counter()
            await self.jobs.wait(request.memory_key, self.sync_wait_seconds)
            waited_ms = int((time.perf_counter() - started) * 1000)
            after = await self.store.get(request.memory_key)
            if after.version != before.version:
                plan = await self._plan(request, after)
                if not plan.needs_compression:
                    context = await self._context(request, plan, after, [])
                    context.path, context.waited_ms = "waited", waited_ms
                    return context
            self.jobs.schedule(request.memory_key)
        context = await self.degraded_context(
            request,
            reason="over the trigger: compression left to the memory job; stored summary plus a raw archive "
            "of the overflow, nothing written",
        )
        context.path, context.waited_ms = "deferred", waited_ms
        return context

    async def precompress_due(self, request: ContextRequest, *, next_message_tokens: int) -> bool:
        """Whether :meth:`precompress` would compress now (reads only; storage errors propagate)."""
        return await self._precompress_plan(request, next_message_tokens) is not None

    async def precompress(self, request: ContextRequest, *, next_message_tokens: int) -> MemoryContext | None:
        """Pre-compression (docs/memory.md §10): when the next request, imagined with a user message of
        ``next_message_tokens`` tokens (never stored), would cross the trigger, compress now as sync mode would
        (``origin="job"``). The context, or None when nothing was needed; storage errors propagate."""
        planned = await self._precompress_plan(request, next_message_tokens)
        return None if planned is None else await self.build_context(planned)

    async def _precompress_plan(self, request: ContextRequest, next_message_tokens: int) -> ContextRequest | None:
        """The imagined next request of :meth:`precompress`, or None when it needs no compression."""

        async def with_next_message(boundary: int | None) -> list[Message]:
            messages = await request.load_increment(boundary)
            last_id = max((int(message["id"]) for message in messages), default=boundary or 0)
            imagined = {"role": "user", "content": "", "id": last_id + 1, "token_count": next_message_tokens}
            return [*messages, imagined]

        planned = replace(
            request,
            load_increment=with_next_message,
            compression="sync",
            origin="job",
            imagined_tokens=next_message_tokens,
        )
        before = await self.store.get(request.memory_key)
        plan = await self._plan(planned, before)
        oversized = self.counter.count_text(before.content) > self.summary_cap
        if not plan.needs_compression or not (plan.to_summarize or oversized):
            return None
        return planned

    async def degraded_context(self, request: ContextRequest, *, reason: str) -> MemoryContext:
        """A context with no summarizer call and no write: the stored summary plus, over the trigger, a raw archive of
        what does not fit (docs/memory.md §4, layer 3, in memory only); ``reason`` goes to ``repairs``."""
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
        elif plan.needs_compression:
            summary = replace(summary, content=trim_summary(summary.content, self.summary_cap, self.counter))
        context = await self._context(request, plan, summary, [], degraded=True)
        context.repairs.append(reason)
        context.path = "degraded"
        return context

    async def summarize(self, summary: Summary, messages: list[Message], *, cap: int | None = None) -> Outcome:
        """Fold ``messages`` into ``summary`` within ``cap`` tokens (default :attr:`summary_cap`); writes nothing."""
        folder = IncrementalSummarizer(
            chain=self.chain,
            counter=self.counter,
            ratio=self.budget.summary_ratio,
            window=self.budget.summarizer_window,
            empty_results=self.empty_results,
        )
        return await folder.fold(summary, messages, cap=self.summary_cap if cap is None else cap)

    @property
    def summary_cap(self) -> int:
        """Hard cap of the summary text in tokens (:func:`memory.summary.incremental.summary_cap`)."""
        return summary_cap(self.budget.summary_reserve_tokens, self.counter)

    def _facts(self, request: ContextRequest) -> Awaitable[list[KeyFact]]:
        """The request's key facts: its own loader, else the builder's fact store (with the owner's personal facts of
        other chats in ``owner`` scope, docs/memory.md §11 "Owner-wide"), else none."""
        if request.load_facts is not None:
            return request.load_facts()
        if self.facts is not None:
            scope_key = request.scope_key if self.facts_scope == "owner" else None
            return self.facts.active(request.memory_key, scope_key=scope_key)
        return _nothing()

    async def _plan(self, request: ContextRequest, summary: Summary) -> Plan:
        increment, facts, recall = await asyncio.gather(
            request.load_increment(summary.last_message_id),
            self._facts(request),
            self._recall(request, summary.last_message_id),
        )

        def planned(selection: RecallResult | None) -> Plan:
            return plan_request(
                system=request.system,
                summary=summary,
                increment=increment,
                budget=self.budget,
                counter=self.counter,
                tools=request.tools,
                mode=request.mode,
                summarize_below=request.summarize_below,
                in_flight_yields=request.origin != "job",
                force=request.force,
                facts=facts,
                recall=selection,
                now=request.now,
                imagined_tokens=request.imagined_tokens,
            )

        if recall is None:
            return planned(None)
        data, chosen = recall
        plan = self._fill_room(planned(chosen), data, chosen, replan=planned)
        plan.recall_input = data
        share = self.budget.recall_budget_tokens
        if plan.recall.tokens > share:
            note = (
                f"the block grew past its share ({share} tokens) into the room the request left under "
                f"the trigger ({self.budget.trigger_tokens} tokens; MEMORY_RECALL_FILL)"
            )
            plan.recall_input = replace(data, notes=[*data.notes, note])
        return plan

    def _fill_room(
        self, plan: Plan, data: RecallInput, chosen: RecallResult, *, replan: Callable[[RecallResult], Plan]
    ) -> Plan:
        """``plan`` with its recall block grown into the room under the trigger when admitted items were left out
        (docs/memory.md §12, "Budget"), planned again by ``replan``; ``plan`` itself when nothing is added,
        ``recall_fill`` is off, or the wider plan would compress."""
        if not self.budget.recall_fill or plan.needs_compression or not chosen.over_budget:
            return plan
        room = self.budget.trigger_tokens - (plan.tokens_before - chosen.tokens)
        if room <= max(chosen.tokens, self.budget.recall_budget_tokens):
            return plan
        wider = recall_for(data, budget_tokens=room, counter=self.counter, role=self.budget.summary_role)
        if wider.tokens <= chosen.tokens:
            return plan
        widened = replan(wider)
        return plan if widened.needs_compression else widened

    async def _recall(self, request: ContextRequest, boundary: int | None) -> tuple[RecallInput, RecallResult] | None:
        """The request's recall input and selection (docs/memory.md §12), searched once per request and boundary; a
        failing loader gives no recall and a note saying why."""
        if request.load_recall is None or self.budget.recall_budget_tokens <= 0:
            return None
        cached = self._recalled
        if cached is not None and cached[0] is request and cached[1] == boundary:
            return cached[2]
        try:
            data = await request.load_recall(boundary)
        except Exception as exc:  # recall is an extra: never a reason to fail the request
            logger.warning("recall failed for %s: %s", request.memory_key, exc)
            reason = f"recall failed ({type(exc).__name__}: {exc}): the request goes without recalled messages"
            data = RecallInput(query="", candidates=[], model=None, now=datetime.now(UTC), notes=[reason])
        result = recall_for(
            data, budget_tokens=self.budget.recall_budget_tokens, counter=self.counter, role=self.budget.summary_role
        )
        self._recalled = (request, boundary, (data, result))
        return data, result

    async def _build(self, request: ContextRequest, plan: Plan, summary: Summary, *, degraded: bool = False) -> Request:
        """The request for ``plan``; when elision alone would cut into the newest step, the older steps are first folded
        into a "steps so far" note (the raw archive when ``degraded``, docs/memory.md I5)."""
        build = partial(
            build_request,
            plan=plan,
            summary=summary,
            retained=plan.retained,
            budget=self.budget,
            counter=self.counter,
            tools=plan.tools,
        )
        built = build()
        if not built.fold_wanted:
            return built
        # The folded steps' key facts are pinned, and the note is sized after them (§11).
        facts = folded_facts(plan, summary, budget=self.budget, counter=self.counter)
        room = steps_note_room(
            plan=plan, summary=summary, budget=self.budget, counter=self.counter, tools=plan.tools, facts=facts
        )
        cap = max(MIN_SUMMARY_TOKENS, min(self.summary_cap, room))
        steps = await self._fold_steps(request.memory_key, plan, cap=cap, degraded=degraded)
        folded = build(steps=steps, facts=facts)
        if folded.overflow and facts.tokens > plan.facts.tokens:
            # Never refuse a request because of the facts it gained: keep the plan's block.
            return build(steps=steps)
        return folded

    async def _fold_steps(self, memory_key: str, plan: Plan, *, cap: int, degraded: bool) -> StepsNote:
        """The "steps so far" note of ``plan``'s older steps within ``cap`` tokens, reusing the note of an earlier call
        of the turn so only new steps are folded. Nothing is written."""
        units = foldable_steps(plan)
        members = [message for unit in units for message in unit.members]
        key = (memory_key, plan.current[0].members[0].get("id"))
        cached = self._steps.get(key)
        previous, new = "", members
        if cached is not None:
            done = cached.members
            if [m.get("id") for m in members[: len(done)]] == [m.get("id") for m in done]:
                previous, new = cached.content, members[len(done) :]
        if not new and cached is not None:
            return replace(cached, units=units, attempts=[])
        if degraded:
            content = raw_archive_merge(previous, new, max_tokens=cap, counter=self.counter)
            steps = StepsNote(units=units, content=content, summary_type="raw")
        else:
            outcome = await self.summarize(Summary(content=previous), new, cap=cap)
            steps = StepsNote(
                units=units,
                content=outcome.summary.content,
                summary_type=outcome.summary.summary_type,
                attempts=[attempt.as_dict() for attempt in outcome.attempts],
            )
        self._steps[key] = steps
        self._steps.move_to_end(key)
        while len(self._steps) > STEPS_CACHE_SIZE:
            self._steps.popitem(last=False)
        return steps

    async def _context(
        self,
        request: ContextRequest,
        plan: Plan,
        summary: Summary,
        events: list[CompressionRecord],
        built: Request | None = None,
        *,
        degraded: bool = False,
    ) -> MemoryContext:
        built = built or await self._build(request, plan, summary, degraded=degraded)
        assembly = built.assembly
        repairs = [note for unit in [*plan.retained, *plan.current] for note in unit.repairs]
        if built.steps is not None:
            repairs.append(_steps_sentence(built.steps))
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
            repairs=repairs,
            overflow=built.overflow,
            facts=built.facts.as_dict(),
            recall=recall_report(plan.recall_input, plan.recall) if plan.recall_input is not None else {},
            token_factor=self.budget.token_factor,
            window_tokens=self.budget.window_tokens,
        )

    async def _finish(
        self,
        request: ContextRequest,
        plan: Plan,
        summary: Summary,
        events: list[CompressionRecord],
        built: Request | None = None,
    ) -> MemoryContext:
        """A compressing request's context, with an ``overflow`` event when its turn was elided, folded or too big."""
        built = built or await self._build(request, plan, summary)
        if built.elisions or built.overflow or built.steps is not None:
            notes = []
            if built.steps is not None:
                notes.append(_steps_sentence(built.steps))
            notes.append(f"elided {len(built.elisions)} message(s) of the current turn in the model-facing copy")
            if built.overflow:
                notes.append(
                    f"request is {built.assembly.tokens} tokens, over the context window of {self.budget.window_tokens}"
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
                    attempts=built.steps.attempts if built.steps is not None else None,
                )
            )
        return await self._context(request, plan, summary, events, built)

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
        attempts: list[dict[str, Any]] | None = None,
    ) -> CompressionRecord:
        """Record one compression event: ``outcome`` the summarization it reports (None for ``no_progress`` and
        ``overflow``), ``after`` the summary written, ``attempts`` a "steps so far" note's (no ``outcome``)."""
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
            attempts=[attempt.as_dict() for attempt in outcome.attempts] if outcome else list(attempts or []),
            duration_ms=duration_ms,
            summary_content=outcome.summary.content if outcome else "",
            summary_version=written.version if written else None,
            notes=[*plan.notes, *(notes or [])],
            elisions=elisions or [],
            origin=request.origin,
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
    """The before-model hook of agent mode: :meth:`before_model` before every model call; any failure but
    cancellation gives a degraded context rather than aborting the run (docs/memory.md §4)."""

    def __init__(self, engine: ContextBuilder) -> None:
        self.engine = engine

    async def before_model(self, request: ContextRequest) -> MemoryContext:
        try:
            return await self.engine.build_context(request)
        except Exception:
            logger.exception("memory engine failed for %s; continuing on a degraded context", request.memory_key)
            return await self.engine.degraded_context(
                request, reason="memory engine failed: degraded context, nothing written"
            )


def _steps_sentence(steps: StepsNote) -> str:
    """The note of an event or repair saying what in-turn compaction folded."""
    ids = [message["id"] for message in steps.members if message.get("id") is not None]
    how = "the raw archive" if steps.summary_type == "raw" else "the summarizer"
    return (
        f"folded {len(steps.members)} earlier message(s) of the current turn (ids {ids[0]}-{ids[-1]}) into a "
        f"'steps so far' note by {how}, in the model-facing copy only"
        if ids
        else f"folded {len(steps.members)} earlier message(s) of the current turn into a 'steps so far' note by {how}"
    )


async def _nothing() -> list[KeyFact]:
    return []
