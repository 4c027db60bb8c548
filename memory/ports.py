"""What the engine needs from the product: the summarizer, the embedder and the conversation's
owner app. Each is a small protocol."""

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
    """Turns texts into vectors for recall (docs/memory.md §12, "embeddings").

    ``model``: the model's name, stored with each embedding (vectors of different models are never
    compared); ``dimension``: the length of each vector. ``await embed(texts, kind=...)`` returns a
    float32 array of shape ``(len(texts), dimension)`` whose rows are L2-normalised (so a dot
    product is the cosine); ``kind`` is ``query`` for a search query and ``passage`` for an
    indexed text (e5 models prefix them differently). Raises any exception on failure (the
    callers degrade to lexical-only search).
    """

    model: str
    dimension: int

    async def embed(self, texts: list[str], *, kind: EmbedKind) -> np.ndarray: ...


ConversationAlive = Callable[[str], bool]
"""``alive(memory_key)``: whether the conversation still exists, asked inside a write's transaction
by the app that owns it; it should lock the conversation's row so a concurrent delete waits for
the write or the write sees the delete (docs/memory.md F-41)."""


@dataclass(frozen=True, kw_only=True)
class SummaryReply:
    """What a summarizer answered: ``text`` and the provider's ``finish_reason`` (``"stop"``,
    ``"length"``, …; None when unknown). Summarizers that can tell a cut-off reply from a finished
    one return this instead of a bare string, so the chain can refuse it (docs/memory.md F-36)."""

    text: str
    finish_reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class SummaryRequest:
    """One summarizer call.

    ``previous_summary``: the old summary text, ``""`` on a session's first compression.
    ``messages``: the prefix being folded in, OpenAI wire dicts (they may carry an ``id`` key).
    ``prompt``: the ready wire prompt, ``[system instructions, user transcript]`` (docs/memory.md F-11).
    ``max_tokens``: the output cap in tokens (30 % rule and hard cap already applied).
    ``response_format``: the OpenAI ``response_format`` to ask for, e.g. ``{"type":
    "json_schema", "json_schema": {"name", "schema", "strict"}}`` for a key-facts extraction
    (docs/memory.md §11); None (summaries) asks for plain text. A summarizer whose endpoint
    rejects it falls back to ``{"type": "json_object"}``, then to none, so the caller must
    still parse the reply tolerantly.
    """

    previous_summary: str
    messages: list[dict[str, Any]]
    prompt: list[dict[str, Any]]
    max_tokens: int
    response_format: dict[str, Any] | None = None


@runtime_checkable
class Summarizer(Protocol):
    """Anything that turns a :class:`SummaryRequest` into summary text.

    ``model`` names it in attempt records. ``summarize`` returns the new self-contained summary
    text, or a :class:`SummaryReply` that also says whether the provider finished it; it may raise
    any exception, which the chain records as a failed attempt. The chain judges every reply with
    :func:`check_reply`. An optional ``method`` attribute says how it writes summaries
    (:data:`METHOD_LLM`, the default when absent, or :data:`METHOD_EXTRACTIVE` for one that copies
    sentences without a language model); the chain records it on each attempt, so the inspector
    can say who wrote a summary. (Not a protocol member: ``isinstance`` would then require it.)
    """

    model: str

    async def summarize(self, request: SummaryRequest) -> str | SummaryReply: ...


@dataclass(frozen=True, kw_only=True)
class StoredMessages:
    """A batch of a conversation's stored messages for the memory job: ``scope_key``, the owner's
    opaque key (docs/memory.md §11, "scope"); ``messages``, wire dicts plus ``id`` and
    ``created_at`` (aware datetime), oldest first; ``calls``, for tool results whose call was
    stored before the batch, tool-call id → (its message id, the call)."""

    scope_key: str
    messages: list[dict[str, Any]]
    calls: dict[str, tuple[int, dict[str, Any]]]


@dataclass(frozen=True, kw_only=True)
class NextRequest:
    """What the conversation's next model call will carry besides its history (pre-compression,
    docs/memory.md §10): ``request``, the request as the owning app would make it now;
    ``reserve_share``, the share of the target it keeps for content not known yet (knowledge-base
    passages); ``last_message_id``, the newest stored message."""

    request: ContextRequest
    reserve_share: float
    last_message_id: int


class ConversationSource(Protocol):
    """The owning app's side of a conversation (named by its ``memory_key``): its stored messages,
    its owner, its title, whether it still exists, and where to tell what memory did.

    Reads and :meth:`notify` are coroutines; :meth:`alive` and :meth:`titles` run inside the
    engine's own database work (a write's transaction, a search), so they are synchronous.
    """

    async def messages_after(self, memory_key: str, *, after: int | None, limit: int) -> StoredMessages | None:
        """Up to ``limit`` stored messages with an id above ``after`` (all when None), the app's
        own notes left out (docs/memory.md F-37); None when the conversation is gone."""
        ...

    async def has_messages_after(self, memory_key: str, *, after: int | None) -> bool:
        """Whether :meth:`messages_after` would return any message."""
        ...

    async def next_request(self, memory_key: str) -> NextRequest | None:
        """The conversation's next request (None when it is gone or empty)."""
        ...

    def titles(self, memory_keys: set[str]) -> Mapping[str, str]:
        """The titles of those conversations (for recalled items' provenance)."""
        ...

    def alive(self, memory_key: str) -> bool:
        """See :data:`ConversationAlive`."""
        ...

    async def notify(self, memory_key: str, notice: Notice) -> None:
        """Tell the conversation's open pages what memory just did (never raises)."""
        ...


@dataclass(frozen=True, kw_only=True)
class Notice:
    """What memory did outside a request: ``compressions`` recorded by the memory job, the
    ``summary`` as it is now, or every key fact of the conversation after new ones (``facts``)."""

    compressions: Sequence[CompressionRecord] = ()
    summary: Summary | None = None
    facts: Sequence[KeyFact] | None = None


RunSync = Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]
"""How the engine runs synchronous database work from async code: ``run_sync(func)`` returns a
coroutine function calling ``func`` on a database thread (asgiref's ``sync_to_async`` by
default; the owning app may pass its own bounded pool)."""
