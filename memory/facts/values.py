"""Key-fact values: what an extractor proposes (:class:`FactCandidate`) and what is stored
(:class:`KeyFact`), with their kinds and size limits (docs/memory.md §11)."""

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


# Eviction order of the block, first kept first (docs/memory.md §11): user-pinned facts come
# before all of these; within a rank the newest source message first.
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


# Kinds whose block line also shows the fact's one-line ``text`` (a slot and value may not say
# what was promised); for the others "- allergy: penicillin" says it all in fewer tokens.
EXPLAINED_BY_TEXT: frozenset[str] = frozenset({"commitment", "other"})


# Characters of source text kept around a value as its excerpt.
EXCERPT_CHARS = 120


# Longest value a fact may hold (characters): a fact is a value, not a passage.
MAX_VALUE_CHARS = 200


MAX_KEY_CHARS = 64


MAX_TEXT_CHARS = 240


@dataclass(frozen=True, kw_only=True)
class FactCandidate:
    """A fact an extractor proposes, before it is stored.

    ``kind``: one of :data:`FACT_KINDS`; ``key``: its slot (lowercase ``snake_case``, e.g.
    ``order_id``, ``shipping_address``); ``value``: verbatim from the source (at most 200
    characters); ``text``: one line saying what it is, dates absolute; ``source_message_id``: the
    message it came from; ``excerpt``: up to 120 characters of that message around the value;
    ``extractor``: ``rule``, ``llm:<model>`` or ``user``; ``supersedes``: ids of stored facts of
    the same slot that this one replaces (validated by :func:`validate_extraction`).
    """

    kind: FactKind
    key: str
    value: str
    text: str
    source_message_id: int
    excerpt: str = ""
    extractor: str = "rule"
    supersedes: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class KeyFact:
    """A stored key fact as the engine sees it (no ORM object reaches the engine).

    The fields of :class:`FactCandidate` (without ``supersedes``) plus ``id``; ``valid_from``:
    the source message's time (aware datetime, None when unknown); ``invalidated_at``: when a newer
    fact of the slot retired it (None while current); ``superseded_by``: that fact's id;
    ``pinned_by_user`` / ``hidden_by_user``: the owner's choices in the inspector;
    ``last_seen_message_id``: the newest message that restated it; ``replaces``: the value of the
    fact it superseded (``""`` when none), so the block can say which value is current.
    """

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

    @property
    def active(self) -> bool:
        """Current (not superseded) and not hidden by the owner: eligible for the block."""
        return self.invalidated_at is None and not self.hidden_by_user

    def as_dict(self) -> dict[str, Any]:
        """The JSON form sent to the inspector (datetimes as ISO 8601 or None)."""
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
        }
