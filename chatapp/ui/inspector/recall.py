"""The inspector's Recall section (docs/memory.md §12)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.urls import reverse

from chatapp.chats.memory import memory_engine, memory_key_of, session_of
from chatapp.llm.embeddings import embedder_choice
from chatapp.models import ModelCall
from chatapp.ui.inspector.stored import datetime_or_none, int_or_none


@dataclass(frozen=True, kw_only=True)
class RecallEntry:
    """An entry of a recall report's ``items``, ``rejected`` or ``over_budget`` (docs/memory.md §12):
    ``session_id`` its chat (None: no chat), ranks None when that side missed it, ``score = rrf * decay``,
    ``context_of`` the recalled item it came with (then not gated, no score)."""

    item_id: int
    session_id: int | None
    same_chat: bool
    chat_title: str
    message_ids: tuple[int, ...]
    role: str
    created_at: datetime | None
    text: str
    lexical_rank: int | None
    cosine: float | None
    dense_rank: int | None
    rrf: float
    decay: float
    score: float
    reason: str
    context_of: int | None = None

    @property
    def message_id(self) -> int | None:
        """The newest of its messages (a tool result's own, not its call's)."""
        return self.message_ids[-1] if self.message_ids else None

    @property
    def href(self) -> str:
        """``#message-N`` in this chat, that chat's page with the anchor for another, ``""`` when unknown."""
        if self.message_id is None:
            return ""
        anchor = f"#message-{self.message_id}"
        if self.same_chat:
            return anchor
        if self.session_id is None:
            return ""
        return reverse("session-detail", kwargs={"session_id": self.session_id}) + anchor

    @classmethod
    def from_stored(cls, entry: dict[str, Any], *, session_id: int) -> RecallEntry:
        memory_key = str(entry.get("memory_key") or "")
        chat_id = session_of(memory_key) if memory_key.isdigit() else None
        cosine = entry.get("cosine")
        return cls(
            item_id=int(entry["item_id"]),
            session_id=chat_id,
            same_chat=chat_id == session_id,
            chat_title=str(entry.get("chat_title") or ""),
            message_ids=tuple(int(i) for i in entry.get("message_ids") or ()),
            role=str(entry.get("role") or ""),
            created_at=datetime_or_none(entry.get("created_at")),
            text=str(entry.get("text") or ""),
            lexical_rank=int_or_none(entry.get("lexical_rank")),
            cosine=None if cosine is None else float(cosine),
            dense_rank=int_or_none(entry.get("dense_rank")),
            rrf=float(entry.get("rrf") or 0.0),
            decay=float(entry.get("decay") or 0.0),
            score=float(entry.get("score") or 0.0),
            reason=str(entry.get("reason") or ""),
            context_of=int_or_none(entry.get("context_of")),
        )


@dataclass(frozen=True, kw_only=True)
class RecallSection:
    """What recall brought into the last request and why: its ``recall_report`` (None: no recall), the
    embedder the settings select now and the session's index status (None when not read)."""

    session_id: int
    request: dict[str, Any] | None
    embedder: dict[str, str]
    index: dict[str, Any] | None = None
    items: list[RecallEntry] = field(default_factory=list)
    rejected: list[RecallEntry] = field(default_factory=list)
    over_budget: list[RecallEntry] = field(default_factory=list)

    @property
    def query(self) -> str:
        return "" if self.request is None else str(self.request.get("query") or "")

    @property
    def model(self) -> str | None:
        return None if self.request is None else self.request.get("model") or None

    @property
    def lexical_only(self) -> bool:
        return self.request is not None and self.model is None

    @property
    def latency_ms(self) -> int:
        return 0 if self.request is None else int(self.request.get("latency_ms") or 0)

    @property
    def tokens(self) -> int:
        return 0 if self.request is None else int(self.request.get("tokens") or 0)

    @property
    def notes(self) -> list[str]:
        return [] if self.request is None else [str(note) for note in self.request.get("notes") or []]


def recall_build(
    *,
    session_id: int,
    request: dict[str, Any] | None,
    embedder: dict[str, str],
    index: dict[str, Any] | None = None,
) -> RecallSection:
    """The section from a recall report (an event's or a call's); entries without ``item_id`` are skipped."""

    def entries(key: str) -> list[RecallEntry]:
        found = request.get(key) if request is not None else None
        return [RecallEntry.from_stored(entry, session_id=session_id) for entry in found or () if "item_id" in entry]

    return RecallSection(
        session_id=session_id,
        request=request,
        embedder=embedder,
        index=index,
        items=entries("items"),
        rejected=entries("rejected"),
        over_budget=entries("over_budget"),
    )


def recall_of_call(call: ModelCall | None) -> dict[str, Any] | None:
    """The recall report of a model call; None without a call or an empty report."""
    recall = call.context.get("recall") if call is not None else None
    return recall if isinstance(recall, dict) and recall else None


def recall_get(*, session_id: int, request: dict[str, Any] | None) -> RecallSection:
    """With the report ``request`` and the index status (one query; no access check: callers authorize)."""
    return recall_build(
        session_id=session_id,
        request=request,
        embedder=embedder_choice().as_dict(),
        index=memory_engine().index_status(memory_key_of(session_id)),
    )


def recall_section_get(*, session_id: int) -> RecallSection:
    """With the report of the newest model call (no access check: callers authorize)."""
    last_call = ModelCall.objects.filter(session_id=session_id).order_by("-id").first()
    return recall_get(session_id=session_id, request=recall_of_call(last_call))
