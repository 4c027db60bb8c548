"""Key facts as the engine reads and writes them: a storage port (docs/memory.md §11). The
database keeps them (:class:`memory.storage.facts.OrmFactStore`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from memory.facts.values import FactCandidate, KeyFact


class FactStore(Protocol):
    """One conversation's key facts (``memory_key``); nothing is ever deleted. Storage errors
    propagate."""

    async def active(self, memory_key: str) -> list[KeyFact]:
        """The current facts (not retired, not hidden), oldest first."""
        ...

    async def every(self, memory_key: str) -> list[KeyFact]:
        """Every fact, retired and hidden ones included, oldest first."""
        ...

    async def apply(
        self,
        memory_key: str,
        *,
        scope_key: str,
        candidates: Sequence[FactCandidate],
        valid_from: Mapping[int, datetime],
    ) -> list[KeyFact]:
        """Store validated candidates and their supersessions; the facts created."""
        ...
