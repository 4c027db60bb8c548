"""The recall block of a request and the report of what recall brought and why (docs/memory.md §12). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memory.recall.values import RecallInput, RecallItem, RecallResult, ScoredCandidate
from memory.tokens.counter import TokenCounter

RECALL_HEADER = "[Recalled from earlier — verbatim, may be outdated]"


_ROLE_LABELS = {"user": "User", "assistant": "Assistant", "tool": "Tool"}


def recall_line(item: RecallItem) -> str:
    """``- 2024-05-20 (chat "Trip", msg 123) User: text``, no chat part without a title; the text verbatim, indented."""
    where = f'chat "{item.chat_title}", ' if item.chat_title else ""
    ids = ", ".join(str(i) for i in item.message_ids)
    msg = f"msgs {ids}" if len(item.message_ids) > 1 else f"msg {ids}"
    label = _ROLE_LABELS.get(item.role, item.role.capitalize())
    text = item.text.strip().replace("\n", "\n  ")
    return f"- {item.created_at.date().isoformat()} ({where}{msg}) {label}: {text}"


def render_recall(items: Sequence[RecallItem]) -> str:
    """:data:`RECALL_HEADER`, then one :func:`recall_line` per item in chronological order."""
    ordered = sorted(items, key=lambda item: (item.created_at, item.message_ids, item.id))
    return "\n".join([RECALL_HEADER, *(recall_line(item) for item in ordered)])


def recall_block(items: Sequence[RecallItem], *, role: str, counter: TokenCounter) -> tuple[dict[str, Any], int]:
    """``({"role": role, "content": ...}, tokens)``: the block for ``items`` (docs/memory.md §12, "Block"). Raises
    ValueError for no items: no recall means no block."""
    if not items:
        raise ValueError("a recall block needs at least one item")
    message = {"role": role, "content": render_recall(items)}
    return message, counter.count_message(message)


def recall_report(data: RecallInput | None, result: RecallResult) -> dict[str, Any]:
    """One request's recall as JSON: the ``recall`` of ``memory.context`` (docs/protocol.md); ``{}`` without recall."""
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
