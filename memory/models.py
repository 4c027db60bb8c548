"""Persisted memory state: one :class:`SessionSummary` per conversation, a
:class:`CompressionEvent` per compression (docs/memory.md §1, §3, §4) and one
:class:`MemoryJobState` per conversation whose memory job has run (docs/memory.md §10).

Conversations are named by an opaque ``memory_key`` string, so this app never depends on the chat
app's models (the chat app uses its session's primary key).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from django.db import models

from memory.jobs import JobState
from memory.store import CompressionRecord, Summary


class SummaryType(models.TextChoices):
    NONE = "none", "none"
    LLM = "llm", "LLM summary"
    RAW = "raw", "raw archive"


class SessionSummary(models.Model):
    """The working memory of one conversation: ``content`` covers every message whose id is at
    most ``last_message_id`` (the boundary). ``version`` increases by one on every write and is
    the compare-and-set token: a write succeeds only if the version it read is still current.
    ``token_count``: the size of ``content`` in tokens."""

    memory_key = models.CharField(max_length=64, unique=True)
    content = models.TextField(blank=True, default="")
    summary_type = models.CharField(max_length=8, choices=SummaryType.choices, default=SummaryType.NONE)
    last_message_id = models.BigIntegerField(null=True, blank=True)
    compressed_count = models.PositiveIntegerField(default=0)
    token_count = models.PositiveIntegerField(default=0)
    version = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"summary of {self.memory_key} v{self.version} (boundary {self.last_message_id})"

    def as_summary(self) -> Summary:
        """This row as the engine's :class:`memory.store.Summary` value."""
        return Summary(
            content=self.content,
            summary_type=self.summary_type,  # type: ignore[arg-type]  # constrained by choices
            last_message_id=self.last_message_id,
            compressed_count=self.compressed_count,
            version=self.version,
        )


class CompressionEvent(models.Model):
    """One compression event of one request, successful or not: the columns are the fields of
    :class:`memory.store.CompressionRecord`, which documents them."""

    class Kind(models.TextChoices):
        COMPRESSION = "compression"
        SUPERSEDED = "superseded"
        NO_PROGRESS = "no_progress"
        OVERFLOW = "overflow"

    memory_key = models.CharField(max_length=64, db_index=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    mode = models.CharField(max_length=16)
    created_at = models.DateTimeField(auto_now_add=True)
    context_window = models.PositiveIntegerField()
    trigger_tokens = models.PositiveIntegerField()
    target_tokens = models.PositiveIntegerField()
    tokens_before = models.PositiveIntegerField()
    tokens_after = models.PositiveIntegerField()
    messages_summarized = models.PositiveIntegerField(default=0)
    boundary_before = models.BigIntegerField(null=True, blank=True)
    boundary_after = models.BigIntegerField(null=True, blank=True)
    result_type = models.CharField(max_length=8, choices=SummaryType.choices, default=SummaryType.NONE)
    degraded = models.BooleanField(default=False)
    attempts = models.JSONField(default=list)
    duration_ms = models.PositiveIntegerField(default=0)
    summary_content = models.TextField(blank=True, default="")
    summary_version = models.PositiveIntegerField(null=True, blank=True)
    notes = models.JSONField(default=list)
    elisions = models.JSONField(default=list)
    origin = models.CharField(max_length=8, default="request")

    class Meta:
        ordering = ("created_at", "id")
        indexes = (models.Index(fields=["memory_key", "id"], name="memory_comp_memory__idx"),)

    def __str__(self) -> str:
        return f"{self.kind} of {self.memory_key} #{self.pk}"

    def as_dict(self) -> dict[str, Any]:
        """The JSON form sent to clients: every :class:`~memory.store.CompressionRecord` field,
        plus ``id`` and ``created_at`` (ISO 8601)."""
        return {
            "id": self.pk,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            **{f.name: getattr(self, f.name) for f in fields(CompressionRecord)},
        }


class MemoryJobState(models.Model):
    """The memory job of one conversation (docs/memory.md §10, "memory job"): its lease, so
    that at most one worker runs it at a time, the watermark and last attempt of each step, and
    how the last job ended. The columns are the fields of :class:`memory.jobs.JobState`, which
    documents them."""

    memory_key = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=8, default="idle")
    lease_owner = models.CharField(max_length=128, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    watermarks = models.JSONField(default=dict)
    attempts = models.JSONField(default=dict)
    last_error = models.TextField(blank=True, default="")
    runs = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"memory job of {self.memory_key} ({self.status})"

    def as_state(self) -> JobState:
        """This row as the engine's :class:`memory.jobs.JobState` value."""
        return JobState(
            memory_key=self.memory_key,
            status=self.status,  # type: ignore[arg-type]  # written only from JobStatus values
            lease_owner=self.lease_owner,
            lease_expires_at=self.lease_expires_at,
            watermarks=dict(self.watermarks),
            attempts=dict(self.attempts),
            last_error=self.last_error,
            runs=self.runs,
        )
