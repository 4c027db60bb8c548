"""Chat sessions, their messages in the OpenAI wire format (docs/memory.md §1; never modified by memory management,
I6), the record of every model call, and the knowledge base."""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from django.db import models
from django.db.models import Q


class ChatSession(models.Model):
    """One conversation. Owned by a user, or (anonymous visitors) by a Django session key."""

    class Mode(models.TextChoices):
        AGENT = "agent", "Agent"
        QUICK_ANSWER = "quick-answer", "Quick answer"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="chat_sessions"
    )
    owner_session_key = models.CharField(
        max_length=40, blank=True, default="", db_index=True, help_text="Django session key of an anonymous owner."
    )
    title = models.CharField(max_length=200, blank=True, default="")
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.AGENT)
    # An edited copy (docs/memory.md §8, "Edit into a new chat"): the chat it was forked from, and the user message
    # there whose edited text this chat's history continues with (the two diverge at that message).
    forked_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks")
    forked_at_message_id = models.BigIntegerField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        # Orderings are lists, as the migrations record them (a tuple would read as a change).
        ordering: ClassVar[list[str]] = ["-updated", "-id"]
        constraints = (
            models.CheckConstraint(
                condition=Q(owner__isnull=False) | ~Q(owner_session_key=""), name="chatsession_has_owner"
            ),
        )

    def __str__(self) -> str:
        return self.title or f"Chat {self.pk}"


class Message(models.Model):
    """One wire message of a session. ``reply_to`` (the turn's user message) keeps concurrent turns apart (docs/memory.md
    F-26); ``client_message_id`` makes a resend idempotent (F-27); ``origin`` ``app`` marks a note the app wrote in
    place of a reply, shown but never sent to the model nor summarized (F-37)."""

    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"
        TOOL = "tool"

    class Status(models.TextChoices):
        COMPLETE = "complete"
        STOPPED = "stopped"
        CUT_OFF = "cut_off"
        ERROR = "error"

    class Origin(models.TextChoices):
        MODEL = "model"
        APP = "app"

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=16, choices=Role.choices)
    # NULL, not "": an assistant message with tool_calls has content null on the wire.
    content = models.TextField(null=True, blank=True)  # noqa: DJ001
    tool_calls = models.JSONField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=255, blank=True, default="")
    name = models.CharField(max_length=64, blank=True, default="")
    token_count = models.PositiveIntegerField()
    # NULL, not "": rows without a browser id (replies, tool results) stay out of the unique constraint.
    client_message_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    reply_to = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="replies")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    origin = models.CharField(max_length=8, choices=Origin.choices, default=Origin.MODEL)
    # Of a reply: which version of its turn's reply it belongs to, n after n - 1 regenerations (ReplyVersion).
    version = models.PositiveSmallIntegerField(default=1)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["id"]
        constraints = (
            models.UniqueConstraint(
                fields=["session", "client_message_id"],
                condition=Q(client_message_id__isnull=False),
                name="message_client_id_unique_per_session",
            ),
        )
        indexes = (models.Index(fields=["session", "id"], name="message_session_id_idx"),)

    def __str__(self) -> str:
        return f"{self.role} #{self.pk}"

    @property
    def is_final_reply(self) -> bool:
        """True for the assistant message that ends a turn (one without ``tool_calls``)."""
        return self.role == self.Role.ASSISTANT and not self.tool_calls

    def as_dict(self) -> dict[str, Any]:
        """The JSON-safe form sent to browsers (docs/protocol.md, ``chat.message``)."""
        return {
            "id": self.pk,
            "role": self.role,
            "content": self.content,
            "tool_calls": self.tool_calls,
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "status": self.status,
            "origin": self.origin,
            "reply_to": self.reply_to_id,
            "client_message_id": self.client_message_id,
            "token_count": self.token_count,
            "created": self.created.isoformat() if self.created else None,
            "version": self.version,
        }

    def to_wire(self) -> dict[str, Any]:
        """The OpenAI wire dict of this row: only keys that are set."""
        wire: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            wire["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            wire["tool_call_id"] = self.tool_call_id
        if self.name:
            wire["name"] = self.name
        return wire


class ReplyVersion(models.Model):
    """An earlier version of a turn's reply, kept when the user regenerated it (docs/memory.md §8, "Regenerate"):
    ``messages`` are its rows as ``Message.as_dict()`` (tool calls, results and the final reply), which were deleted
    from the transcript, so memory and the model see only the current version."""

    turn = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="reply_versions")
    number = models.PositiveSmallIntegerField()
    messages = models.JSONField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["turn", "number"]
        constraints = (models.UniqueConstraint(fields=["turn", "number"], name="reply_version_unique_per_turn"),)

    def __str__(self) -> str:
        return f"version {self.number} of the reply to #{self.turn_id}"

    @property
    def final_reply(self) -> dict[str, Any] | None:
        """The version's final reply (its last assistant message without tool calls), or None."""
        finals = [m for m in self.messages if m.get("role") == "assistant" and not m.get("tool_calls")]
        return finals[-1] if finals else None


class TurnLease(models.Model):
    """Proof that the turn of ``user_message`` is alive (:mod:`chatapp.conversation.leases`), deleted with its final
    reply, so only turns in flight or interrupted have one; apart from ``Message`` so message rows stay unchanged."""

    user_message = models.OneToOneField(Message, primary_key=True, on_delete=models.CASCADE, related_name="turn_lease")
    heartbeat = models.DateTimeField()

    def __str__(self) -> str:
        return f"lease of turn #{self.user_message_id} (heartbeat {self.heartbeat.isoformat()})"


class ModelCall(models.Model):
    """One request sent to the chat model as the memory engine built it: ``context`` is ``MemoryContext.as_dict()``
    plus ``tools``; the provider's token counts are None when unreported; ``step`` counts from 1."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="model_calls")
    reply_to = models.ForeignKey(Message, null=True, blank=True, on_delete=models.CASCADE, related_name="model_calls")
    mode = models.CharField(max_length=16, choices=ChatSession.Mode.choices)
    step = models.PositiveSmallIntegerField(default=1)
    model = models.CharField(max_length=200)
    context = models.JSONField()
    estimated_tokens = models.PositiveIntegerField()
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    finish_reason = models.CharField(max_length=32, blank=True, default="")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["id"]

    def __str__(self) -> str:
        return f"model call #{self.pk} (session {self.session_id}, step {self.step})"


class Document(models.Model):
    """A knowledge-base document (plain text or Markdown). ``slug`` makes loading idempotent."""

    slug = models.SlugField(max_length=100, unique=True)
    title = models.CharField(max_length=200)
    body = models.TextField()
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["title"]

    def __str__(self) -> str:
        return self.title


class Chunk(models.Model):
    """A passage of a document, the unit of full-text search (see :mod:`chatapp.kb.search`)."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    ord = models.PositiveIntegerField()
    text = models.TextField()

    class Meta:
        ordering: ClassVar[list[str]] = ["document_id", "ord"]
        constraints = (models.UniqueConstraint(fields=["document", "ord"], name="chunk_unique_ord_per_document"),)

    def __str__(self) -> str:
        return f"{self.document_id}#{self.ord}"
