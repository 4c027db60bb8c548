"""The whole inspector of one session: request, summary, timeline, health, memory job, key facts, recall."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.models import Message, ModelCall
from chatapp.ui.inspector.attempts import error_text
from chatapp.ui.inspector.facts import KeyFacts, key_facts_get, key_facts_of_call
from chatapp.ui.inspector.marks import MarkBasis, folded_boundary_of
from chatapp.ui.inspector.recall import RecallSection, recall_get, recall_of_call
from chatapp.ui.inspector.request import RequestSnapshot, request_snapshot_build
from chatapp.ui.inspector.summary import CurrentSummary, TimelineEvent, summary_versions_build

TIMELINE_MAX_EVENTS = 100  # compression events in the timeline and the summary's versions

HEALTH_LABELS = {
    "idle": "idle",
    "ok": "ok",
    "retrying": "retrying",
    "failover": "failover",
    "raw_archive": "raw archive",
}

JOB_STATUS_LABELS = {
    "idle": "idle",
    "queued": "queued",
    "batched": "batched: starts when the chat goes idle",
    "running": "running",
    "failed": "failed",
}


@dataclass(frozen=True, kw_only=True)
class Health:
    """The summarizer's health as of the last compression; ``event_id`` that event in the timeline, or None."""

    status: str
    last_error: str
    attempts: list[dict[str, Any]]
    at: datetime | None
    event_id: int | None = None

    @property
    def label(self) -> str:
        return HEALTH_LABELS.get(self.status, self.status)

    @property
    def error(self) -> str:
        return error_text(self.last_error)

    @property
    def failed_attempts(self) -> int:
        return sum(1 for attempt in self.attempts if not attempt.get("ok"))


@dataclass(frozen=True, kw_only=True)
class MemoryJob:
    """The session's memory job (docs/memory.md §10); ``watermarks`` and ``attempts`` (the last one)
    by step name; ``runs``: jobs that had work so far."""

    status: str
    last_error: str
    watermarks: dict[str, Any]
    attempts: dict[str, dict[str, Any]]
    runs: int

    @property
    def label(self) -> str:
        return JOB_STATUS_LABELS.get(self.status, self.status)


@dataclass(frozen=True, kw_only=True)
class InspectorState:
    """Everything the inspector shows for one session; ``can_compress``: "Compress now" has something to fold."""

    session_id: int
    request: RequestSnapshot | None
    summary: CurrentSummary
    timeline: list[TimelineEvent]
    health: Health
    job: MemoryJob
    key_facts: KeyFacts
    can_compress: bool
    recall: RecallSection | None = None

    @property
    def basis(self) -> MarkBasis:
        """The marks of the last request, as its "Last request" panel shows it, and what was folded since."""
        sent = self.request.summary_boundary if self.request else None
        return MarkBasis(
            boundary=sent,
            history_ids=self.request.history_ids if self.request else frozenset(),
            current_ids=self.request.current_ids if self.request else frozenset(),
            folded_boundary=folded_boundary_of(sent=sent, stored=self.summary.boundary),
        )


def inspector_state_get(*, session_id: int) -> InspectorState:
    """From the session's newest ``ModelCall`` (``request`` None before the first) and its newest
    ``TIMELINE_MAX_EVENTS`` compression events, newest first (no access check: callers authorize)."""
    memory_key = memory_key_of(session_id)
    engine = memory_engine()
    events = engine.events(memory_key, limit=TIMELINE_MAX_EVENTS)[::-1]
    stored = engine.summary(memory_key)
    versions = summary_versions_build(events)
    written = next((version for version in versions if version.version == stored.version), None)
    summary = CurrentSummary(
        summary_type=stored.summary_type,
        content=stored.content,
        boundary=stored.last_message_id,
        compressed_count=stored.compressed_count,
        version=stored.version,
        versions=versions,
        summary_kind=written.summary_kind if written is not None and written.result_type == stored.summary_type else "",
    )
    health = engine.health(memory_key)
    # The event the health is read from: the newest compression or superseded one.
    health_event = next((event for event in events if event.kind in ("compression", "superseded")), None)
    last_call = ModelCall.objects.filter(session_id=session_id).order_by("-id").first()
    job = engine.job_state(memory_key)
    job_status: str = engine.job_activity(memory_key) or job.status
    last_error = job.last_error
    if job_status == "running" and job.lease_expires_at is not None and job.lease_expires_at < timezone.now():
        job_status, last_error = "failed", "the worker running it stopped before it finished (its lease ran out)"
    # What "Compress now" folds (chatapp.conversation.compress): the messages before the newest
    # user message, past the summary's boundary.
    messages = Message.objects.filter(session_id=session_id)
    last_user_id = messages.filter(role=Message.Role.USER).order_by("-id").values_list("id", flat=True).first()
    can_compress = (
        last_user_id is not None and messages.filter(id__lt=last_user_id, id__gt=stored.last_message_id or 0).exists()
    )
    return InspectorState(
        session_id=session_id,
        can_compress=can_compress,
        request=request_snapshot_build(last_call) if last_call is not None else None,
        key_facts=key_facts_get(session_id=session_id, request=key_facts_of_call(last_call)),
        recall=recall_get(session_id=session_id, request=recall_of_call(last_call)),
        summary=summary,
        timeline=[TimelineEvent.from_record(event) for event in events],
        health=Health(
            status=health["status"],
            last_error=health["last_error"],
            attempts=list(health["attempts"]),
            at=datetime.fromisoformat(health["at"]) if health["at"] else None,
            event_id=health_event.id if health_event is not None else None,
        ),
        job=MemoryJob(
            status=job_status,
            last_error=last_error,
            watermarks=dict(job.watermarks),
            attempts=dict(job.attempts),
            runs=job.runs,
        ),
    )
