"""Offline-engine switches in a context variable: they hold for one task tree (the demo's chat, docs/demo.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class OfflineOverrides:
    """``chat_delay_seconds`` added before a chat reply; ``summary_outage``: HTTP 500 text for summarizer calls."""

    chat_delay_seconds: float = 0.0
    summary_outage: str = ""

    def __post_init__(self) -> None:
        if self.chat_delay_seconds < 0:
            raise ValueError(f"chat_delay_seconds must be at least 0, not {self.chat_delay_seconds!r}")


NO_OVERRIDES = OfflineOverrides()

_overrides: ContextVar[OfflineOverrides] = ContextVar("offline_overrides", default=NO_OVERRIDES)


def offline_overrides_current() -> OfflineOverrides:
    return _overrides.get()


@contextlib.contextmanager
def offline_overrides(overrides: OfflineOverrides) -> Iterator[OfflineOverrides]:
    """Apply ``overrides`` here and in tasks created here (they copy the context) until exit; blocks nest."""
    token = _overrides.set(overrides)
    try:
        yield overrides
    finally:
        _overrides.reset(token)
