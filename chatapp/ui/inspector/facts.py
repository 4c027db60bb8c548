"""The inspector's Key facts section (docs/memory.md §11)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.llm.offline.transport import OFFLINE_MODEL
from chatapp.models import ModelCall
from chatapp.ui.inspector.stored import datetime_or_none, int_or_none
from memory.api import KeyFact

# Where a current key fact was in the last request (its snapshot's "facts" groups, docs/memory.md §11).
FACT_PINNED = "pinned"
FACT_IN_WINDOW = "in_window"
FACT_OVER_BUDGET = "over_budget"
FACT_STATUS_LABELS = {
    FACT_PINNED: "pinned in the block",
    FACT_IN_WINDOW: "in the window",
    FACT_OVER_BUDGET: "not pinned (budget)",
}


@dataclass(frozen=True, kw_only=True)
class FactRow:
    """A listed fact: ``status`` where the last request had it (a ``FACT_*`` or ``""``), and for a
    superseded one the fact that ``replaced_by`` it (None when unknown)."""

    fact: KeyFact
    status: str = ""
    replaced_by: KeyFact | None = None

    @property
    def status_label(self) -> str:
        return FACT_STATUS_LABELS.get(self.status, "")

    @property
    def note(self) -> str:
        """The fact's ``text`` when it says more than the value (a rule's never does, docs/memory.md §11)."""
        text = self.fact.text
        return "" if self.fact.extractor == "rule" or not text or text == self.fact.value else text

    @property
    def change_label(self) -> str:
        """How a retired fact ended: ``withdrawn in message N``, ``corrected in message N`` or ``replaced in message
        N`` (F-46 to F-48), or forgotten with its regenerated reply; ``""`` for a current one or an edit."""
        fact, by = self.fact, self.fact.changed_by_message_id
        if fact.status != "current" and fact.operation == "forget":
            return "forgotten: the reply it came from was regenerated"
        if fact.status == "current" or by is None:
            return ""
        if fact.status == "retracted":
            return f"withdrawn in message #{by}"
        corrected = self.replaced_by is not None and self.replaced_by.operation == "correct"
        return f"{'corrected' if corrected else 'replaced'} in message #{by}"

    @property
    def extractor_label(self) -> str:
        """``rule``, ``LLM (<model>)``, ``offline engine (no language model)`` or ``you`` (an edit)."""
        extractor = self.fact.extractor
        if extractor == "user":
            return "you"
        if extractor.startswith("llm:"):
            model = extractor.removeprefix("llm:")
            return "offline engine (no language model)" if model == OFFLINE_MODEL else f"LLM ({model})"
        return extractor


@dataclass(frozen=True, kw_only=True)
class KeyFacts:
    """Current (pinned first), superseded and hidden facts, each newest first; ``request`` the last
    request's ``facts`` snapshot ``{"pinned", "in_window", "over_budget": [ids], "tokens": n}`` or None;
    ``error`` what was wrong with the owner's last input about fact ``error_fact_id``."""

    session_id: int
    current: list[FactRow] = field(default_factory=list)
    superseded: list[FactRow] = field(default_factory=list)
    hidden: list[FactRow] = field(default_factory=list)
    request: dict[str, Any] | None = None
    error: str = ""
    error_fact_id: int | None = None

    @property
    def block_tokens(self) -> int | None:
        return None if self.request is None else int(self.request.get("tokens") or 0)

    @property
    def over_budget_count(self) -> int:
        return sum(1 for row in self.current if row.status == FACT_OVER_BUDGET)

    @property
    def fact_ids(self) -> frozenset[int]:
        return frozenset(row.fact.id for row in (*self.current, *self.superseded, *self.hidden))


def key_facts_build(*, session_id: int, facts: Iterable[KeyFact], request: dict[str, Any] | None) -> KeyFacts:
    """The section from every stored fact of the session and the last request's ``facts`` snapshot."""
    rows = list(facts)
    by_id = {fact.id: fact for fact in rows}
    statuses: dict[int, str] = {}
    if request is not None:
        for status in (FACT_OVER_BUDGET, FACT_IN_WINDOW, FACT_PINNED):
            statuses.update({int(fact_id): status for fact_id in request.get(status) or ()})
    newest_first = sorted(rows, key=lambda fact: -fact.id)
    current, superseded, hidden = [], [], []
    for fact in newest_first:
        row = FactRow(
            fact=fact,
            status=statuses.get(fact.id, "") if fact.active else "",
            replaced_by=by_id.get(fact.superseded_by) if fact.superseded_by is not None else None,
        )
        if fact.hidden_by_user:
            hidden.append(row)
        elif fact.invalidated_at is not None:
            superseded.append(row)
        else:
            current.append(row)
    current.sort(key=lambda row: not row.fact.pinned_by_user)
    return KeyFacts(session_id=session_id, current=current, superseded=superseded, hidden=hidden, request=request)


def key_facts_get(*, session_id: int, request: dict[str, Any] | None) -> KeyFacts:
    """As stored, with the last request's snapshot ``request`` (no access check: callers authorize)."""
    facts = memory_engine().facts(memory_key_of(session_id))
    return key_facts_build(session_id=session_id, facts=facts, request=request)


def key_facts_of_call(call: ModelCall | None) -> dict[str, Any] | None:
    """The ``facts`` snapshot of a model call; None without a call or an empty snapshot."""
    facts = call.context.get("facts") if call is not None else None
    return facts if isinstance(facts, dict) and facts else None


def key_facts_section_get(*, session_id: int) -> KeyFacts:
    """With the snapshot of the session's newest model call (no access check: callers authorize)."""
    last_call = ModelCall.objects.filter(session_id=session_id).order_by("-id").first()
    return key_facts_get(session_id=session_id, request=key_facts_of_call(last_call))


def key_fact_from_dict(data: dict[str, Any]) -> KeyFact:
    """A fact from ``KeyFact.as_dict()``; ``KeyError`` for a missing ``id``, ``key`` or ``value``."""
    return KeyFact(
        id=int(data["id"]),
        kind=str(data.get("kind") or "other"),
        key=str(data["key"]),
        value=str(data["value"]),
        text=str(data.get("text") or ""),
        source_message_id=int_or_none(data.get("source_message_id")),
        excerpt=str(data.get("excerpt") or ""),
        extractor=str(data.get("extractor") or "rule"),
        valid_from=datetime_or_none(data.get("valid_from")),
        invalidated_at=datetime_or_none(data.get("invalidated_at")),
        superseded_by=int_or_none(data.get("superseded_by")),
        pinned_by_user=bool(data.get("pinned_by_user")),
        hidden_by_user=bool(data.get("hidden_by_user")),
        last_seen_message_id=int_or_none(data.get("last_seen_message_id")),
        replaces=str(data.get("replaces") or ""),
        operation=str(data.get("operation") or "add"),
        polarity=str(data.get("polarity") or "positive"),
        provenance=str(data.get("provenance") or "user"),
        changed_by_message_id=int_or_none(data.get("changed_by_message_id")),
    )
