"""What a model call asks of memory (:class:`ContextRequest`) and what it is sent, with why (:class:`MemoryContext`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal, Protocol

from memory.context.budget import Mode
from memory.context.timeline import with_date_line
from memory.facts.values import KeyFact
from memory.messages import Message
from memory.recall.values import RecallInput
from memory.summary.store import CompressionRecord, Summary

FactsLoader = Callable[[], Awaitable[list[KeyFact]]]
"""``await load_facts()``: the conversation's active key facts, in any order (docs/memory.md §11)."""


RecallLoader = Callable[[int | None], Awaitable[RecallInput]]
"""``await load_recall(boundary)``: the owner's recall candidates, this chat's only up to ``boundary`` (docs/memory.md
§12). May raise: the request then goes on without recall and says so in ``repairs``."""


IncrementLoader = Callable[[int | None], Awaitable[list[Message]]]
"""``await load_increment(boundary)``: every stored message with an id above ``boundary``, ascending, as wire dicts
plus ``id`` (and ``token_count``). Never a page (docs/memory.md F-15)."""


Compression = Literal["sync", "background"]


Origin = Literal["request", "job"]


ContextPath = Literal["under_trigger", "no_progress", "compressed", "waited", "deferred", "degraded"]


class CompressionJobs(Protocol):
    """Where a background-mode request hands its compression (docs/memory.md §10): ``wait`` returns False at the
    deadline, ``schedule`` queues a job and returns at once (:class:`memory.jobs.MemoryJobRunner` has this shape)."""

    async def wait(self, memory_key: str, timeout_seconds: float) -> bool: ...

    def schedule(self, memory_key: str) -> None: ...


@dataclass(frozen=True, kw_only=True)
class ContextRequest:
    """What one model call needs from memory (a new one per agent step): ``tools`` are counted (F-20), nothing from id
    ``summarize_below`` on is summarized (F-26), ``force`` folds all history before the turn; ``compression`` ``sync``
    compresses inside the call, ``background`` leaves it to the memory job (§10); ``origin`` is recorded on events;
    ``now`` (aware: its zone names the day) puts the date on the wire (F-52), None: unknown, no dates;
    ``scope_key`` names the conversation's owner, whose personal key facts of other chats it may see (§11);
    ``imagined_tokens``: a memory job's imagined next message, which may use the room between target and trigger (§10)."""

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
    now: datetime | None = None
    scope_key: str | None = None
    imagined_tokens: int = 0

    @property
    def system(self) -> Message | None:
        content = with_date_line(self.system_prompt, self.now)
        return {"role": "system", "content": content} if content else None


@dataclass(kw_only=True)
class MemoryContext:
    """What one model call is sent, and why: the fields of the ``memory.context`` event (docs/protocol.md), in
    estimated tokens; a source may carry ``merged`` sources (F-38) or ``folded`` ids (a steps note, I5); ``overflow``
    True: still over the window, must not be sent; ``window_tokens`` 0 means ``context_window``."""

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
        """The context of :meth:`as_dict`; fields an older snapshot lacks take their defaults."""
        names = {f.name for f in fields(cls)} - {"summary", "events"}
        values = {key: value for key, value in data.items() if key in names}
        return cls(
            **values,
            summary=Summary.from_dict(data.get("summary") or {}),
            events=[CompressionRecord.from_dict(event) for event in data.get("events") or ()],
        )
