"""The two entry points over one core (SPEC.md sections 2-4): :meth:`MemoryEngine.build_context`
for quick-answer requests and :class:`AgentMemoryMiddleware` before every model call of the agent
loop. The engine loads state, plans (pure), runs the summarizer chain, writes the new summary
back with compare-and-set and records a compression event."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from asgiref.sync import sync_to_async

from memory import services
from memory.config import MemoryConfig, Mode
from memory.core import Message, Unit, raw_archive_merge, summary_block
from memory.planner import Plan, Request, SummaryView, build_request, plan_request, summary_output_tokens
from memory.prompts import build_summary_prompt, chunk_messages, fit_transcript, render_transcript, transcript_budget
from memory.services import SummaryState
from memory.summarizer import Attempt, SummarizerChain, SummaryRequest
from memory.tokens import TokenCounter

logger = logging.getLogger(__name__)

IncrementLoader = Callable[[int | None], Awaitable[list[Message]]]
"""``await load_increment(boundary)``: every persisted message of the session with an id greater
than ``boundary`` (all of them when None), ascending id, as wire dicts plus ``id`` and optionally
``token_count``. Never a page: compaction must not read through a limited view (FAULTS F-15)."""

Tools = list[dict[str, Any]] | None

# Compare-and-set rounds before a request gives up writing and uses the newest stored state.
CAS_ROUNDS = 3


@dataclass(kw_only=True)
class MemoryContext:
    """What one model call is sent, and why.

    ``messages``: the exact wire list; ``sources``: aligned ``{"id", "kind"}`` with kind
    ``system``/``summary``/``history``/``current``; ``tokens``: estimated request size;
    ``sections``: tokens per section (``system``, ``summary``, ``retained``, ``current``,
    ``tools``); ``summary``: the summary state used (``type``, ``content``, ``last_message_id``,
    ``compressed_count``, ``version``); ``events``: compression events recorded by this call;
    ``overflow``: still over the context window (the caller must not send it).
    """

    messages: list[Message]
    sources: list[dict[str, Any]]
    tokens: int
    sections: dict[str, int]
    context_window: int
    trigger_tokens: int
    target_tokens: int
    summary: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    elisions: list[dict[str, Any]] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    overflow: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "sources": self.sources,
            "tokens": self.tokens,
            "sections": self.sections,
            "context_window": self.context_window,
            "trigger_tokens": self.trigger_tokens,
            "target_tokens": self.target_tokens,
            "summary": self.summary,
            "events": self.events,
            "elisions": self.elisions,
            "repairs": self.repairs,
            "overflow": self.overflow,
        }


@dataclass(kw_only=True)
class Outcome:
    """A summarization result, before anything is written."""

    state: SummaryState
    attempts: list[Attempt]
    degraded: bool


class MemoryEngine:
    """Managed short-term memory for one model configuration.

    ``config``: the token budget; ``chain``: the summarizer degradation chain (layers 1-2; the
    raw archive is layer 3, built here); ``counter``: the token counter of the chat model.
    """

    def __init__(self, *, config: MemoryConfig, chain: SummarizerChain, counter: TokenCounter) -> None:
        self.config = config
        self.chain = chain
        self.counter = counter

    async def build_context(
        self,
        *,
        session_key: str,
        system_prompt: str | None,
        load_increment: IncrementLoader,
        mode: Mode,
        tools: list[dict[str, Any]] | None = None,
        summarize_below: int | None = None,
        force: bool = False,
    ) -> MemoryContext:
        """Load the summary and the increment, compress when over the trigger, write the new
        summary back (compare-and-set) and return the model-facing context.

        ``tools``: the tool schemas sent with the request (counted). ``summarize_below``: the
        first message id that must not be summarized (another turn of the session in flight).
        ``force``: compress now (the inspector's "compress now"): every history message before
        the current turn is folded into the summary, whatever the request size.

        A failing summarizer never raises here: it degrades to the raw archive (SPEC.md
        section 4). Database errors propagate. Nothing is written before the summarizer returns.
        """
        system = {"role": "system", "content": system_prompt} if system_prompt else None
        events: list[dict[str, Any]] = []
        for _ in range(CAS_ROUNDS):
            state = await sync_to_async(services.session_summary_get)(session_key=session_key)
            increment = await load_increment(state.last_message_id)
            plan = self._plan(system, state, increment, tools, mode, summarize_below, force)
            if not plan.needs_compression:
                return self._context(plan, state, plan.retained, tools, events)
            if not plan.to_summarize:
                events.append(await self._record(session_key, mode, plan, state, state, kind="no_progress"))
                return await self._finish(session_key, mode, plan, state, plan.retained, tools, events)
            started = time.perf_counter()
            outcome = await self.summarize(state, plan.summarized_messages)
            duration_ms = int((time.perf_counter() - started) * 1000)
            saved = await sync_to_async(services.session_summary_save)(
                session_key=session_key,
                expected_version=state.version,
                new=outcome.state,
                token_count=self.counter.count_text(outcome.state.content),
            )
            if not saved:
                events.append(
                    await self._record(
                        session_key,
                        mode,
                        plan,
                        state,
                        outcome.state,
                        kind="superseded",
                        outcome=outcome,
                        duration_ms=duration_ms,
                        tokens_after=plan.tokens_before,
                    )
                )
                continue
            new_state = replace(outcome.state, version=state.version + 1)
            request = self._request(plan, new_state, plan.retained, tools)
            events.append(
                await self._record(
                    session_key,
                    mode,
                    plan,
                    state,
                    new_state,
                    kind="compression",
                    outcome=outcome,
                    duration_ms=duration_ms,
                    tokens_after=request.assembly.tokens,
                )
            )
            return await self._finish(session_key, mode, plan, new_state, plan.retained, tools, events, request)
        context = await self.degraded_context(
            session_key=session_key,
            system_prompt=system_prompt,
            load_increment=load_increment,
            mode=mode,
            tools=tools,
            summarize_below=summarize_below,
            reason=f"{CAS_ROUNDS} concurrent compressions won the race: degraded context, nothing written",
        )
        context.events[:0] = events
        return context

    async def degraded_context(
        self,
        *,
        session_key: str,
        system_prompt: str | None,
        load_increment: IncrementLoader,
        mode: Mode,
        tools: list[dict[str, Any]] | None = None,
        summarize_below: int | None = None,
        reason: str,
    ) -> MemoryContext:
        """A context built with no summarizer and no write: the stored summary plus, when the
        request is over the trigger, a raw archive of what does not fit (SPEC.md section 4,
        layer 3, kept in memory only). ``reason`` is recorded in ``repairs``."""
        state = await sync_to_async(services.session_summary_get)(session_key=session_key)
        system = {"role": "system", "content": system_prompt} if system_prompt else None
        plan = self._plan(system, state, await load_increment(state.last_message_id), tools, mode, summarize_below)
        if plan.to_summarize:
            messages = plan.summarized_messages
            state = SummaryState(
                content=raw_archive_merge(state.content, messages, max_tokens=self.summary_cap, counter=self.counter),
                summary_type="raw",
                last_message_id=max(m["id"] for m in messages),
                compressed_count=state.compressed_count + len(messages),
                version=state.version,
            )
        context = self._context(plan, state, plan.retained, tools, [])
        context.repairs.append(reason)
        return context

    def _plan(
        self,
        system: Message | None,
        state: SummaryState,
        increment: list[Message],
        tools: Tools,
        mode: Mode,
        summarize_below: int | None = None,
        force: bool = False,
    ) -> Plan:
        return plan_request(
            system=system,
            summary=_view(state),
            increment=increment,
            config=self.config,
            counter=self.counter,
            tools=tools,
            mode=mode,
            summarize_below=summarize_below,
            force=force,
        )

    async def summarize(self, state: SummaryState, messages: list[Message]) -> Outcome:
        """Fold ``messages`` into ``state``'s summary: chunks that fit the summarizer's window
        are merged one after another (FAULTS F-17); when the chain fails for a chunk, that chunk
        and the rest go to the raw archive appended to the summary so far (layer 3). Pure apart
        from the summarizer calls: nothing is written."""
        cap = self.summary_cap
        transcript_tokens = self.counter.count_text(render_transcript(messages))
        max_tokens = summary_output_tokens(
            previous_summary_tokens=self.counter.count_text(state.content), transcript_tokens=transcript_tokens, cap=cap
        )
        budget = transcript_budget(
            previous_summary_tokens=cap,
            max_output_tokens=max_tokens,
            window=self.config.summarizer_window,
            counter=self.counter,
        )
        chunks = chunk_messages(messages, budget=budget, counter=self.counter)
        content, attempts, degraded = state.content, [], False
        for index, chunk in enumerate(chunks):
            transcript = fit_transcript(chunk, max_tokens=budget, counter=self.counter)
            request = SummaryRequest(
                previous_summary=content,
                messages=chunk,
                prompt=build_summary_prompt(previous_summary=content, transcript=transcript, max_tokens=max_tokens),
                max_tokens=max_tokens,
            )
            result = await self.chain.run(request)
            attempts.extend(result.attempts)
            if result.text is None:
                rest = [message for later in chunks[index:] for message in later]
                content = raw_archive_merge(content, rest, max_tokens=cap, counter=self.counter)
                degraded = True
                break
            content = self.counter.truncate_text(result.text, cap)
        last_id = max(message["id"] for message in messages)
        new_state = SummaryState(
            content=content,
            summary_type="raw" if degraded else "llm",
            last_message_id=max(last_id, state.last_message_id or 0),
            compressed_count=state.compressed_count + len(messages),
            version=state.version,
        )
        return Outcome(state=new_state, attempts=attempts, degraded=degraded)

    @property
    def summary_cap(self) -> int:
        """Hard cap of the summary text in tokens: the reserve minus the block's header line and
        message overhead, so the whole block fits the reserve."""
        empty_block = summary_block(content="", summary_type="raw", compressed_count=10**6, role="system")
        return max(16, self.config.summary_reserve_tokens - self.counter.count_message(empty_block) - 1)

    def _request(self, plan: Plan, state: SummaryState, retained: list[Unit], tools: Tools) -> Request:
        return build_request(
            plan=plan, summary=_view(state), retained=retained, config=self.config, counter=self.counter, tools=tools
        )

    def _context(
        self,
        plan: Plan,
        state: SummaryState,
        retained: list[Unit],
        tools: Tools,
        events: list[dict[str, Any]],
        request: Request | None = None,
    ) -> MemoryContext:
        request = request or self._request(plan, state, retained, tools)
        assembly = request.assembly
        return MemoryContext(
            messages=assembly.messages,
            sources=assembly.sources,
            tokens=assembly.tokens,
            sections=assembly.sections,
            context_window=self.config.context_window,
            trigger_tokens=self.config.trigger_tokens,
            target_tokens=self.config.target_tokens,
            summary=state.as_dict(),
            events=events,
            elisions=request.elisions,
            repairs=[note for unit in [*retained, *plan.current] for note in unit.repairs],
            overflow=request.overflow,
        )

    async def _finish(
        self,
        session_key: str,
        mode: Mode,
        plan: Plan,
        state: SummaryState,
        retained: list[Unit],
        tools: Tools,
        events: list[dict[str, Any]],
        request: Request | None = None,
    ) -> MemoryContext:
        request = request or self._request(plan, state, retained, tools)
        if request.elisions or request.overflow:
            notes = [f"elided {len(request.elisions)} message(s) of the current turn in the model-facing copy"]
            if request.overflow:
                notes.append(
                    f"request is {request.assembly.tokens} tokens, over the context window of {self.config.context_window}"
                )
            events.append(
                await self._record(
                    session_key,
                    mode,
                    plan,
                    state,
                    state,
                    kind="overflow",
                    tokens_after=request.assembly.tokens,
                    extra=notes,
                    elisions=request.elisions,
                )
            )
        return self._context(plan, state, retained, tools, events, request)

    async def _record(
        self,
        session_key: str,
        mode: Mode,
        plan: Plan,
        before: SummaryState,
        after: SummaryState,
        *,
        kind: str,
        outcome: Outcome | None = None,
        duration_ms: int = 0,
        tokens_after: int | None = None,
        extra: list[str] | None = None,
        elisions: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        tokens_after = plan.tokens_before if tokens_after is None else tokens_after
        notes = [*plan.notes, *(extra or [])]
        if elisions:
            notes.append({"elisions": elisions})
        event = await sync_to_async(services.compression_event_create)(
            session_key=session_key,
            kind=kind,
            mode=mode,
            context_window=self.config.context_window,
            trigger_tokens=self.config.trigger_tokens,
            target_tokens=self.config.target_tokens,
            tokens_before=plan.tokens_before,
            tokens_after=tokens_after,
            messages_summarized=len(plan.summarized_messages) if outcome else 0,
            boundary_before=before.last_message_id,
            boundary_after=after.last_message_id if kind == "compression" else before.last_message_id,
            result_type=after.summary_type if outcome else "none",
            degraded=bool(outcome and outcome.degraded),
            attempts=[attempt.as_dict() for attempt in outcome.attempts] if outcome else [],
            duration_ms=duration_ms,
            summary_content=after.content if outcome else "",
            summary_version=after.version if kind == "compression" else None,
            notes=notes,
        )
        if kind in ("compression", "superseded"):
            logger.info(
                "memory %s session=%s mode=%s tokens %d->%d summarized=%d type=%s attempts=%d",
                kind,
                session_key,
                mode,
                plan.tokens_before,
                tokens_after,
                event.messages_summarized,
                event.result_type,
                len(event.attempts),
            )
        return event.as_dict()


def _view(state: SummaryState) -> SummaryView:
    return SummaryView(content=state.content, summary_type=state.summary_type, compressed_count=state.compressed_count)


class AgentMemoryMiddleware:
    """The before-model hook of agent mode: call :meth:`before_model` before every model call
    (after the previous step's messages are persisted) and send the returned context's messages.
    ``summarize_below`` is passed to :meth:`MemoryEngine.build_context` on every call.

    If building the context fails for any reason other than cancellation, the agent continues on
    a degraded context (old summary plus a raw archive of what did not fit, nothing written)
    instead of aborting the run (SPEC.md section 4).
    """

    def __init__(
        self,
        engine: MemoryEngine,
        *,
        session_key: str,
        system_prompt: str | None,
        load_increment: IncrementLoader,
        tools: list[dict[str, Any]] | None = None,
        summarize_below: int | None = None,
    ) -> None:
        self.engine = engine
        self.session_key = session_key
        self.system_prompt = system_prompt
        self.load_increment = load_increment
        self.tools = tools
        self.summarize_below = summarize_below

    async def before_model(self) -> MemoryContext:
        try:
            return await self.engine.build_context(
                session_key=self.session_key,
                system_prompt=self.system_prompt,
                load_increment=self.load_increment,
                mode="agent",
                tools=self.tools,
                summarize_below=self.summarize_below,
            )
        except Exception:
            logger.exception("memory engine failed for session %s; continuing on a degraded context", self.session_key)
            return await self.engine.degraded_context(
                session_key=self.session_key,
                system_prompt=self.system_prompt,
                load_increment=self.load_increment,
                mode="agent",
                tools=self.tools,
                summarize_below=self.summarize_below,
                reason="memory engine failed: degraded context, nothing written",
            )
