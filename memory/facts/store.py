"""The engine's key-fact port (docs/memory.md §11), kept by :class:`memory.storage.facts.OrmFactStore`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from memory.facts.values import FactCandidate, KeyFact


class FactStore(Protocol):
    """``active`` (not retired, not hidden) or ``every`` fact, oldest first; nothing is deleted; errors propagate.
    ``active`` with ``scope_key`` adds the personal facts of that owner's other chats and ends this chat's where
    another chat changed them later (docs/memory.md §11 "Owner-wide")."""

    async def active(self, memory_key: str, *, scope_key: str | None = None) -> list[KeyFact]: ...

    async def every(self, memory_key: str) -> list[KeyFact]: ...

    async def apply(
        self,
        memory_key: str,
        *,
        scope_key: str,
        candidates: Sequence[FactCandidate],
        valid_from: Mapping[int, datetime],
    ) -> list[KeyFact]: ...
