"""Answers from the key-facts block of a request, for :mod:`chatapp.llm.offline.replies`."""

from __future__ import annotations

import re
from typing import Any

from chatapp.llm.offline.blocks import FactLine, facts_lines, message_blocks
from chatapp.llm.offline.evidence import ID_WORDS, Evidence, content_words, plain_text, words_needed

Message = dict[str, Any]

# Words a question may use for a key-facts slot (the slots are named in memory/facts.py).
SLOT_WORDS: dict[str, str] = {
    "user_id": "account user username login customer",
    "order_id": "order",
    "reservation_id": "reservation booking confirmation",
    "zip_code": "zip postal postcode",
    "tracking_id": "tracking parcel package shipment",
    "flight_number": "flight",
    "payment_card": "card payment visa mastercard amex",
    "ticket_id": "ticket case issue",
    "item_id": "item product sku",
    "invoice_id": "invoice receipt",
    "name": "called call",
    "pet_name": "pet dog cat puppy kitten parrot rabbit hamster called",
    "home_address": "address live living home",
    "address": "address live living home",
    "shipping_address": "address shipping delivery deliver ship",
    "allergy": "allergic allergies allergy",
    "likes": "like love enjoy favourite favorite",
    "dislikes": "dislike hate",
    "preference": "prefer preferred",
    "email": "email mail address",
    "phone": "phone mobile telephone number",
    "amount": "amount money price cost paid pay total",
    "date": "date day",
    "time": "time",
    "url": "url link website site",
}
# Slots holding identifiers also answer to "id", "number", "code", "reference".
_ID_SLOT_SUFFIXES = ("_id", "_number", "_code", "_reference", "identifier")
_MY_PHRASE_RE = re.compile(r"\b(?:my|our)\s+([^\W\d_][\w'’-]*(?:\s+[^\W\d_][\w'’-]*){0,3})", re.I)
_FACTS_NAME = "the key facts"
# A phrase ending in a plural ("account ids"), not in "-ss", "-us", "-is" ("address", "status").
_PLURAL_RE = re.compile(r"(?<![sui'’])s$", re.I)
# The kind of value a question asks for by its form: "when" a date or time, "how much" an amount.
_ASKED_KINDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bwhen\b|\bwhat\s+(?:date|day|time)\b", re.I), "date"),
    (re.compile(r"\bhow\s+much\b", re.I), "amount"),
)
# Slots of each kind: rule facts "amount", "date", "time"; tool-call facts "departure_date", "total_price".
_SLOT_KINDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?:^|_)(?:date|time|day)(?:_|$)"), "date"),
    (re.compile(r"(?:^|_)(?:amount|price|cost|total|fee)(?:_|$)"), "amount"),
)


def facts_of(message: Message) -> list[FactLine]:
    """The facts of the key-facts blocks in ``message`` (none for an assistant's or tool's)."""
    if message.get("role") not in ("system", "user"):
        return []
    blocks = message_blocks(plain_text(message.get("content")))
    return [fact for block in blocks if block.kind == "facts" for fact in facts_lines(block.text)]


def _slot_words(key: str) -> tuple[set[str], set[str]]:
    """``(the slot's own words, the words a question may use for it)``, as content words."""
    own = content_words(key)
    extra = content_words(SLOT_WORDS.get(key, ""))
    if key.endswith(_ID_SLOT_SUFFIXES):
        extra |= content_words(" ".join(sorted(ID_WORDS)))
    return own, own | extra


def answer_from_facts(question: str, wanted: set[str], facts: list[FactLine], evidence: list[Evidence]) -> str | None:
    """The answer from a key fact ("Your account id is ACC-7731 (from the key facts)."), or None (docs/memory.md §6):
    the fact covering most of ``wanted``, then with the fewest unasked slot words, then the first; a newer message
    contradicting it wins unless it is pinned or current; a date or amount question gets only that kind."""
    best: tuple[tuple[int, int, int], FactLine, set[str]] | None = None
    for position, fact in enumerate(facts):
        own, slot = _slot_words(fact.key)
        covered = wanted & (slot | content_words(fact.text))
        if len(covered) < words_needed(wanted) or not covered & slot:
            continue
        rank = (len(covered), -len(own - wanted), -position)
        if best is None or rank > best[0]:
            best = (rank, fact, covered)
    if best is None:
        return None
    _, fact, covered = best
    asked = _kind_of(question, _ASKED_KINDS)
    if asked is not None and _kind_of(fact.key, _SLOT_KINDS) not in (None, asked):
        return _said_together(asked, fact, facts, evidence)
    phrase = _question_phrase(question, covered)
    if not fact.pinned and not fact.replaces and _contradicted(phrase, fact, evidence):
        return None
    if fact.text:
        return f"From {_FACTS_NAME}: {fact.text.rstrip('.')} ({fact.values[0]})."
    phrase = phrase or fact.key.replace("_", " ")
    if len(fact.values) > 1:
        values = ", ".join(fact.values[:-1]) + " and " + fact.values[-1]
        return f"Your {phrase}: {values} (from {_FACTS_NAME}, newest first)."
    verb = "are" if _PLURAL_RE.search(phrase) else "is"
    replaces = f"; it replaces {fact.replaces}" if fact.replaces else ""
    return f"Your {phrase} {verb} {fact.values[0]} (from {_FACTS_NAME}{replaces})."


def _kind_of(text: str, kinds: tuple[tuple[re.Pattern[str], str], ...]) -> str | None:
    """The kind (``date``, ``amount``) of the first of ``kinds`` whose pattern ``text`` matches."""
    return next((kind for pattern, kind in kinds if pattern.search(text)), None)


def _said_together(asked: str, matched: FactLine, facts: list[FactLine], evidence: list[Evidence]) -> str | None:
    """The fact of kind ``asked`` that the user's latest sentence holding ``matched`` also holds ("I paid 75
    dollars on 3 April 2026." for "When did I pay?"), or None: the block's lines do not pair values."""
    candidates = [fact for fact in facts if _kind_of(fact.key, _SLOT_KINDS) == asked]
    for item in reversed(evidence):
        sentence = item.sentences[0].casefold()
        if item.source == "kb" or not any(value.casefold() in sentence for value in matched.values):
            continue
        for fact in candidates:
            for value in fact.values:
                if value.casefold() in sentence:
                    other = next(value for value in matched.values if value.casefold() in sentence)
                    slot = fact.key.replace("_", " ")
                    return f"Your {slot} is {value} (from {_FACTS_NAME}; said together with {other})."
    return None


def _question_phrase(question: str, covered: set[str]) -> str:
    """The words after "my" in ``question`` that all match the slot ("account id"), else ``""``."""
    match = _MY_PHRASE_RE.search(question)
    if match is None:
        return ""
    words: list[str] = []
    for word in match.group(1).split():
        stems = content_words(word)
        if not stems or not stems <= covered:
            break
        words.append(word)
    return " ".join(words)


def _contradicted(phrase: str, fact: FactLine, evidence: list[Evidence]) -> bool:
    """Whether a retained user message says "my <phrase>" without the fact's value (it is newer than the block)."""
    if not phrase:
        return False
    said = f"my {phrase}".casefold()
    return any(
        item.source == "conversation"
        and said in " ".join(item.sentences[0].split()).casefold()
        and not any(value.casefold() in item.sentences[0].casefold() for value in fact.values)
        for item in evidence
    )
