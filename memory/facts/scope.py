"""Owner-wide key facts (docs/memory.md §11 "Owner-wide", F-54): which slots describe the person rather than one
chat's task, and one chat's view of them across the owner's chats, where the newest change of a slot wins. Pure."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Literal

from memory.facts.values import KeyFact

FactsScope = Literal["chat", "owner"]


# The personal slots, as the extractors name them (rules: email, phone, zip_code; LLM extraction: the others), each
# mapped to the slot it counts as across chats: a new home address replaces an "address". Every other slot (orders,
# bookings, tickets, amounts, dates, tool arguments) belongs to its chat.
PERSONAL_SLOTS: Mapping[str, str] = {
    "name": "name",
    "email": "email",
    "phone": "phone",
    "address": "address",
    "home_address": "address",
    "shipping_address": "shipping_address",
    "zip_code": "zip_code",
    "allergy": "allergy",
    "likes": "preference",
    "dislikes": "preference",
    "preference": "preference",
    "pet_name": "pet_name",
}


# Personal slots holding one value at a time: a value stated later in another chat replaces this one. The others
# (several emails, allergies, pets) change across chats only by a withdrawal, an update or correction of the slot,
# or a preference turned around.
SINGLE_VALUED_SLOTS: frozenset[str] = frozenset({"name", "address", "shipping_address", "zip_code"})


# Operations that replace the slot's newest earlier value (docs/memory.md F-48).
_REPLACING = frozenset({"supersede", "correct"})


def slot_of(fact: KeyFact) -> str:
    """The personal slot ``fact`` belongs to, ``""`` for a chat's own slot."""
    return PERSONAL_SLOTS.get(fact.key, "")


def owner_wide(fact: KeyFact) -> bool:
    """A value of a personal slot the user gave (not merely mentioned, F-49): shared by the owner's chats."""
    return bool(slot_of(fact)) and fact.provenance != "mentioned" and not fact.hidden_by_user


def owner_view(facts: Iterable[KeyFact]) -> list[KeyFact]:
    """This chat's current facts, oldest first, from its active facts (``chat`` empty) and the owner's personal facts,
    current and ended, of its own (``chat`` empty) and other chats (``chat`` set). A personal fact stops being current
    when a later change in another chat ends it; changes within one chat stay as stored. Another chat's current
    values join, once each; nothing is changed but the copies returned."""
    rows = [fact for fact in facts if not fact.hidden_by_user]
    changes = _Changes([fact for fact in rows if owner_wide(fact)])
    kept: list[KeyFact] = []
    replaced: dict[int, KeyFact] = {}  # id of a current fact -> the newest value it replaced in another chat
    for fact in rows:
        if fact.invalidated_at is not None or (fact.chat and not owner_wide(fact)):
            continue
        if not owner_wide(fact):
            kept.append(fact)
            continue
        change = changes.ending(fact)
        if change is None:
            kept.append(fact)
        elif not _same(change, fact):
            older = replaced.get(change.id)
            if older is None or _stated(fact) > _stated(older):
                replaced[change.id] = fact
    kept = _once(_beside_pins(kept))
    current = [
        replace(fact, replaces=replaced[fact.id].value) if fact.id in replaced and not fact.replaces else fact
        for fact in kept
    ]
    return sorted(current, key=lambda fact: fact.id)


def _norm(value: str) -> str:
    return " ".join(value.split()).casefold()


def _same(a: KeyFact, b: KeyFact) -> bool:
    """One value of one slot: same personal slot, value and polarity."""
    return slot_of(a) == slot_of(b) and _norm(a.value) == _norm(b.value) and a.polarity == b.polarity


Order = tuple[float, int, int]


def _stated(fact: KeyFact) -> Order:
    """When ``fact`` was said: its source message's time, then the message's and the fact's ids."""
    at = fact.valid_from.timestamp() if fact.valid_from is not None else 0.0
    return at, fact.source_message_id or 0, fact.id


def _ended(fact: KeyFact) -> Order:
    """When ``fact`` stopped being current (it has ``invalidated_at``), then the ids of the change and the fact."""
    at = fact.invalidated_at.timestamp() if fact.invalidated_at is not None else 0.0
    return at, fact.changed_by_message_id or 0, fact.id


class _Latest:
    """The latest change per chat of one thing, kept for two chats: enough to find the latest of any other chat."""

    def __init__(self) -> None:
        self.top: list[tuple[Order, str, KeyFact]] = []

    def add(self, when: Order, fact: KeyFact) -> None:
        entries = [entry for entry in self.top if entry[1] != fact.chat]
        mine = [entry for entry in self.top if entry[1] == fact.chat]
        best = max([*mine, (when, fact.chat, fact)], key=lambda entry: entry[0])
        self.top = sorted([*entries, best], key=lambda entry: entry[0], reverse=True)[:2]

    def after(self, when: Order, chat: str) -> KeyFact | None:
        """The latest change of a chat other than ``chat``, if later than ``when``."""
        for at, other, fact in self.top:
            if other != chat:
                return fact if at > when else None
        return None


