"""Persisted memory state (docs/memory.md §3, §5, §10-§12). Conversations are named by an opaque ``memory_key``,
so this app never depends on the chat app's models."""

from __future__ import annotations

from dataclasses import fields

from django.db import models
from django.db.models import Q

from memory.facts import values as fact_values
from memory.jobs.state import JobState
from memory.summary.store import CompressionRecord, Summary
from memory.tokens import calibration


class SummaryType(models.TextChoices):
    NONE = "none", "none"
    LLM = "llm", "LLM summary"
    RAW = "raw", "raw archive"


class SessionSummary(models.Model):
    """A conversation's summary of every message up to ``last_message_id``; ``version``, bumped on every write, is
    the compare-and-set token (docs/memory.md §3 step 6); ``token_count`` in tokens."""

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
        return Summary(
            content=self.content,
            summary_type=self.summary_type,  # type: ignore[arg-type]  # constrained by choices
            last_message_id=self.last_message_id,
            compressed_count=self.compressed_count,
            version=self.version,
        )


class CompressionEvent(models.Model):
    """One compression event; the columns are :class:`memory.summary.store.CompressionRecord`'s."""

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

    def as_record(self) -> CompressionRecord:
        values = {f.name: getattr(self, f.name) for f in fields(CompressionRecord)}
        return CompressionRecord(**{**values, "id": self.pk, "created_at": self.created_at.isoformat()})


class MemoryJobState(models.Model):
    """A conversation's memory job (docs/memory.md §10): its lease, step watermarks and last outcome, the columns
    of :class:`memory.jobs.state.JobState`."""

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


class KeyFact(models.Model):
    """One key fact (docs/memory.md §11): the columns of :class:`memory.facts.values.KeyFact` plus the chat and its
    owner (``scope_key``, chosen by the app). Never deleted; one active row per chat, slot and value."""

    memory_key = models.CharField(max_length=64)
    scope_key = models.CharField(max_length=128, db_index=True)
    kind = models.CharField(max_length=16, choices=[(kind, kind) for kind in fact_values.FACT_KINDS])
    key = models.CharField(max_length=fact_values.MAX_KEY_CHARS)
    value = models.CharField(max_length=fact_values.MAX_VALUE_CHARS)
    text = models.CharField(max_length=fact_values.MAX_TEXT_CHARS, blank=True, default="")
    source_message_id = models.BigIntegerField(null=True, blank=True)
    excerpt = models.TextField(blank=True, default="")
    extractor = models.CharField(max_length=64, default="rule")
    valid_from = models.DateTimeField(null=True, blank=True)
    invalidated_at = models.DateTimeField(null=True, blank=True)
    superseded_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="supersedes"
    )
    pinned_by_user = models.BooleanField(default=False)
    hidden_by_user = models.BooleanField(default=False)
    last_seen_message_id = models.BigIntegerField(null=True, blank=True)
    operation = models.CharField(max_length=16, default="add")
    polarity = models.CharField(max_length=8, default="positive")
    provenance = models.CharField(max_length=16, default="user")
    changed_by_message_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("id",)
        constraints = (
            models.UniqueConstraint(
                fields=["memory_key", "key", "value"],
                condition=Q(invalidated_at__isnull=True),
                name="memory_keyfact_one_active_per_value",
            ),
        )
        # Also the index of every lookup by conversation (its leading column).
        indexes = (models.Index(fields=["memory_key", "invalidated_at"], name="memory_keyfact_active_idx"),)

    def __str__(self) -> str:
        return f"{self.key}={self.value} of {self.memory_key} #{self.pk}"

    def as_fact(self, *, replaces: str = "") -> fact_values.KeyFact:
        """``replaces``: the superseded value, else the list selectors' ``replaces_value`` annotation."""
        return fact_values.KeyFact(
            id=self.pk,
            kind=self.kind,
            key=self.key,
            value=self.value,
            text=self.text,
            source_message_id=self.source_message_id,
            excerpt=self.excerpt,
            extractor=self.extractor,
            valid_from=self.valid_from,
            invalidated_at=self.invalidated_at,
            superseded_by=self.superseded_by_id,
            pinned_by_user=self.pinned_by_user,
            hidden_by_user=self.hidden_by_user,
            last_seen_message_id=self.last_seen_message_id,
            replaces=replaces or getattr(self, "replaces_value", None) or "",
            operation=self.operation,
            polarity=self.polarity,
            provenance=self.provenance,
            changed_by_message_id=self.changed_by_message_id,
        )


class MemoryItem(models.Model):
    """One indexed piece of a stored message (columns and full-text indexes: docs/memory.md §12 "The index"). Only
    the embedding is ever filled in: changed text gets a new id, so the vector cache reads only higher ids."""

    scope_key = models.CharField(max_length=128)
    memory_key = models.CharField(max_length=64)
    message_ids = models.JSONField(default=list)
    last_message_id = models.BigIntegerField()
    piece = models.PositiveSmallIntegerField(default=0)
    role = models.CharField(max_length=16)
    text = models.TextField()
    search_text = models.TextField(blank=True, default="")
    token_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    embedding = models.BinaryField(null=True, blank=True)
    embedding_model = models.CharField(max_length=128, blank=True, default="")
    embedding_dim = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ("id",)
        constraints = (
            models.UniqueConstraint(
                fields=["memory_key", "last_message_id", "piece"], name="memory_memoryitem_one_per_piece"
            ),
        )
        indexes = (
            # The owner's items in id order: the vector cache's reads and the owner scope.
            models.Index(fields=["scope_key", "id"], name="memory_item_scope_idx"),
        )

    def __str__(self) -> str:
        return f"item {self.pk} of {self.memory_key} (message {self.last_message_id}.{self.piece})"


class TokenCalibration(models.Model):
    """A chat model's token-estimate calibration (docs/memory.md §5 "Calibration")."""

    model = models.CharField(max_length=200, unique=True)
    factor = models.FloatField(default=1.0)
    samples = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"token calibration of {self.model}: x{self.factor:.3f} ({self.samples} samples)"

    def as_calibration(self) -> calibration.Calibration:
        return calibration.Calibration(model=self.model, factor=self.factor, samples=self.samples)
