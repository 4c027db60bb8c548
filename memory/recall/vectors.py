"""Embeddings as bytes and the per-owner vector cache searched with numpy (docs/memory.md §12)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from memory.recall.values import CosineBackground


def vector_bytes(vector: np.ndarray) -> bytes:
    """An embedding as stored: float32, little-endian."""
    return np.asarray(vector, dtype="<f4").tobytes()


def vector_from_bytes(data: bytes | memoryview, dimension: int) -> np.ndarray | None:
    """A stored embedding as a float32 vector, or None when its size does not match ``dimension``."""
    raw = bytes(data)
    if dimension <= 0 or len(raw) != 4 * dimension:
        return None
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


VectorRow = tuple[int, str, int, bytes | memoryview | None, str, int]
"""One row the vector cache reads: ``(id, memory_key, last_message_id, embedding, embedding_model,
embedding_dim)``."""


VectorReader = Callable[[int, Sequence[int]], Iterable[VectorRow]]
"""``read(after_id, ids)``: the owner's rows with an id above ``after_id`` plus the rows ``ids``
(still without a usable embedding when last read), in any order."""


# Rows without a usable embedding (until the memory job embeds them) are read again at most this often (seconds)
# and this many per query.
MISSING_RECHECK_SECONDS = 10.0


MISSING_CHUNK = 500


@dataclass
class OwnerVectors:
    """One owner's cached embeddings of one model: row ``k`` of ``matrix`` is item ``ids[k]`` of chat ``chats[k]``,
    newest message ``last_ids[k]``, ``alive[k]`` False once deleted; arrays grow by doubling, ``size`` rows filled."""

    model: str
    dimension: int
    size: int = 0
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    last_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    chats: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    alive: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    matrix: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    last_seen: int = 0
    missing: set[int] = field(default_factory=set)
    missing_checked: float = 0.0
    position: dict[int, int] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """The memory this owner's cache holds, in bytes: its arrays, and about 100 per id in ``position``."""
        arrays = (self.ids, self.last_ids, self.chats, self.alive, self.matrix)
        return sum(array.nbytes for array in arrays) + 100 * len(self.position)

    def add(self, rows: list[tuple[int, str, int, np.ndarray]]) -> None:
        """Append ``(id, memory_key, last_message_id, vector)`` rows (ids not cached yet)."""
        rows = [row for row in rows if row[0] not in self.position]
        if not rows:
            return
        need = self.size + len(rows)
        if need > len(self.ids):
            capacity = max(need, 2 * len(self.ids), 64)
            self.ids = _grown(self.ids, capacity)
            self.last_ids = _grown(self.last_ids, capacity)
            self.chats = _grown(self.chats, capacity)
            self.alive = _grown(self.alive, capacity)
            matrix = np.zeros((capacity, self.dimension), dtype=np.float32)
            if self.size:
                matrix[: self.size] = self.matrix[: self.size]
            self.matrix = matrix
        for offset, (item_id, chat, last_id, vector) in enumerate(rows):
            k = self.size + offset
            self.ids[k], self.chats[k], self.last_ids[k], self.alive[k] = item_id, chat, last_id, True
            self.matrix[k] = vector
            self.position[item_id] = k
        self.size = need


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    grown = np.zeros(capacity, dtype=array.dtype)
    grown[: len(array)] = array
    return grown


@dataclass(frozen=True)
class DenseHit:
    """An item the dense side found: its id and cosine to the query."""

    id: int
    cosine: float


@dataclass(frozen=True, kw_only=True)
class DenseSearch:
    """One dense search: the nearest ``hits`` best first, the cosines of the items asked for ``also``, and the
    ``background`` of the query's cosines to every eligible item (the gate's margin is measured above it)."""

    hits: list[DenseHit] = field(default_factory=list)
    also: dict[int, float] = field(default_factory=dict)
    background: CosineBackground = field(default_factory=lambda: CosineBackground.of(()))