class _Changes:
    """The changes the owner's personal facts record, indexed for :meth:`ending` (one pass over them)."""

    def __init__(self, shared: list[KeyFact]) -> None:
        self.ended: dict[tuple[str, str, str], _Latest] = {}  # (slot, value, polarity) -> withdrawn or replaced
        self.replaced: dict[tuple[str, str], _Latest] = {}  # (slot, value) -> updated or corrected by a newer value
        self.statements: dict[str, list[tuple[Order, KeyFact]]] = {}  # slot -> what was said, newest first
        # Preferences by (slot, polarity, value), and by each shorter run of their leading words (F-47's topics).
        self.topics: dict[tuple[str, str, str], _Latest] = {}
        self.subtopics: dict[tuple[str, str, str], _Latest] = {}
        for fact in shared:
            slot = slot_of(fact)
            if fact.invalidated_at is not None:
                self.ended.setdefault((slot, _norm(fact.value), fact.polarity), _Latest()).add(_ended(fact), fact)
            if fact.operation == "retract":
                continue  # a record of a withdrawal says nothing of its own
            stated = _stated(fact)
            self.statements.setdefault(slot, []).append((stated, fact))
            if fact.kind == "preference":
                words = _norm(fact.value).split()
                self.topics.setdefault((slot, fact.polarity, " ".join(words)), _Latest()).add(stated, fact)
                for size in range(1, len(words)):
                    prefix = " ".join(words[:size])
                    self.subtopics.setdefault((slot, fact.polarity, prefix), _Latest()).add(stated, fact)
        for said in self.statements.values():
            said.sort(key=lambda entry: entry[0], reverse=True)
            for position, (stated, new) in enumerate(said):
                if new.operation in _REPLACING:
                    value = _norm(new.value)
                    older = itertools.islice(said, position + 1, None)
                    newest = next((old for _, old in older if _norm(old.value) != value), None)
                    if newest is not None:
                        key = (slot_of(new), _norm(newest.value))
                        self.replaced.setdefault(key, _Latest()).add(stated, new)

    def ending(self, fact: KeyFact) -> KeyFact | None:
        """The change of another chat that ends ``fact``, stated after it: the same value withdrawn or replaced there
        (returned as that ended fact), or a value that replaces it (returned as that fact): a single-valued slot's,
        a preference turned around (F-47), an update or correction of the slot's newest earlier value (F-48). A fact
        pinned in this chat is only ended by the owner."""
        if fact.pinned_by_user and not fact.chat:
            return None
        slot, value, stated = slot_of(fact), _norm(fact.value), _stated(fact)
        found: list[_Latest | None] = [self.ended.get((slot, value, fact.polarity)), self.replaced.get((slot, value))]
        if fact.kind == "preference":
            other = "negative" if fact.polarity == "positive" else "positive"
            words = value.split()
            found += [self.topics.get((slot, other, " ".join(words[:size]))) for size in range(1, len(words) + 1)]
            found.append(self.subtopics.get((slot, other, value)))
        for latest in found:
            change = latest.after(stated, fact.chat) if latest is not None else None
            if change is not None:
                return change
        if slot in SINGLE_VALUED_SLOTS:
            for when, new in self.statements.get(slot, ()):
                if when <= stated:
                    break
                if new.chat != fact.chat and _norm(new.value) != value:
                    return new
        return None


def _beside_pins(facts: list[KeyFact]) -> list[KeyFact]:
    """``facts`` without another chat's values of a single-valued slot this chat's owner pinned a value of."""
    pinned = {slot_of(fact) for fact in facts if fact.pinned_by_user and not fact.chat and owner_wide(fact)}
    pinned &= SINGLE_VALUED_SLOTS
    return [fact for fact in facts if not (fact.chat and slot_of(fact) in pinned and owner_wide(fact))]


def _once(facts: list[KeyFact]) -> list[KeyFact]:
    """``facts`` with each personal value once: this chat's own, else another chat's newest statement of it."""
    best: dict[tuple[str, str, str], KeyFact] = {}
    for fact in facts:
        if not owner_wide(fact):
            continue
        key = (slot_of(fact), _norm(fact.value), fact.polarity)
        held = best.get(key)
        if held is None or (held.chat and (not fact.chat or _stated(fact) > _stated(held))):
            best[key] = fact
    return [
        fact
        for fact in facts
        if not fact.chat or not owner_wide(fact) or best[(slot_of(fact), _norm(fact.value), fact.polarity)] is fact
    ]
