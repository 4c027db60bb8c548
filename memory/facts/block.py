"""The key-facts block of a request (docs/memory.md §11): which facts fit its budget, in which order, how written."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memory.facts.values import EXPLAINED_BY_TEXT, KIND_RANK, SELF_EXPLAINING, KeyFact
from memory.messages import Message
from memory.tokens.counter import TokenCounter

FACTS_HEADER = "[Key facts of this conversation, verbatim]"


@dataclass(frozen=True, kw_only=True)
class FactsBlock:
    """One request's key-facts block (``message`` None when no fact is pinned) and what was left out: ``in_window``
    (source verbatim in the request) and ``over_budget``; ``tokens`` its size."""

    message: Message | None = None
    pinned: list[KeyFact] = field(default_factory=list)
    in_window: list[KeyFact] = field(default_factory=list)
    over_budget: list[KeyFact] = field(default_factory=list)
    tokens: int = 0

    @property
    def source(self) -> dict[str, Any]:
        """The block's entry in a request's ``sources``: pinned ``fact_ids`` and their ``message_ids`` (docs/replay.md)."""
        return {
            "id": None,
            "kind": "facts",
            "fact_ids": [fact.id for fact in self.pinned],
            "message_ids": sorted({fact.source_message_id for fact in self.pinned if fact.source_message_id}),
        }

    def as_dict(self) -> dict[str, Any]:
        """The replay record's ``facts`` (docs/replay.md): ids per status, ``tokens``, and ``entries``, one per
        current fact ``{"id", "kind", "key", "value", "polarity", "provenance", "status", "note"}``."""
        groups = (("pinned", self.pinned), ("in_window", self.in_window), ("over_budget", self.over_budget))
        return {
            **{status: [fact.id for fact in facts] for status, facts in groups},
            "tokens": self.tokens,
            "entries": [fact_entry(fact, status) for status, facts in groups for fact in facts],
        }


def fact_entry(fact: KeyFact, status: str) -> dict[str, Any]:
    """A current fact as the replay record lists it; ``note`` says how its slot changed (F-48)."""
    return {
        "id": fact.id,
        "kind": fact.kind,
        "key": fact.key,
        "value": fact.value,
        "polarity": fact.polarity,
        "provenance": fact.provenance,
        "status": status,
        "note": change_note(fact),
    }


def change_note(fact: KeyFact) -> str:
    """``corrected in msg N`` or ``changed in msg N`` for a value that replaced another, else ``""``; a fact of another
    of the owner's chats says so (docs/memory.md §11 "Owner-wide")."""
    note = ""
    if fact.replaces and fact.source_message_id:
        note = f"{'corrected' if fact.operation == 'correct' else 'changed'} in msg {fact.source_message_id}"
    if fact.chat:
        note = f"{note}, from another chat" if note else "from another chat"
    return note


def fact_line(fact: KeyFact) -> str:
    """One annotated line, ``- slot: value (msg N)``, with ``text`` for the kinds in :data:`EXPLAINED_BY_TEXT`."""
    where = f"msg {fact.source_message_id}" if fact.source_message_id else "set by the user"
    if fact.chat:
        where += ", from another chat"
    if fact.provenance == "mentioned":
        where += ", mentioned, not said of the user"
    if fact.replaces and fact.operation == "correct":
        where = f"{change_note(fact)}; replaces {fact.replaces}"
    elif fact.replaces:
        where += f", current; replaces {fact.replaces}"
    elif fact.pinned_by_user:
        where += ", pinned by the user"
    text = f" - {fact.text}" if fact.kind in EXPLAINED_BY_TEXT and fact.text and fact.text != fact.value else ""
    return f"- {fact.key}: {fact.value}{text} ({where})"


def render_facts(facts: Sequence[KeyFact]) -> str:
    """The block's text: the header, one line per slot for :data:`SELF_EXPLAINING` values that replaced nothing
    (``- slot: value; value``), and a :func:`fact_line` for every other fact."""
    lines: list[str] = []
    slots: dict[str, int] = {}
    for fact in facts:
        if fact.kind in SELF_EXPLAINING and not fact.replaces and fact.provenance != "mentioned" and not fact.chat:
            if fact.key in slots:
                lines[slots[fact.key]] += f"; {fact.value}"
            else:
                slots[fact.key] = len(lines)
                lines.append(f"- {fact.key}: {fact.value}")
        else:
            lines.append(fact_line(fact))
    return "\n".join([FACTS_HEADER, *lines])


def block_order(facts: Iterable[KeyFact]) -> list[KeyFact]:
    """``facts`` in the block's keep order (docs/memory.md §11 "Budget"): user-pinned, the user's own values before
    merely mentioned ones (F-49), then by kind, newest first."""
    return sorted(
        facts,
        key=lambda fact: (
            not fact.pinned_by_user,
            fact.provenance == "mentioned",
            KIND_RANK.get(fact.kind, len(KIND_RANK)),
            -(fact.source_message_id or 0),
            -fact.id,
        ),
    )


def facts_block(
    facts: Iterable[KeyFact],
    *,
    boundary: int | None,
    max_tokens: int,
    counter: TokenCounter,
    role: str = "system",
    covered: Collection[int] = (),
    pinned_max_tokens: int = 0,
) -> FactsBlock:
    """The key-facts block for a request whose summary covers messages up to ``boundary`` (docs/memory.md §11):
    active facts folded into the summary (or a "steps so far" note: ``covered``, I5), user-pinned, edited or
    replacing ones and those of another chat (never in this request's window), taken in :func:`block_order` while
    the block fits ``max_tokens`` tokens, skipping what does not. User-pinned facts may fill up to
    ``pinned_max_tokens``; ``role`` is the summary block's (F-10)."""
    wanted: list[KeyFact] = []
    in_window: list[KeyFact] = []
    for fact in facts:
        if not fact.active:
            continue
        source = fact.source_message_id
        folded = source is not None and ((boundary is not None and source <= boundary) or source in covered)
        if folded or fact.pinned_by_user or fact.extractor == "user" or fact.replaces or fact.chat:
            wanted.append(fact)
        else:
            in_window.append(fact)
    if not wanted or max(max_tokens, pinned_max_tokens) <= 0:
        return FactsBlock(in_window=in_window, over_budget=block_order(wanted))
    pinned: list[KeyFact] = []
    over: list[KeyFact] = []
    for fact in block_order(wanted):
        trial = {"role": role, "content": render_facts([*pinned, fact])}
        limit = max(max_tokens, pinned_max_tokens) if fact.pinned_by_user else max_tokens
        if counter.count_message(trial) <= limit:
            pinned.append(fact)
        else:
            over.append(fact)
    if not pinned:
        return FactsBlock(in_window=in_window, over_budget=over)
    message = {"role": role, "content": render_facts(pinned)}
    return FactsBlock(
        message=message,
        pinned=pinned,
        in_window=in_window,
        over_budget=over,
        tokens=counter.count_message(message),
    )
