"""What a model call asks of memory (:class:`ContextRequest`) and what it is sent, with why
(:class:`MemoryContext`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol

from memory.context.budget import Mode
from memory.facts.values import KeyFact
from memory.messages import Message
from memory.recall.values import RecallInput
from memory.summary.store import CompressionRecord, Summary

FactsLoader = Callable[[], Awaitable[list[KeyFact]]]
"""``await load_facts()``: the conversation's current key facts (not superseded, not hidden), in
any order (docs/memory.md §11)."""


RecallLoader = Callable[[int | None], Awaitable[RecallInput]]
"""``await load_recall(boundary)``: recall candidates for the request's current user message
(docs/memory.md §12): this owner's items of other conversations and of this one up to
``boundary`` (the stored summary's boundary, None: none of this one), with the query's embedding
when it came within the owning app's deadline. May raise: the request then goes on without
recall, and says so in ``repairs``."""


IncrementLoader = Callable[[int | None], Awaitable[list[Message]]]
"""``await load_increment(boundary)``: every persisted message of the conversation with an id
greater than ``boundary`` (all of them when None), ascending id, as wire dicts plus ``id`` and
optionally ``token_count``. Never a page: compaction must not read through a limited view
(docs/memory.md F-15)."""


Compression = Literal["sync", "background"]


Origin = Literal["request", "job"]


ContextPath = Literal["under_trigger", "no_progress", "compressed", "waited", "deferred", "degraded"]


class CompressionJobs(Protocol):
    """Where a request in background mode hands its compression (docs/memory.md §10): the
    conversation's memory job (:class:`memory.jobs.MemoryJobRunner` has this shape).

    ``await wait(memory_key, timeout_seconds)`` returns once no job of the conversation is
    pending or running, or at the deadline (False); ``schedule(memory_key)`` queues one and
    returns at once.
    """

    async def wait(self, memory_key: str, timeout_seconds: float) -> bool: ...

    def schedule(self, memory_key: str) -> None: ...


@dataclass(frozen=True, kw_only=True)
class ContextRequest:
    """What one model call needs from memory, passed whole to the engine.

    ``memory_key``: the conversation. ``system_prompt``: sent first and verbatim (None for none).
    ``load_increment``: see :data:`IncrementLoader`. ``mode``: ``agent`` or ``quick-answer``.
    ``tools``: the tool schemas sent with the request (counted, docs/memory.md F-20).
    ``summarize_below``: the first message id that must not be summarized (another turn of the
    conversation still in flight, docs/memory.md F-26). ``force``: compress now, whatever the
    size: every history message before the current turn is folded into the summary.
    ``compression``: ``sync`` compresses inside this call when over the trigger; ``background``
    only reads and leaves compressing to the conversation's memory job (docs/memory.md §10, see
    :meth:`memory.context.builder.ContextBuilder.build_context`). ``origin``: who asks, recorded with every compression
    event: ``request`` (a model call, or "compress now") or ``job`` (pre-compression).
    The agent loop builds a new request per step (``dataclasses.replace``) rather than mutating one.
    """

    memory_key: str
    system_prompt: str | None
    load_increment: IncrementLoader
    mode: Mode
    tools: list[dict[str, Any]] | None = None
    summarize_below: int | None = None
    force: bool = False
    compression: Compression | None = None
    origin: Origin = "request"
    load_facts: FactsLoader | None = None
    load_recall: RecallLoader | None = None

    @property
    def system(self) -> Message | None:
        """The system prompt as a wire message (None without one)."""
        return {"role": "system", "content": self.system_prompt} if self.system_prompt else None


@dataclass(kw_only=True)
class MemoryContext:
    """What one model call is sent, and why.

    ``messages``: the exact wire list; ``sources``: aligned ``{"id", "kind"}`` with kind
    ``system``/``facts``/``summary``/``history``/``current`` (the key-facts block's source also
    carries ``fact_ids`` and ``message_ids``), plus ``"merged": [sources]`` on a message
    that merges same-role neighbours (strict alternation, docs/memory.md F-38) and
    ``"folded": [ids]`` on a "steps so far" note (docs/memory.md I5); ``tokens``: estimated request size (tokens);
    ``sections``: tokens per section (``system``, ``facts``, ``summary``, ``retained``,
    ``current``, ``tools``); ``summary``: the summary the request was built with; ``events``: compression
    events recorded by this call; ``elisions``: messages of the current turn
    shortened in the model-facing copy; ``repairs``: what was dropped to keep tool calls paired,
    and why a degraded context was used; ``overflow``: still over the context window (the caller
    must not send it). ``path``: how memory met the request (docs/memory.md §10):
    ``under_trigger`` (nothing to do), ``no_progress`` (over the trigger, but nothing before the
    current turn may be summarized: only elision and folding of the current turn apply),
    ``compressed`` (compressed inside this call),
    ``waited`` (waited ``waited_ms`` milliseconds for the memory job, then under the trigger),
    ``deferred`` (still over the trigger: degraded context, compression left to the memory job)
    or ``degraded`` (the summarizer path could not be used: degraded context, nothing written).
    ``facts``: the key-facts block of the request (docs/memory.md §11), as ids:
    ``{"pinned", "in_window", "over_budget", "tokens"}`` (see :class:`memory.facts.FactsBlock`;
    empty when the request carried no facts loader). ``recall``: what recall brought and why
    (:func:`memory.recall.recall_report`; empty without a recall loader).
    ``token_factor``: the estimate calibration the budget applied (provider tokens per estimated
    token, docs/memory.md §5, "Calibration"); ``window_tokens``: the context window in estimated
    tokens (``context_window / token_factor``), what ``tokens``, ``trigger_tokens`` and
    ``target_tokens`` compare with (0 means ``context_window``).
    """

    messages: list[Message]
    sources: list[dict[str, Any]]
    tokens: int
    sections: dict[str, int]
    context_window: int
    trigger_tokens: int
    target_tokens: int
    summary: Summary
    events: list[CompressionRecord] = field(default_factory=list)
    elisions: list[dict[str, Any]] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    overflow: bool = False
    path: ContextPath = "under_trigger"
    waited_ms: int = 0
    facts: dict[str, Any] = field(default_factory=dict)
    recall: dict[str, Any] = field(default_factory=dict)
    token_factor: float = 1.0
    window_tokens: int = 0

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
            "events": [event.as_dict() for event in self.events],
            "elisions": self.elisions,
            "repairs": self.repairs,
            "overflow": self.overflow,
            "path": self.path,
            "waited_ms": self.waited_ms,
            "facts": self.facts,
            "recall": self.recall,
            "token_factor": self.token_factor,
            "window_tokens": self.window_tokens or self.context_window,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryContext:
        """The context of :meth:`as_dict` (a stored snapshot; fields older snapshots lack take
        their defaults)."""
        names = {f.name for f in fields(cls)} - {"summary", "events"}
        values = {key: value for key, value in data.items() if key in names}
        return cls(
            **values,
            summary=Summary.from_dict(data.get("summary") or {}),
            events=[CompressionRecord.from_dict(event) for event in data.get("events") or ()],
        )
