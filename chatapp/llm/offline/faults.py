"""Switches of the offline engine scoped to one task tree instead of the whole process.

The process-wide demo switches (``OFFLINE_DELAY``, ``OFFLINE_FAIL_SUMMARY``, ``OFFLINE_FAIL_CHAT``,
read from settings by :mod:`chatapp.llm.offline.transport`) act on every chat at once. The demo
walk-through (:mod:`chatapp.conversation.demo`, docs/demo.md) needs them for its own chat only:
a thinking pause before each of its replies and one summarizer outage. :func:`offline_overrides`
sets them in a :class:`contextvars.ContextVar`, so they hold for the code run inside the block
and for every asyncio task created there (a task copies its creator's context when it is
created): the demo's turns and the memory jobs they schedule. No other chat's request runs in
that context, so no other chat sees them. The transport reads them with
:func:`offline_overrides_current` at request time. Pure: no I/O.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class OfflineOverrides:
    """What the offline engine does differently inside :func:`offline_overrides`.

    ``chat_delay_seconds``: seconds to wait before answering a chat request (not a summarizer
    request), on top of ``OFFLINE_DELAY``; at least 0. ``summary_outage``: when not empty,
    every summarizer request (summaries and key-facts extractions) gets HTTP 500 with this text
    in its error message, as with ``OFFLINE_FAIL_SUMMARY`` (docs/memory.md §4: the degradation
    chain then ends in the raw archive).
    """

    chat_delay_seconds: float = 0.0
    summary_outage: str = ""

    def __post_init__(self) -> None:
        if self.chat_delay_seconds < 0:
            raise ValueError(f"chat_delay_seconds must be at least 0, not {self.chat_delay_seconds!r}")


NO_OVERRIDES = OfflineOverrides()

_overrides: ContextVar[OfflineOverrides] = ContextVar("offline_overrides", default=NO_OVERRIDES)


def offline_overrides_current() -> OfflineOverrides:
    """The overrides of the running context (:data:`NO_OVERRIDES` outside any block)."""
    return _overrides.get()


@contextlib.contextmanager
def offline_overrides(overrides: OfflineOverrides) -> Iterator[OfflineOverrides]:
    """Apply ``overrides`` to the offline engine's requests made in this context, and in the
    tasks created in it, until the block exits (see the module docstring). Blocks nest: the
    inner one replaces the outer one's overrides, which come back when it exits."""
    token = _overrides.set(overrides)
    try:
        yield overrides
    finally:
        _overrides.reset(token)
