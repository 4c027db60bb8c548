"""Time on the wire (docs/memory.md §3, F-52): the date line and history's day markers, model-facing only. Pure."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from memory.context.units import Unit
from memory.messages import Message, created_at
from memory.tokens.counter import TokenCounter

WIDEST_MARKER = "[2026-11-22 Wed]\n"
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def date_line(now: datetime) -> str:
    """``Current date: 2026-11-22 (Sunday), 14:05, time zone Europe/Berlin.``; no zone part for a naive ``now``."""
    zone = now.tzname() if now.tzinfo is not None else None
    name = getattr(now.tzinfo, "key", None) or zone
    where = f", time zone {name}" if name else ""
    return f"Current date: {now.date().isoformat()} ({WEEKDAYS[now.weekday()]}), {now:%H:%M}{where}."


def with_date_line(system_prompt: str | None, now: datetime | None) -> str | None:
    """``system_prompt`` followed by :func:`date_line` (alone when there is no prompt); unchanged without ``now``."""
    if now is None:
        return system_prompt
    line = date_line(now)
    return f"{system_prompt.rstrip()}\n\n{line}" if system_prompt else line


def day_marker(day: date) -> str:
    """``[2026-11-22 Sun]``: the day a history message was written, as it leads the message's text."""
    return f"[{day.isoformat()} {WEEKDAYS[day.weekday()][:3]}]"


def marker_reserve(counter: TokenCounter) -> int:
    """Tokens held back for the window's lead marker (:func:`mark_lead`): the widest one, one more for a merge."""
    return counter.count_text(WIDEST_MARKER) + 1


def has_other_days(units: list[Unit], now: datetime | None) -> bool:
    """Whether a history turn was written on another day than ``now``'s: only then may a cut need a lead marker."""
    if now is None:
        return False
    today = now.date()
    return any(unit.starts_turn and message_day(unit.members[0], now) not in (None, today) for unit in units)


def message_day(message: Message, now: datetime) -> date | None:
    """The day of ``message``'s ``created_at`` (a datetime or ISO 8601 text) in ``now``'s zone; None when unknown."""
    created = created_at(message)
    if created is None:
        return None
    if created.tzinfo is not None and now.tzinfo is not None:
        created = created.astimezone(now.tzinfo)
    return created.date()


def mark_days(units: list[Unit], now: datetime | None, counter: TokenCounter) -> None:
    """Lead each history turn with its :func:`day_marker` where its day differs from the previous message's; recounted."""
    if now is None:
        return
    previous: date | None = now.date()
    for unit in units:
        day = message_day(unit.members[0], now)
        if day is not None and day != previous and unit.starts_turn and unit.wire:
            _mark(unit, day, counter)
        for member in unit.members:
            previous = message_day(member, now) or previous


def mark_lead(units: list[Unit], now: datetime | None, counter: TokenCounter) -> None:
    """Lead the window's first turn with its day when not today and unmarked (a cut moved the day change away)."""
    if now is None:
        return
    first = next((unit for unit in units if unit.starts_turn and unit.wire), None)
    if first is None or first.wire[0].get("day_marked"):
        return
    day = message_day(first.members[0], now)
    if day is not None and day != now.date():
        _mark(first, day, counter)


def _mark(unit: Unit, day: date, counter: TokenCounter) -> None:
    message = unit.wire[0]
    marker = day_marker(day)
    content = message.get("content")
    if isinstance(content, list):
        marked: Any = [{"type": "text", "text": marker}, *content]
    else:
        marked = f"{marker}\n{content}" if content else marker
    cached = message.get("token_count")
    before = cached if isinstance(cached, int) and cached >= 0 else counter.count_message(message)
    unit.wire[0] = {**message, "content": marked, "token_count": None, "day_marked": True}
    unit.tokens += counter.count_message(unit.wire[0]) - before