class VectorCache:
    """Per-owner embeddings in memory, append-only (docs/memory.md §12, "Embeddings"): a lookup reads only rows above
    the last id read, plus those without a usable embedding every :data:`MISSING_RECHECK_SECONDS`; at most
    ``max_owners`` owners and ``max_bytes`` bytes (the owner searched is always kept), least recently used dropped.
    Thread-safe."""

    def __init__(
        self, *, max_owners: int = 64, max_bytes: int = 256 * 2**20, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_owners = max_owners
        self.max_bytes = max_bytes
        self._clock = clock
        self._owners: OrderedDict[str, OwnerVectors] = OrderedDict()
        self._lock = threading.Lock()

    def holds(self, scope_key: str) -> bool:
        """Whether the owner's vectors are in this cache now."""
        with self._lock:
            return scope_key in self._owners

    def clear(self) -> None:
        """Forget every owner (tests; a process that changed embedder)."""
        with self._lock:
            self._owners.clear()

    def search(
        self,
        scope_key: str,
        *,
        model: str | None,
        query: np.ndarray,
        read: VectorReader,
        eligible: Callable[[np.ndarray, np.ndarray], np.ndarray],
        limit: int,
        also: Iterable[int] = (),
    ) -> DenseSearch:
        """The ``limit`` items most similar to ``query`` (L2-normalised) among the rows ``eligible(chats, last_ids)``
        allows, best first, the cosines of the cached items ``also`` and the background of all eligible rows; only
        ``model``'s embeddings of the query's dimension count. ``read`` runs under the lock; storage errors
        propagate."""
        dimension = int(query.shape[-1])
        with self._lock:
            owner = self._owners.get(scope_key)
            if owner is None or owner.dimension != dimension or (model is not None and owner.model != model):
                owner = OwnerVectors(model=model or "", dimension=dimension)
                self._owners[scope_key] = owner
            self._owners.move_to_end(scope_key)
            while len(self._owners) > self.max_owners:
                self._owners.popitem(last=False)
            self._refresh(owner, read, model)
            held = sum(cached.nbytes for cached in self._owners.values())
            while held > self.max_bytes and len(self._owners) > 1:
                _, dropped = self._owners.popitem(last=False)
                held -= dropped.nbytes
            size = owner.size
            ids, chats, last_ids, alive = (
                owner.ids[:size],
                owner.chats[:size],
                owner.last_ids[:size],
                owner.alive[:size],
            )
            matrix = owner.matrix[:size]
            rows = {item_id: owner.position[item_id] for item_id in also if item_id in owner.position}
        if not size:
            return DenseSearch()
        # einsum runs in this thread; a BLAS product may start a thread per core and wait for them on a busy server.
        scores = np.einsum("ij,j->i", matrix, query.astype(np.float32))
        mask = alive & eligible(chats, last_ids)
        candidates = np.flatnonzero(mask)
        if len(candidates) > limit:
            top = candidates[np.argpartition(-scores[candidates], limit - 1)[:limit]]
        else:
            top = candidates
        top = top[np.argsort(-scores[top], kind="stable")]
        hits = [DenseHit(int(ids[k]), float(scores[k])) for k in top]
        extra = {item_id: float(scores[k]) for item_id, k in rows.items()}
        return DenseSearch(hits=hits, also=extra, background=CosineBackground.of(scores[candidates]))

    def forget(self, scope_key: str, item_ids: Iterable[int]) -> None:
        """Mark items found deleted so they are no longer returned."""
        with self._lock:
            owner = self._owners.get(scope_key)
            if owner is None:
                return
            for item_id in item_ids:
                k = owner.position.get(item_id)
                if k is not None:
                    owner.alive[k] = False
                owner.missing.discard(item_id)

    def _refresh(self, owner: OwnerVectors, read: VectorReader, model: str | None) -> None:
        now = self._clock()
        recheck: list[int] = []
        if owner.missing and now - owner.missing_checked >= MISSING_RECHECK_SECONDS:
            recheck = sorted(owner.missing)[:MISSING_CHUNK]
            owner.missing_checked = now
        new: list[tuple[int, str, int, np.ndarray]] = []
        returned: set[int] = set()
        for item_id, chat, last_id, data, item_model, dimension in read(owner.last_seen, recheck):
            returned.add(item_id)
            owner.last_seen = max(owner.last_seen, item_id)
            vector = None
            if data is not None and dimension == owner.dimension and (model is None or item_model == model):
                vector = vector_from_bytes(data, dimension)
            if vector is None:
                owner.missing.add(item_id)
            else:
                owner.missing.discard(item_id)
                new.append((item_id, chat, last_id, vector))
        # A rechecked row the reader did not return was deleted.
        owner.missing.difference_update(set(recheck) - returned)
        owner.add(new)
