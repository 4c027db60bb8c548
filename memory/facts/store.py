"""The engine's key-fact port (docs/memory.md §11), kept by :class:`memory.storage.facts.OrmFactStore`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from memory.facts.values import FactCandidate, KeyFact


class FactStore(Protocol):
    """``active`` (not retired, not hidden) or ``every`` fact, oldest first; nothing is deleted; errors propagate."""

    async def active(self, memory_key: str) -> list[KeyFact]: ...

    async def every(self, memory_key: str) -> list[KeyFact]: ...

    async def apply(
        self,
        memory_key: str,
        *,
        scope_key: str,
        candidates: Sequence[FactCandidate],
        valid_from: Mapping[int, datetime],
    ) -> list[KeyFact]: ...
