"""The engine's summary storage port (docs/architecture.md "memory engine"): :class:`SummaryStore`, the frozen
values crossing it, and :class:`InMemorySummaryStore`. Pure: no ORM object ever reaches the engine."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from memory.summary.chain import summary_kind

SummaryType = Literal["none", "llm", "raw"]
EventKind = Literal["compression", "superseded", "no_progress", "overflow"]


@dataclass(frozen=True, kw_only=True)
class Summary:
    """A summary read or to be written: ``summary_type`` ``none``, ``llm`` or ``raw`` (docs/memory.md §4),
    ``last_message_id`` the boundary, ``version`` the compare-and-set token (0 when nothing is stored)."""

    content: str = ""
    summary_type: SummaryType = "none"
    last_message_id: int | None = None
    compressed_count: int = 0
    version: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The JSON form kept in model-call snapshots and sent to the inspector."""
        return {
            "type": self.summary_type,
            "content": self.content,
            "last_message_id": self.last_message_id,
            "compressed_count": self.compressed_count,
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        return cls(
            content=data.get("content") or "",
            summary_type=data.get("type") or "none",
            last_message_id=data.get("last_message_id"),
            compressed_count=data.get("compressed_count") or 0,
            version=data.get("version") or 0,
        )


@dataclass(frozen=True, kw_only=True)
class CompressionRecord:
    """One compression event, ``kind`` as in docs/memory.md §3's end. Tokens are estimates of the model-facing request;
    ``attempts`` are :class:`memory.summary.chain.Attempt` dicts; ``elisions`` one ``{id, role, tokens_before,
    tokens_after}`` per shortened message; ``origin`` ``request`` or ``job`` (pre-compression, §10)."""

    kind: EventKind
    mode: str
    context_window: int
    trigger_tokens: int
    target_tokens: int
    tokens_before: int
    tokens_after: int
    messages_summarized: int = 0
    boundary_before: int | None = None
    boundary_after: int | None = None
    result_type: SummaryType = "none"
    degraded: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)
    duration_ms: int = 0
    summary_content: str = ""
    summary_version: int | None = None
    notes: list[str] = field(default_factory=list)
    elisions: list[dict[str, Any]] = field(default_factory=list)
    origin: str = "request"
    id: int | None = None
    created_at: str | None = None

    def fields(self) -> dict[str, Any]:
        """The stored columns (:class:`memory.models.CompressionEvent`): all but ``id`` and ``created_at``."""
        fields = asdict(self)
        del fields["id"], fields["created_at"]
        return fields

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "created_at": self.created_at, **self.fields()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompressionRecord:
        """Unknown keys are ignored; older snapshots lack ``origin``."""
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})

    @property
    def summary_kind(self) -> str:
        """Who wrote the summary this event produced (:func:`memory.summary.chain.summary_kind`)."""
        return summary_kind(self.result_type, self.attempts)


class SummaryStore(Protocol):
    """The engine's storage port; ``memory_key`` names one conversation. ``compare_and_set`` writes only at
    ``expected_version`` with the boundary moving forward (docs/memory.md §3 step 6), or staying with
    ``same_boundary`` (F-40), and says whether it wrote. Storage errors propagate."""

    async def get(self, memory_key: str) -> Summary: ...

    async def compare_and_set(
        self, memory_key: str, *, expected_version: int, new: Summary, token_count: int, same_boundary: bool = False
    ) -> bool: ...

    async def record(self, memory_key: str, record: CompressionRecord) -> CompressionRecord: ...


class InMemorySummaryStore:
    """:class:`SummaryStore` in one process's dicts, with the database's compare-and-set rule."""

    def __init__(self) -> None:
        self.summaries: dict[str, Summary] = {}
        self.events: dict[str, list[CompressionRecord]] = {}
        self._ids = itertools.count(1)

    async def get(self, memory_key: str) -> Summary:
        return self.summaries.get(memory_key, Summary())

    async def compare_and_set(
        self, memory_key: str, *, expected_version: int, new: Summary, token_count: int, same_boundary: bool = False
    ) -> bool:
        stored = self.summaries.get(memory_key, Summary())
        if stored.version != expected_version:
            return False
        moves_forward = (
            stored.last_message_id is None
            or new.last_message_id is None
            or new.last_message_id > stored.last_message_id
            or (same_boundary and new.last_message_id == stored.last_message_id)
        )
        if not moves_forward:
            return False
        self.summaries[memory_key] = replace(new, version=expected_version + 1)
        return True

    async def record(self, memory_key: str, record: CompressionRecord) -> CompressionRecord:
        event = replace(record, id=next(self._ids), created_at=datetime.now(UTC).isoformat())
        self.events.setdefault(memory_key, []).append(event)
        return event
