"""Persisted memory state: one :class:`SessionSummary` per chat session and a
:class:`CompressionEvent` per compression (SPEC.md sections 1, 3, 4).

Sessions are referenced by an opaque ``session_key`` string so that this app never depends on the
chat app's models.
"""

from __future__ import annotations

from django.db import models


class SummaryType(models.TextChoices):
    NONE = "none", "none"
    LLM = "llm", "LLM summary"
    RAW = "raw", "raw archive"


class SessionSummary(models.Model):
    """The working memory of one session: ``content`` covers every message whose id is at most
    ``last_message_id`` (the boundary). ``version`` increases by one on every write and is the
    compare-and-set token: a write succeeds only if the version it read is still current."""

    session_key = models.CharField(max_length=64, unique=True)
    content = models.TextField(blank=True, default="")
    summary_type = models.CharField(max_length=8, choices=SummaryType.choices, default=SummaryType.NONE)
    last_message_id = models.BigIntegerField(null=True, blank=True)
    compressed_count = models.PositiveIntegerField(default=0)
    token_count = models.PositiveIntegerField(default=0)
    version = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"summary of {self.session_key} v{self.version} (boundary {self.last_message_id})"


class CompressionEvent(models.Model):
    """One compression attempt of one request, successful or not.

    ``kind``: ``compression`` (a summary was written), ``superseded`` (a concurrent request moved
    the boundary first; nothing written), ``no_progress`` (over the trigger but nothing could be
    summarized) or ``overflow`` (content of the current turn was elided). Tokens are estimates of
    the model-facing request before and after; ``attempts`` lists every summarizer try
    ``{"model", "phase", "number", "latency_ms", "ok", "error"}``; ``duration_ms`` in milliseconds.
    """

    class Kind(models.TextChoices):
        COMPRESSION = "compression"
        SUPERSEDED = "superseded"
        NO_PROGRESS = "no_progress"
        OVERFLOW = "overflow"

    session_key = models.CharField(max_length=64, db_index=True)
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

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["session_key", "id"])]

    def as_dict(self) -> dict:
        return {
            "id": self.pk,
            "kind": self.kind,
            "mode": self.mode,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "context_window": self.context_window,
            "trigger_tokens": self.trigger_tokens,
            "target_tokens": self.target_tokens,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "messages_summarized": self.messages_summarized,
            "boundary_before": self.boundary_before,
            "boundary_after": self.boundary_after,
            "result_type": self.result_type,
            "degraded": self.degraded,
            "attempts": self.attempts,
            "duration_ms": self.duration_ms,
            "summary_content": self.summary_content,
            "summary_version": self.summary_version,
            "notes": self.notes,
        }
