"""Reads of the memory inspector (docs/memory.md §8): what the last request to the chat model
contained and why, the session's summary and its versions, the compression timeline and the
summarizer's health.

Every token figure comes from the data that built the request -- the ``ModelCall.context``
snapshot (``MemoryContext.as_dict()`` plus the tool schemas) and the memory app's stored
summary and compression events -- never from a second estimate. Synchronous ORM code; async
callers use ``database_sync_to_async``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.utils import timezone

from chatapp.conversation.memory_jobs import memory_job_local_status
from chatapp.models import ChatSession, Message, ModelCall
from memory.api import (
    CompressionEvent,
    compression_event_list,
    memory_job_state_get,
    session_summary_get,
    summarizer_health_get,
)

# How many compression events the timeline (and the summary's version history) shows.
TIMELINE_MAX_EVENTS = 100

# (section key, label, source kind of its messages in ``context["sources"]``), in request order.
MESSAGE_SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("system", "System prompt", "system"),
    ("summary", "Summary", "summary"),
    ("retained", "Retained window", "history"),
    ("current", "Current turn", "current"),
)

SUMMARY_TYPE_LABELS = {"none": "none yet", "llm": "LLM summary", "raw": "raw archive"}
HEALTH_LABELS = {
    "idle": "idle",
    "ok": "ok",
    "retrying": "retrying",
    "failover": "failover",
    "raw_archive": "raw archive",
}
# How memory met a request (MemoryContext.path, docs/memory.md §10), as the request panel says it.
PATH_LABELS = {
    "under_trigger": "Under the trigger: no memory work before the first token.",
    "no_progress": (
        "Over the trigger, but nothing before the current turn may be summarized: only the current turn "
        "was elided or folded."
    ),
    "compressed": "Compressed inside this request, before the first token (MEMORY_COMPRESSION=sync).",
    "waited": "Waited {waited_ms} ms for the memory job's compression, then under the trigger.",
    "deferred": (
        "Over the trigger: sent the stored summary plus a raw archive of the overflow (nothing written) "
        "and left the compression to the memory job (waited {waited_ms} ms)."
    ),
    "degraded": "Degraded context: the stored summary plus a raw archive of the overflow, nothing written.",
}
JOB_STATUS_LABELS = {"idle": "idle", "queued": "queued", "running": "running", "failed": "failed"}
MARK_SUMMARIZED = "summarized"
MARK_RETAINED = "retained"
MARK_CURRENT = "current"
# A note the app wrote in place of a reply: shown, never sent to the model (docs/memory.md F-37).
MARK_NOT_SENT = "not-sent"
MARK_LABELS = {
    MARK_SUMMARIZED: "in summary",
    MARK_RETAINED: "retained window",
    MARK_CURRENT: "current turn",
    MARK_NOT_SENT: "not sent to the model",
}


@dataclass(frozen=True, kw_only=True)
class Gauge:
    """The request size against the context window; all figures in tokens."""

    used: int
    context_window: int
    trigger_tokens: int
    target_tokens: int

    @property
    def used_percent(self) -> float:
        """``used`` as a share of the window, capped at 100 (for the bar's width)."""
        return min(100.0, _percent(self.used, self.context_window))

    @property
    def trigger_percent(self) -> float:
        return _percent(self.trigger_tokens, self.context_window)

    @property
    def target_percent(self) -> float:
        return _percent(self.target_tokens, self.context_window)

    @property
    def level(self) -> str:
        """``low`` (at most the target), ``mid`` (up to the trigger), ``high`` (over the trigger,
        within the window) or ``over`` (over the window): the gauge's colour."""
        if self.used > self.context_window:
            return "over"
        if self.used > self.trigger_tokens:
            return "high"
        if self.used > self.target_tokens:
            return "mid"
        return "low"


@dataclass(frozen=True, kw_only=True)
class Section:
    """One part of a request: ``tokens`` as the engine counted them, ``percent`` of the context
    window, ``text`` the exact text sent (``""`` for the free space and the reply priming)."""

    key: str
    label: str
    tokens: int
    percent: float
    text: str = ""
    message_count: int = 0


@dataclass(frozen=True, kw_only=True)
class MarkBasis:
    """What decides a transcript message's mark: the summary's ``boundary`` (covered: id at most
    the boundary) and the ids the last request sent as retained window and as current turn."""

    boundary: int | None = None
    history_ids: frozenset[int] = frozenset()
    current_ids: frozenset[int] = frozenset()

    def mark(self, message_id: int) -> str:
        """``summarized``, ``retained``, ``current`` or ``""`` (not in the last request, e.g. a
        reply stored after it)."""
        if self.boundary is not None and message_id <= self.boundary:
            return MARK_SUMMARIZED
        if message_id in self.history_ids:
            return MARK_RETAINED
        if message_id in self.current_ids:
            return MARK_CURRENT
        return ""

    def mark_of(self, message_id: int, origin: str) -> str:
        """:meth:`mark`, except :data:`MARK_NOT_SENT` for a row of ``origin`` ``app``, which no
        request ever holds nor any summary covers (docs/memory.md F-37)."""
        return MARK_NOT_SENT if origin == Message.Origin.APP else self.mark(message_id)


@dataclass(frozen=True, kw_only=True)
class RequestSnapshot:
    """The last request sent to the chat model, from its ``ModelCall`` record.

    ``gauge.used`` is the engine's estimate (``ModelCall.estimated_tokens``); ``prompt_tokens``
    what the provider reported (None until the reply ended, or when it reports nothing).
    ``summary`` is the summary state the request was built with.
    """

    model_call_id: int
    turn_id: int | None
    step: int
    mode: str
    model: str
    created: datetime
    gauge: Gauge
    sections: list[Section]
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str
    summary: dict[str, Any]
    elisions: list[dict[str, Any]]
    repairs: list[str]
    history_ids: frozenset[int]
    current_ids: frozenset[int]
    memory_path: str = ""
    waited_ms: int = 0

    @property
    def path_label(self) -> str:
        """How memory met this request, in words ("" for calls recorded before it was kept)."""
        label = PATH_LABELS.get(self.memory_path, "")
        return label.format(waited_ms=self.waited_ms)

    @property
    def prompt_tokens_difference(self) -> int | None:
        """Provider-reported minus estimated prompt tokens (None when not reported)."""
        return None if self.prompt_tokens is None else self.prompt_tokens - self.gauge.used


@dataclass(frozen=True, kw_only=True)
class SummaryVersion:
    """One write of the summary: a compression event of kind ``compression``. ``tokens_before``
    and ``tokens_after`` are the request's size around it; ``previous_chars`` is the length of the
    summary it replaced, in characters (0 for the first; None when that version is older than the
    events read)."""

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

    @property
    def result_label(self) -> str:
        return SUMMARY_TYPE_LABELS.get(self.result_type, self.result_type)


@dataclass(frozen=True, kw_only=True)
class CurrentSummary:
    """The session's stored summary now (``summary_type`` none/llm/raw; ``boundary`` the id of
    the last message it covers) and its versions, newest first."""

    summary_type: str
    content: str
    boundary: int | None
    compressed_count: int
    version: int
    versions: list[SummaryVersion] = field(default_factory=list)

    @property
    def type_label(self) -> str:
        return SUMMARY_TYPE_LABELS.get(self.summary_type, self.summary_type)


@dataclass(frozen=True, kw_only=True)
class TimelineEvent:
    """One compression event as the timeline shows it; ``attempts`` are the summarizer tries
    ``{"model", "phase", "number", "latency_ms", "ok", "error"}``, ``notes`` plain sentences."""

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

    @property
    def result_label(self) -> str:
        return SUMMARY_TYPE_LABELS.get(self.result_type, self.result_type)

    @property
    def kind_label(self) -> str:
        return self.kind.replace("_", " ")


@dataclass(frozen=True, kw_only=True)
class Health:
    """The summarizer's health as of the last compression (``memory.services.summarizer_health_get``)."""

    status: str
    last_error: str
    attempts: list[dict[str, Any]]
    at: datetime | None

    @property
    def label(self) -> str:
        return HEALTH_LABELS.get(self.status, self.status)

    @property
    def failed_attempts(self) -> int:
        return sum(1 for attempt in self.attempts if not attempt.get("ok"))


@dataclass(frozen=True, kw_only=True)
class MemoryJob:
    """The session's memory job (docs/memory.md §10): ``status`` idle / queued (pending in this
    process) / running (here, or holding its lease on another worker) / failed (the last job had a
    failed step); ``last_error`` of the last job; ``watermarks`` step name → message id;
    ``attempts`` step name → its last attempt ``{step, at, ok, error, duration_ms,
    watermark_before, watermark_after}``; ``runs``: jobs that had work, so far."""

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
    """Everything the inspector panel shows for one session."""

    session_id: int
    request: RequestSnapshot | None
    summary: CurrentSummary
    timeline: list[TimelineEvent]
    health: Health
    job: MemoryJob

    @property
    def basis(self) -> MarkBasis:
        """The basis of the transcript's marks: the stored boundary and the last request's ids."""
        return MarkBasis(
            boundary=self.summary.boundary,
            history_ids=self.request.history_ids if self.request else frozenset(),
            current_ids=self.request.current_ids if self.request else frozenset(),
        )


def inspector_state_get(*, session_id: int) -> InspectorState:
    """The inspector's state for chat session ``session_id`` (no access check: callers authorize).

    ``request`` is the session's newest ``ModelCall`` (None before the first); the timeline and
    the summary versions cover the newest ``TIMELINE_MAX_EVENTS`` compression events, newest first.
    """
    memory_key = ChatSession.memory_key_for(session_id)
    events = compression_event_list(memory_key=memory_key, limit=TIMELINE_MAX_EVENTS)[::-1]
    stored = session_summary_get(memory_key=memory_key)
    summary = CurrentSummary(
        summary_type=stored.summary_type,
        content=stored.content,
        boundary=stored.last_message_id,
        compressed_count=stored.compressed_count,
        version=stored.version,
        versions=summary_versions_build(events),
    )
    health = summarizer_health_get(memory_key=memory_key)
    last_call = ModelCall.objects.filter(session_id=session_id).order_by("-id").first()
    job = memory_job_state_get(memory_key=memory_key)
    job_status: str = memory_job_local_status(session_id=session_id) or job.status
    last_error = job.last_error
    if job_status == "running" and job.lease_expires_at is not None and job.lease_expires_at < timezone.now():
        job_status, last_error = "failed", "the worker running it stopped before it finished (its lease ran out)"
    return InspectorState(
        session_id=session_id,
        request=request_snapshot_build(last_call) if last_call is not None else None,
        summary=summary,
        timeline=[_timeline_event(event) for event in events],
        health=Health(
            status=health["status"],
            last_error=health["last_error"],
            attempts=list(health["attempts"]),
            at=datetime.fromisoformat(health["at"]) if health["at"] else None,
        ),
        job=MemoryJob(
            status=job_status,
            last_error=last_error,
            watermarks=dict(job.watermarks),
            attempts=dict(job.attempts),
            runs=job.runs,
        ),
    )


def message_marks_get(*, session_id: int, basis: MarkBasis) -> dict[int, str]:
    """``{message id: mark}`` for every message of the session (see :meth:`MarkBasis.mark_of`)."""
    rows = Message.objects.filter(session_id=session_id).order_by("id").values_list("id", "origin")
    return {message_id: basis.mark_of(message_id, origin) for message_id, origin in rows}


def request_snapshot_build(call: ModelCall) -> RequestSnapshot:
    """The inspector's view of one recorded model call (pure: reads only ``call``'s fields).

    Sections are the engine's own per-section counts; ``Reply priming`` is the rest of the
    estimate (the tokens every request adds for the reply to start) and ``Free`` what is left of
    the context window, so the rows add up to the window exactly.
    """
    context = call.context
    window = int(context["context_window"])
    used = int(context["tokens"])
    counts: dict[str, int] = context.get("sections") or {}
    messages: list[dict[str, Any]] = context.get("messages") or []
    sources: list[dict[str, Any]] = context.get("sources") or []
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for message, source in zip(messages, sources, strict=True):
        by_kind.setdefault(source.get("kind", ""), []).append(message)
    sections = [
        Section(
            key=key,
            label=label,
            tokens=int(counts.get(key, 0)),
            percent=_percent(int(counts.get(key, 0)), window),
            text=messages_text(by_kind.get(kind, [])),
            message_count=len(by_kind.get(kind, [])),
        )
        for key, label, kind in MESSAGE_SECTIONS
    ]
    tools = context.get("tools") or []
    tool_tokens = int(counts.get("tools", 0))
    sections.append(
        Section(
            key="tools",
            label="Tool schemas",
            tokens=tool_tokens,
            percent=_percent(tool_tokens, window),
            text=json.dumps(tools, ensure_ascii=False, indent=2) if tools else "",
            message_count=len(tools),
        )
    )
    overhead = used - sum(section.tokens for section in sections)
    sections.append(Section(key="overhead", label="Reply priming", tokens=overhead, percent=_percent(overhead, window)))
    free = max(0, window - used)
    sections.append(Section(key="free", label="Free", tokens=free, percent=_percent(free, window)))
    return RequestSnapshot(
        model_call_id=call.pk,
        turn_id=call.reply_to_id,
        step=call.step,
        mode=call.mode,
        model=call.model,
        created=call.created,
        gauge=Gauge(
            used=used,
            context_window=window,
            trigger_tokens=int(context["trigger_tokens"]),
            target_tokens=int(context["target_tokens"]),
        ),
        sections=sections,
        prompt_tokens=call.prompt_tokens,
        completion_tokens=call.completion_tokens,
        finish_reason=call.finish_reason,
        summary=context.get("summary") or {},
        elisions=list(context.get("elisions") or []),
        memory_path=str(context.get("path") or ""),
        waited_ms=int(context.get("waited_ms") or 0),
        repairs=[str(repair) for repair in context.get("repairs") or []],
        history_ids=_source_ids(sources, "history"),
        current_ids=_source_ids(sources, "current"),
    )


def messages_text(messages: Iterable[dict[str, Any]]) -> str:
    """Wire messages as readable text: per message a ``[role ...]`` line, then the content exactly
    as sent, then its ``tool_calls`` as JSON. Messages are separated by a blank line."""
    parts: list[str] = []
    for message in messages:
        header = str(message.get("role", "?"))
        if message.get("name"):
            header += f" name={message['name']}"
        if message.get("tool_call_id"):
            header += f" tool_call_id={message['tool_call_id']}"
        content = message.get("content")
        # A string, None (an assistant tool-call message) or a list of content parts.
        body = (
            (content or "") if isinstance(content, str) or content is None else json.dumps(content, ensure_ascii=False)
        )
        if message.get("tool_calls"):
            calls = json.dumps(message["tool_calls"], ensure_ascii=False, indent=2)
            body += ("\n" if body else "") + "tool_calls: " + calls
        parts.append(f"[{header}]\n{body}")
    return "\n\n".join(parts)


def _source_ids(sources: list[dict[str, Any]], kind: str) -> frozenset[int]:
    # A merged message (strict alternation, docs/memory.md F-38) stands for its "merged" parts too.
    parts = (part for source in sources for part in (source, *source.get("merged", ())))
    return frozenset(int(part["id"]) for part in parts if part.get("kind") == kind and part.get("id") is not None)


def summary_versions_build(events: list[CompressionEvent]) -> list[SummaryVersion]:
    """The summary's versions from compression events (newest first, as given), each with the
    size of the summary it replaced: the next older version's, 0 for version 1."""
    writes = [event for event in events if event.kind == CompressionEvent.Kind.COMPRESSION]
    versions: list[SummaryVersion] = []
    for index, event in enumerate(writes):
        older = writes[index + 1] if index + 1 < len(writes) else None
        if older is not None:
            previous: int | None = len(older.summary_content)
        else:
            previous = 0 if event.summary_version == 1 else None
        versions.append(replace(_summary_version(event), previous_chars=previous))
    return versions


def _summary_version(event: CompressionEvent) -> SummaryVersion:
    return SummaryVersion(
        version=event.summary_version,
        created_at=event.created_at,
        result_type=event.result_type,
        degraded=event.degraded,
        messages_summarized=event.messages_summarized,
        boundary_before=event.boundary_before,
        boundary_after=event.boundary_after,
        tokens_before=event.tokens_before,
        tokens_after=event.tokens_after,
        content=event.summary_content,
    )


def _timeline_event(event: CompressionEvent) -> TimelineEvent:
    return TimelineEvent(
        id=event.pk,
        kind=event.kind,
        created_at=event.created_at,
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
    )


def _note_text(note: Any) -> str:
    if isinstance(note, str):
        return note
    if isinstance(note, dict) and "elisions" in note:
        return f"elided {len(note['elisions'])} message(s) of the current turn"
    return json.dumps(note, ensure_ascii=False)


def _percent(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole > 0 else 0.0
