"""The recall block of a request and the report of what recall brought and why
(docs/memory.md §12). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memory.recall.values import RecallInput, RecallItem, RecallResult, ScoredCandidate
from memory.tokens.counter import TokenCounter

# The recall block's first line (docs/memory.md §12, "the block").
RECALL_HEADER = "[Recalled from earlier — verbatim, may be outdated]"


_ROLE_LABELS = {"user": "User", "assistant": "Assistant", "tool": "Tool"}


def recall_line(item: RecallItem) -> str:
    """One item of the recall block: ``- 2024-05-20 (chat "Trip", msg 123) User: text``, the
    date of ``created_at`` in its own time zone, the chat part left out when the title is empty,
    ``msgs 12, 13`` for a piece of several messages; the text verbatim, later lines indented."""
    where = f'chat "{item.chat_title}", ' if item.chat_title else ""
    ids = ", ".join(str(i) for i in item.message_ids)
    msg = f"msgs {ids}" if len(item.message_ids) > 1 else f"msg {ids}"
    label = _ROLE_LABELS.get(item.role, item.role.capitalize())
    text = item.text.strip().replace("\n", "\n  ")
    return f"- {item.created_at.date().isoformat()} ({where}{msg}) {label}: {text}"


def render_recall(items: Sequence[RecallItem]) -> str:
    """The recall block's text: :data:`RECALL_HEADER`, then one :func:`recall_line` per item in
    chronological order (``created_at``, then message ids)."""
    ordered = sorted(items, key=lambda item: (item.created_at, item.message_ids, item.id))
    return "\n".join([RECALL_HEADER, *(recall_line(item) for item in ordered)])


def recall_block(items: Sequence[RecallItem], *, role: str, counter: TokenCounter) -> tuple[dict[str, Any], int]:
    """The recall block message for ``items`` (docs/memory.md §12: after the summary, before the
    retained window): ``{"role": role, "content": render_recall(items)}`` and its size in
    tokens (``counter.count_message``). ``role``: the summary block's role. Raises ValueError for
    no items (no recall means no block)."""
    if not items:
        raise ValueError("a recall block needs at least one item")
    message = {"role": role, "content": render_recall(items)}
    return message, counter.count_message(message)


def recall_report(data: RecallInput | None, result: RecallResult) -> dict[str, Any]:
    """The JSON form of one request's recall for the inspector and the request snapshot:
    ``query``, ``model`` (None: lexical only), ``latency_ms``, ``embedding_ms``, ``notes``, ``tokens`` of the
    block, and for ``items`` (recalled, block order), ``rejected`` (best refused) and
    ``over_budget`` each ``{"item_id", "memory_key", "chat_title", "message_ids", "role",
    "created_at", "text", "lexical_rank", "cosine", "dense_rank", "rrf", "decay", "score",
    "reason", "context_of"}`` (``context_of``: the item id a context item is next to, else
    null). Empty (``{}``) when the request had no recall."""
    if data is None:
        return {}

    def entry(scored: ScoredCandidate) -> dict[str, Any]:
        item = scored.item
        return {
            "item_id": item.id,
            "memory_key": item.memory_key,
            "chat_title": item.chat_title,
            "message_ids": list(item.message_ids),
            "role": item.role,
            "created_at": item.created_at.isoformat(),
            "text": item.text[:300],
            "lexical_rank": scored.candidate.lexical_rank,
            "cosine": None if scored.candidate.cosine is None else round(scored.candidate.cosine, 4),
            "dense_rank": scored.dense_rank,
            "rrf": round(scored.rrf, 5),
            "decay": round(scored.decay, 4),
            "score": round(scored.score, 5),
            "reason": scored.reason,
            "context_of": scored.context_of,
        }

    return {
        "query": data.query[:300],
        "model": data.model,
        "latency_ms": data.latency_ms,
        "embedding_ms": data.embedding_ms,
        "notes": list(data.notes),
        "tokens": result.tokens,
        "items": [entry(s) for s in result.items],
        "rejected": [entry(s) for s in result.rejected],
        "over_budget": [entry(s) for s in result.over_budget[:5]],
    }
