"""The recall index port (docs/memory.md §12), kept by ``memory.storage.index``; storage errors propagate."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, Protocol

import numpy as np

from memory.recall.pieces import IndexPiece
from memory.recall.values import (
    CosineBackground,
    LexicalHits,
    RecallCandidate,
    RecallItem,
    ScoredCandidate,
    TermRarity,
)

Scope = Literal["chat", "owner"]
Found = tuple[
    list[RecallCandidate],
    TermRarity | None,
    tuple[ScoredCandidate, ...] | None,
    dict[int, tuple[RecallItem, ...]],
    CosineBackground | None,
]


class RecallIndex(Protocol):
    def embeddings_known(self, *, scope_key: str, model: str) -> bool | None:
        """Whether the owner has embeddings of ``model``, if this process knows (None: ask)."""
        ...

    async def embeddings_exist(self, *, scope_key: str, model: str) -> bool: ...

    async def lexical(
        self, *, scope_key: str, memory_key: str, boundary: int | None, scope: Scope, query: str
    ) -> tuple[LexicalHits, TermRarity | None]:
        """Full-text hits of ``query`` with their rows (this chat's up to ``boundary``), and its terms' rarity."""
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
        """``hits`` plus the nearest by ``vector``, the rarity, the scored candidates, the best's neighbours and the
        query's cosine background."""
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
