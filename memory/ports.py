"""What the engine needs from the product: the summarizer, the embedder and the conversation's
owner app. Each is a small protocol."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

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
