"""Key-fact values (docs/memory.md §11): what an extractor proposes, what is stored, their kinds and limits."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

FactKind = Literal[
    "id", "money", "date", "email", "phone", "url", "address", "name", "preference", "commitment", "other"
]


FACT_KINDS: tuple[FactKind, ...] = (
    "id",
    "money",
    "date",
    "email",
    "phone",
    "url",
    "address",
    "name",
    "preference",
    "commitment",
    "other",
)


# The block's keep order after user-pinned facts (docs/memory.md §11); newest source first within a rank.
KIND_RANK: dict[str, int] = {
    "id": 0,
    "money": 1,
    "date": 2,
    "email": 3,
    "phone": 3,
    "url": 3,
    "address": 3,
    "name": 4,
    "preference": 4,
    "commitment": 4,
    "other": 5,
}


# Kinds whose value says everything: their values share one line per slot in the block.
SELF_EXPLAINING: frozenset[str] = frozenset({"id", "money", "date", "email", "phone", "url"})


# Kinds whose block line adds the one-line ``text``: a slot and value may not say what was promised.
EXPLAINED_BY_TEXT: frozenset[str] = frozenset({"commitment", "other"})


# How a fact came or went (docs/memory.md F-46 to F-48); ``correct`` is a supersede said as a self-correction;
# ``forget``: the message it came from was deleted by the app (a regenerated reply).
Operation = Literal["add", "supersede", "correct", "retract", "forget"]
Polarity = Literal["positive", "negative"]
# Where a value came from (F-49): the user's own words, a tool call's arguments, or merely mentioned.
PROVENANCES: tuple[str, ...] = ("user", "tool_args", "mentioned", "tool_result")


# Characters of source text kept around a value as its excerpt.
EXCERPT_CHARS = 120


# Longest value a fact may hold (characters): a fact is a value, not a passage.
MAX_VALUE_CHARS = 200


MAX_KEY_CHARS = 64


MAX_TEXT_CHARS = 240


@dataclass(frozen=True, kw_only=True)
class FactCandidate:
    """A fact an extractor proposes: ``key`` its slot (``snake_case``), ``value`` verbatim from the source, ``text``
    one line with absolute dates; ``supersedes``: ids of the slot's stored facts it replaces (a ``retract`` stores
    no value of its own: it only ends them)."""

    kind: FactKind
    key: str
    value: str
    text: str
    source_message_id: int
    excerpt: str = ""
    extractor: str = "rule"
    supersedes: tuple[int, ...] = ()
    operation: Operation = "add"
    polarity: Polarity = "positive"
    provenance: str = "user"


@dataclass(frozen=True, kw_only=True)
class KeyFact:
    """A stored fact as the engine sees it: :class:`FactCandidate`'s fields plus ``id``, its retirement
    (``invalidated_at``, ``superseded_by``, ``changed_by_message_id``), the owner's pin and hide, ``replaces``
    (the value it superseded) and ``chat``: the conversation of a fact loaded from another of the owner's chats,
    empty for the requesting chat's own (docs/memory.md §11 "Owner-wide")."""

    id: int
    kind: str
    key: str
    value: str
    text: str
    source_message_id: int | None
    excerpt: str = ""
    extractor: str = "rule"
    valid_from: datetime | None = None
    invalidated_at: datetime | None = None
    superseded_by: int | None = None
    pinned_by_user: bool = False
    hidden_by_user: bool = False
    last_seen_message_id: int | None = None
    replaces: str = ""
    operation: str = "add"
    polarity: str = "positive"
    provenance: str = "user"
    changed_by_message_id: int | None = None
    chat: str = ""

    @property
    def active(self) -> bool:
        """Current (not superseded) and not hidden by the owner: eligible for the block."""
        return self.invalidated_at is None and not self.hidden_by_user

    @property
    def status(self) -> str:
        """``current``, ``superseded`` (a newer value of the slot) or ``retracted`` (withdrawn, no new value)."""
        if self.invalidated_at is None:
            return "current"
        return "superseded" if self.superseded_by is not None else "retracted"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "key": self.key,
            "value": self.value,
            "text": self.text,
            "source_message_id": self.source_message_id,
            "excerpt": self.excerpt,
            "extractor": self.extractor,
            "valid_from": self.valid_from.isoformat() if self.valid_from else None,
            "invalidated_at": self.invalidated_at.isoformat() if self.invalidated_at else None,
            "superseded_by": self.superseded_by,
            "pinned_by_user": self.pinned_by_user,
            "hidden_by_user": self.hidden_by_user,
            "last_seen_message_id": self.last_seen_message_id,
            "replaces": self.replaces,
            "operation": self.operation,
            "polarity": self.polarity,
            "provenance": self.provenance,
            "changed_by_message_id": self.changed_by_message_id,
            "status": self.status,
        }
