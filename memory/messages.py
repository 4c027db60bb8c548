"""The Chat Completions message as memory handles it; its wire form has ``content`` None only beside ``tool_calls``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

Message = dict[str, Any]


WIRE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def created_at(message: Message) -> datetime | None:
    """``message``'s ``created_at`` (a datetime or ISO 8601 text) as a datetime; None when absent or unreadable."""
    created: Any = message.get("created_at")
    if isinstance(created, str):
        try:
            created = datetime.fromisoformat(created)
        except ValueError:
            return None
    return created if isinstance(created, datetime) else None


def to_wire(message: Message) -> Message:
    wire = {key: message[key] for key in WIRE_KEYS if message.get(key) not in (None, [])}
    wire.setdefault("content", None if wire.get("tool_calls") else "")
    return wire


def call_ids(message: Message) -> list[str]:
    if message.get("role") != "assistant":
        return []
    return [call.get("id") for call in message.get("tool_calls") or () if call.get("id")]


def found_nothing(message: Message, empty_results: tuple[str, ...]) -> bool:
    """Whether ``message`` is a tool result that found nothing: empty, or starting with one of ``empty_results``
    (case-insensitive). Such a result is no fact: memory neither summarizes nor indexes it (docs/memory.md §12)."""
    if message.get("role") != "tool":
        return False
    content = message.get("content")
    if not isinstance(content, str):
        return not content
    text = content.strip().lower()
    return not text or any(text.startswith(prefix.lower()) for prefix in empty_results)
