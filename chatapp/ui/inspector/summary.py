"""The stored summary, its versions and the compression timeline."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.utils import timezone

from chatapp.ui.inspector.attempts import AttemptLog, attempt_log_build
from chatapp.ui.inspector.stored import datetime_or_none
from memory.api import CompressionRecord

# The stored type (none / llm / raw), but ``extractive`` for an ``llm`` one no language model wrote.
SUMMARY_KIND_EXTRACTIVE = "extractive"
SUMMARY_TYPE_LABELS = {
    "none": "none yet",
    "llm": "LLM summary",
    SUMMARY_KIND_EXTRACTIVE: "extractive summary",
    "raw": "raw archive",
}


@dataclass(frozen=True, kw_only=True)
class SummaryVersion:
    """One write of the summary (a ``compression`` event); ``previous_chars``: the replaced summary's length
    in characters (0 for the first, None when older than the events read)."""

    version: int | None
    created_at: datetime
    result_type: str
    degraded: bool
    messages_summarized: int
    boundary_before: int | None
    boundary_after: int | None
    tokens_before: int
    tokens_after: int
    content: str
    previous_chars: int | None = None
    summary_kind: str = ""

    @property
    def result_label(self) -> str:
        kind = self.summary_kind or self.result_type
        return SUMMARY_TYPE_LABELS.get(kind, kind)

    @classmethod
    def from_record(cls, event: CompressionRecord) -> SummaryVersion:
        return cls(
            version=event.summary_version,
            created_at=datetime_or_none(event.created_at) or timezone.now(),
            result_type=event.result_type,
            degraded=event.degraded,
            messages_summarized=event.messages_summarized,
            boundary_before=event.boundary_before,
            boundary_after=event.boundary_after,
            tokens_before=event.tokens_before,
            tokens_after=event.tokens_after,
            content=event.summary_content,
            summary_kind=event.summary_kind,
        )


@dataclass(frozen=True, kw_only=True)
class CurrentSummary:
    """The stored summary (``boundary``: the last message id it covers) and its versions, newest first;
    ``summary_kind`` ``""`` when its version is not among the events read."""

    summary_type: str
    content: str
    boundary: int | None
    compressed_count: int
    version: int
    versions: list[SummaryVersion] = field(default_factory=list)
    summary_kind: str = ""

    @property
    def kind(self) -> str:
        """``none``, ``llm``, ``extractive`` or ``raw``: the stored type, told apart by who wrote it."""
        return self.summary_kind or self.summary_type

    @property
    def type_label(self) -> str:
        return SUMMARY_TYPE_LABELS.get(self.kind, self.kind)


@dataclass(frozen=True, kw_only=True)
class TimelineEvent:
    """One compression event as the timeline shows it; ``notes`` as plain sentences."""

    id: int
    kind: str
    created_at: datetime
    tokens_before: int
    tokens_after: int
    trigger_tokens: int
    target_tokens: int
    messages_summarized: int
    duration_ms: int
    result_type: str
    degraded: bool
    boundary_before: int | None
    boundary_after: int | None
    summary_version: int | None
    attempts: list[dict[str, Any]]
    notes: list[str]
    origin: str = "request"
    summary_kind: str = ""

    @property
    def result_label(self) -> str:
        return SUMMARY_TYPE_LABELS.get(self.summary_kind, self.summary_kind)

    @property
    def attempt_log(self) -> AttemptLog:
        return attempt_log_build(self.attempts, duration_ms=self.duration_ms)

    @property
    def kind_label(self) -> str:
        return self.kind.replace("_", " ")

    @classmethod
    def from_record(cls, event: CompressionRecord) -> TimelineEvent:
        return cls(
            id=event.id or 0,
            kind=event.kind,
            created_at=datetime_or_none(event.created_at) or timezone.now(),
            tokens_before=event.tokens_before,
            tokens_after=event.tokens_after,
            trigger_tokens=event.trigger_tokens,
            target_tokens=event.target_tokens,
            messages_summarized=event.messages_summarized,
            duration_ms=event.duration_ms,
            result_type=event.result_type,
            degraded=event.degraded,
            boundary_before=event.boundary_before,
            boundary_after=event.boundary_after,
            summary_version=event.summary_version,
            attempts=list(event.attempts or []),
            notes=[_note_text(note) for note in event.notes or []],
            origin=event.origin,
            summary_kind=event.summary_kind,
        )


def summary_versions_build(events: list[CompressionRecord]) -> list[SummaryVersion]:
    """The summary's versions from compression events (newest first, as given), each with the
    size of the summary it replaced: the next older version's, 0 for version 1."""
    writes = [event for event in events if event.kind == "compression"]
    versions: list[SummaryVersion] = []
    for index, event in enumerate(writes):
        older = writes[index + 1] if index + 1 < len(writes) else None
        if older is not None:
            previous: int | None = len(older.summary_content)
        else:
            previous = 0 if event.summary_version == 1 else None
        versions.append(replace(SummaryVersion.from_record(event), previous_chars=previous))
    return versions


def _note_text(note: Any) -> str:
    if isinstance(note, str):
        return note
    if isinstance(note, dict) and "elisions" in note:
        return f"elided {len(note['elisions'])} message(s) of the current turn"
    return json.dumps(note, ensure_ascii=False)
