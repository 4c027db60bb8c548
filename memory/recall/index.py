"""The recall index as the engine uses it: a storage port (docs/memory.md §12). The database
keeps it (:class:`memory.storage.index.OrmRecallIndex`); the engine never reads a row itself."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol

import numpy as np

from memory.recall.pieces import IndexPiece
from memory.recall.values import LexicalHits, RecallCandidate, RecallItem, ScoredCandidate, TermRarity

Scope = Literal["chat", "owner"]
Found = tuple[
    list[RecallCandidate], TermRarity | None, tuple[ScoredCandidate, ...] | None, dict[int, tuple[RecallItem, ...]]
]


class RecallIndex(Protocol):
    """One owner's index of stored messages: written by the memory job, searched by requests.

    ``scope_key`` names the owner, ``memory_key`` the conversation, ``boundary`` the id up to
    which this conversation's own items may be recalled (its summary's boundary). Storage errors
    propagate.
    """

    def embeddings_known(self, *, scope_key: str, model: str) -> bool | None:
        """Whether the owner has embeddings of ``model``, if this process knows (None: ask)."""
        ...

    async def embeddings_exist(self, *, scope_key: str, model: str) -> bool: ...

    async def lexical(
        self, *, scope_key: str, memory_key: str, boundary: int | None, scope: Scope, query: str
    ) -> tuple[LexicalHits, TermRarity | None]:
        """The full-text hits for ``query`` with their rows, and the rarity of its terms when
        anything was found."""
        ...

    async def candidates(
        self,
        *,
        scope_key: str,
        memory_key: str,
        boundary: int | None,
        scope: Scope,
        query: str,
        vector: np.ndarray | None,
        model: str | None,
        hits: LexicalHits,
        rarity: TermRarity | None,
        now: datetime,
    ) -> Found:
        """The candidates (full-text ``hits`` plus the nearest by ``vector``), the rarity, the
        candidates scored once for the request, and the neighbours of the best of this chat."""
        ...

    async def write(
        self, *, memory_key: str, scope_key: str, message_ids: Sequence[int], pieces: Sequence[IndexPiece]
    ) -> tuple[int, int]:
        """Make the items of ``message_ids`` equal ``pieces``; ``(inserted, deleted)``."""
        ...

    async def unembedded(self, *, memory_key: str, model: str) -> list[tuple[int, str, int]]:
        """``(id, text, last_message_id)`` of the next items without an embedding of ``model``."""
        ...

    async def unembedded_exist(self, *, memory_key: str, model: str) -> bool: ...

    async def save_embeddings(self, *, vectors: dict[int, np.ndarray], model: str) -> int: ...

    async def status(self, *, memory_key: str) -> dict[str, Any]:
        """``{"items", "embedded", "models"}`` of the conversation."""
        ...
