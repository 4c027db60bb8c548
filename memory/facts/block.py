"""The key-facts block of a request (docs/memory.md §11): which facts fit its budget, in
which order, and how each is written. Pure."""

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
    """The key-facts block of one request and what was left out of it.

    ``message``: the block (None when no fact is pinned); ``pinned``: the facts it holds, in
    block order; ``in_window``: eligible facts left out because their source message is verbatim
    in the request; ``over_budget``: eligible facts that did not fit the budget ("not pinned
    (budget)"); ``tokens``: the block's size in tokens (0 without one).
    """

    message: Message | None = None
    pinned: list[KeyFact] = field(default_factory=list)
    in_window: list[KeyFact] = field(default_factory=list)
    over_budget: list[KeyFact] = field(default_factory=list)
    tokens: int = 0

    @property
    def source(self) -> dict[str, Any]:
        """The block's entry in a request's ``sources``: kind ``facts`` with the pinned facts'
        ``fact_ids`` and their source ``message_ids`` (provenance, docs/replay.md)."""
        return {
            "id": None,
            "kind": "facts",
            "fact_ids": [fact.id for fact in self.pinned],
            "message_ids": sorted({fact.source_message_id for fact in self.pinned if fact.source_message_id}),
        }

    def as_dict(self) -> dict[str, Any]:
        """The JSON form in the inspector's snapshot: ids per group and the block's tokens."""
        return {
            "pinned": [fact.id for fact in self.pinned],
            "in_window": [fact.id for fact in self.in_window],
            "over_budget": [fact.id for fact in self.over_budget],
            "tokens": self.tokens,
        }


def fact_line(fact: KeyFact) -> str:
    """One line of the block: ``- slot: value (msg N)``, with the fact's ``text`` for commitments
    and other facts, whose slot and value may not say enough, and ``current; replaces <old value>`` after a supersession."""
    where = f"msg {fact.source_message_id}" if fact.source_message_id else "set by the user"
    if fact.replaces:
        where += f", current; replaces {fact.replaces}"
    elif fact.pinned_by_user:
        where += ", pinned by the user"
    text = f" - {fact.text}" if fact.kind in EXPLAINED_BY_TEXT and fact.text and fact.text != fact.value else ""
    return f"- {fact.key}: {fact.value}{text} ({where})"


def render_facts(facts: Sequence[KeyFact]) -> str:
    """The block's text for ``facts`` (in block order): the header, then one line per slot for
    values that explain themselves (identifiers, amounts, dates, contact data) and did not
    replace an older value, ``- slot: value; value``, newest first; every other fact on its own
    annotated line (:func:`fact_line`). Provenance of grouped values is in the block's source
    (``message_ids``) and the inspector."""
    lines: list[str] = []
    slots: dict[str, int] = {}
    for fact in facts:
        if fact.kind in SELF_EXPLAINING and not fact.replaces:
            if fact.key in slots:
                lines[slots[fact.key]] += f"; {fact.value}"
            else:
                slots[fact.key] = len(lines)
                lines.append(f"- {fact.key}: {fact.value}")
        else:
            lines.append(fact_line(fact))
    return "\n".join([FACTS_HEADER, *lines])


def block_order(facts: Iterable[KeyFact]) -> list[KeyFact]:
    """``facts`` in the block's keep order (docs/memory.md §11): pinned by the user first, then
    identifiers, amounts, dates, contact data (email, phone, URL, address), then names,
    preferences and commitments, then others; within a group the newest source message first."""
    return sorted(
        facts,
        key=lambda fact: (
            not fact.pinned_by_user,
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
    """The key-facts block for a request whose summary covers messages up to ``boundary``.

    Eligible: active facts (not superseded, not hidden). Pinned in the block: every eligible fact
    whose source message is folded into the summary (id ≤ ``boundary``), plus, wherever their
    source is, those the user pinned or edited and those that replaced an older value (so the
    block says which value is current). The others are verbatim in the request and are reported
    as ``in_window``. Facts are taken in :func:`block_order` while the block (header and message
    overhead included, rendered by :func:`render_facts`) fits ``max_tokens`` tokens; a fact that
    does not fit is skipped and the next one tried, so the order of eviction is deterministic.
    ``role``: the block's role, the summary block's (docs/memory.md F-10). ``covered``: ids of messages after the boundary that
    are not verbatim in the request either (older steps of the current turn folded into a "steps
    so far" note, docs/memory.md I5): their facts are pinned as if summarized.
    ``pinned_max_tokens``: the facts the user pinned (taken first) may fill the block up to this
    many tokens when it is more than ``max_tokens``: the owner's explicit choice outranks the
    default budget, within a bound.
    """
    wanted: list[KeyFact] = []
    in_window: list[KeyFact] = []
    for fact in facts:
        if not fact.active:
            continue
        source = fact.source_message_id
        folded = source is not None and ((boundary is not None and source <= boundary) or source in covered)
        if folded or fact.pinned_by_user or fact.extractor == "user" or fact.replaces:
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
