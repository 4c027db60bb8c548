"""Readers of values stored as JSON."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def datetime_or_none(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))
