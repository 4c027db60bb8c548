"""What the engine needs from the product (docs/architecture.md): a summarizer, an embedder, a conversation source,
and optionally a job queue."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from memory.context.request import ContextRequest
    from memory.facts.values import KeyFact
    from memory.summary.store import CompressionRecord, Summary

EmbedKind = Literal["query", "passage"]


class Embedder(Protocol):
    model: str
    dimension: int

    async def embed(self, texts: list[str], *, kind: EmbedKind) -> np.ndarray:
        """Float32 ``(len(texts), dimension)``, rows L2-normalised; raises on failure (search goes lexical)."""
        ...


class JobQueue(Protocol):
    """Where memory jobs run when not in this process (docs/memory.md §10 "Where jobs run"): a durable queue whose
    workers call :meth:`memory.engine.MemoryEngine.run_jobs`. ``schedule`` returns at once; ``wait`` returns False at
    the deadline; ``activity`` is ``running``, ``queued``, ``batched`` or None (it may read the queue's tables)."""

    def schedule(self, memory_key: str, *, idle: bool = False) -> None: ...

    async def wait(self, memory_key: str, timeout_seconds: float) -> bool: ...

    def activity(self, memory_key: str) -> str | None: ...


ConversationAlive = Callable[[str], bool]
"""``alive(memory_key)``, asked inside a write's transaction: it should lock the conversation's row (F-41)."""


@dataclass(frozen=True, kw_only=True)
class SummaryReply:
    """A summarizer's ``text`` and the provider's ``finish_reason`` (None: unknown): a cut-off one is refused (F-36)."""

    text: str
    finish_reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class SummaryRequest:
    """One summarizer call (F-11); a rejected ``response_format`` falls back to ``json_object``, then to none.
    ``max_tokens``: the reply's budget; ``reply_tokens``: the provider's output limit (None: ``max_tokens``)."""

    previous_summary: str
    messages: list[dict[str, Any]]
    prompt: list[dict[str, Any]]
    max_tokens: int
    response_format: dict[str, Any] | None = None
    reply_tokens: int | None = None


@runtime_checkable
class Summarizer(Protocol):
    """Writes summaries; an optional ``method`` attribute (not a member, for ``isinstance``) says how."""

    model: str

    async def summarize(self, request: SummaryRequest) -> str | SummaryReply:
        """The new self-contained summary or a :class:`SummaryReply`; may raise anything (a failed attempt)."""
        ...


@dataclass(frozen=True, kw_only=True)
class StoredMessages:
    """A job's batch: wire dicts with ``id``, ``created_at``, oldest first; ``calls``: call id → (message id, call)."""

    scope_key: str
    messages: list[dict[str, Any]]
    calls: dict[str, tuple[int, dict[str, Any]]]


@dataclass(frozen=True, kw_only=True)
class NextRequest:
    """The next model call as the app would make it now; ``reserve_share`` of the target is kept for KB passages."""

    request: ContextRequest
    reserve_share: float
    last_message_id: int


class ConversationSource(Protocol):
    async def messages_after(self, memory_key: str, *, after: int | None, limit: int) -> StoredMessages | None:
        """Up to ``limit`` messages with an id above ``after``, app notes left out (F-37); None if gone."""
        ...

    async def has_messages_after(self, memory_key: str, *, after: int | None) -> bool:
        """Whether :meth:`messages_after` would return any message."""
        ...

    async def next_request(self, memory_key: str) -> NextRequest | None:
        """The conversation's next request; None when it is gone or empty."""
        ...

    def titles(self, memory_keys: set[str]) -> Mapping[str, str]:
        """``memory_key → title`` of those conversations, inside the engine's database work."""
        ...

    def alive(self, memory_key: str) -> bool:
        """See :data:`ConversationAlive`."""
        ...

    async def notify(self, memory_key: str, notice: Notice) -> None:
        """Tell the conversation's open pages what memory did; never raises."""
        ...


@dataclass(frozen=True, kw_only=True)
class Notice:
    """What memory did outside a request: job ``compressions``, the ``summary`` now, or all key ``facts``."""

    compressions: Sequence[CompressionRecord] = ()
    summary: Summary | None = None
    facts: Sequence[KeyFact] | None = None


RunSync = Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]
"""``run_sync(func)``: a coroutine function calling ``func`` on a database thread (``sync_to_async`` by default)."""
