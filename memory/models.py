"""Persisted memory state: one :class:`SessionSummary` per conversation, a
:class:`CompressionEvent` per compression (docs/memory.md §1, §3, §4), one
:class:`MemoryJobState` per conversation whose memory job has run (docs/memory.md §10) and its
:class:`KeyFact` rows (docs/memory.md §11), and one :class:`TokenCalibration` per chat model
(docs/memory.md §5).

Conversations are named by an opaque ``memory_key`` string, so this app never depends on the chat
app's models (the chat app uses its session's primary key).
"""

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

    def as_record(self) -> CompressionRecord:
        """This row as the engine's :class:`~memory.summary.store.CompressionRecord`."""
        values = {f.name: getattr(self, f.name) for f in fields(CompressionRecord)}
        return CompressionRecord(**{**values, "id": self.pk, "created_at": self.created_at.isoformat()})


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


class KeyFact(models.Model):
    """One key fact of one conversation (docs/memory.md §11): a value copied verbatim from a
    message, with its provenance. The columns are the fields of :class:`memory.facts.KeyFact`,
    which documents them, plus ``memory_key`` (the conversation), ``scope_key`` (its owner, an
    opaque string the owning app chooses, e.g. ``user:<id>``), ``created_at`` and ``updated_at``.

    Rows are never deleted while their conversation exists: a superseded fact keeps its row with
    ``invalidated_at`` and ``superseded_by`` set. At most one row per conversation, slot
    (``key``) and ``value`` is active (``invalidated_at`` NULL), enforced by a partial unique
    constraint that SQLite and PostgreSQL both support.
    """

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
        """This row as the engine's :class:`memory.facts.KeyFact` value; ``replaces``: the value
        of the fact it superseded (``""`` when none; the list selectors annotate it in the same
        query, see :mod:`memory.services`)."""
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
        )


class MemoryItem(models.Model):
    """One indexed piece of a stored message, for recall (docs/memory.md §12, "the index"): the
    columns of :class:`memory.recall.RecallItem` (the chat's title is the owning app's) plus
    ``scope_key`` (the owner, an opaque string the owning app chooses, as for :class:`KeyFact`),
    ``last_message_id`` (the newest of ``message_ids``: "every message id ≤ boundary" is
    ``last_message_id <= boundary``), ``piece`` (the piece's place in its message, from 0),
    ``search_text`` (what the full-text index reads when it differs from ``text``, see
    :func:`memory.fulltext.search_text`) and the embedding: ``embedding`` (float32 bytes,
    little-endian, ``embedding_dim`` values, L2-normalised; NULL until embedded),
    ``embedding_model`` (``""`` when none) and ``embedding_dim`` (0 when none).

    Full-text search: SQLite keeps an FTS5 table ``memory_memoryitem_fts`` in step by triggers;
    PostgreSQL has a GIN index on ``to_tsvector('english', …)`` (migration ``0005_memoryitem``).
    Items are never edited except to fill their embedding: a piece whose text changes is deleted
    and inserted again (a new id), so the per-owner vector cache only reads rows with a higher id.
    """

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
    """The token-estimate calibration of one chat model (docs/memory.md §5, "Calibration"): the
    columns of :class:`memory.calibration.Calibration` (``model`` the model's name, ``factor``
    provider tokens per estimated token, ``samples`` the calls that moved it) and when it last
    moved."""

    model = models.CharField(max_length=200, unique=True)
    factor = models.FloatField(default=1.0)
    samples = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"token calibration of {self.model}: x{self.factor:.3f} ({self.samples} samples)"

    def as_calibration(self) -> calibration.Calibration:
        """This row as the pure :class:`memory.calibration.Calibration` value."""
        return calibration.Calibration(model=self.model, factor=self.factor, samples=self.samples)
