"""Fact operations (docs/memory.md §11, F-46 to F-48): whether a new value adds, supersedes, corrects or retracts,
decided on slot, polarity and value from the cue words of its sentence. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

from memory.facts.cues import StatementCues
from memory.facts.cues import statement_cues as _statement_cues
from memory.facts.values import FactCandidate, KeyFact, Operation, Polarity
from memory.text.sentences import SENTENCE_END_RE

# A sentence that gives a slot a new value without correcting a mistake ("my number is now …", "die neue …").
UPDATE_CUE = re.compile(
    r"\b(?:is|are|['’]s) now\b|\bnow (?:is|are)\b|\bnew\b|\bchanged\b|\bswitched\b"
    r"|现在的|新的|新号|换了|\bneuen?\b|\bneue[rs]?\b|\bnouvel(?:le)?\b|\bnuev[oa]\b",
    re.IGNORECASE,
)
_NEGATIVE_KEY = re.compile(r"dislike|hate|avoid|no_longer|not_|former", re.IGNORECASE)
# Keys a rule gives a value it found no slot word for: any slot of the kind may be the one corrected.
GENERIC_KEYS = frozenset({"identifier", "amount", "date", "time", "email", "phone", "url"})
_WORD = re.compile(r"[^\W\d_]{3,}", re.UNICODE)
_SLOT_STOP = frozenset(
    (
        *("the", "and", "but", "for", "you", "your", "our", "his", "her", "its", "that", "this", "was", "were"),
        *("are", "have", "has", "had", "not", "any", "more", "with", "from", "number", "one", "ones", "called"),
        *("named", "also", "please", "use", "used", "can", "could", "call", "text", "add"),
    )
)
_CLAUSE_BEFORE = re.compile(r"[,;:.!?()\n，。；！？]|\b(?:and|or|but)\b", re.IGNORECASE)


@lru_cache(maxsize=4096)
def statement_cues(sentence: str) -> StatementCues:
    """:func:`memory.facts.cues.statement_cues`, cached: a message's values share their sentences."""
    return _statement_cues(sentence)


def polarity_of(key: str) -> Polarity:
    """``negative`` for a slot that holds what the user does not like, have or do (``dislikes``)."""
    return "negative" if _NEGATIVE_KEY.search(key) else "positive"


def _norm(value: str) -> str:
    return " ".join(value.split()).casefold()


def same_topic(a: str, b: str) -> bool:
    """Equal values, or one is the other's leading words ("running" and "running along the river")."""
    a, b = _norm(a), _norm(b)
    short, long = sorted((a, b), key=len)
    return bool(short) and (short == long or long.startswith(short + " "))


def turns_around(candidate: FactCandidate, fact: KeyFact) -> bool:
    """A preference of the other polarity on the same topic: the candidate supersedes ``fact`` (F-47)."""
    return (
        candidate.kind == "preference"
        and fact.kind == "preference"
        and candidate.polarity != fact.polarity
        and same_topic(candidate.value, fact.value)
    )


@lru_cache(maxsize=256)
def sentences(text: str) -> tuple[tuple[int, int], ...]:
    spans, start = [], 0
    for match in SENTENCE_END_RE.finditer(text):
        spans.append((start, match.end()))
        start = match.end()
    spans.append((start, len(text)))
    return tuple((s, e) for s, e in spans if text[s:e].strip())


def value_operation(text: str, start: int) -> Operation:
    """The operation of a value at ``text[start]`` from its sentence's cues: ``correct``, ``retract``
    (withdrawn), ``supersede`` (an update cue), else ``add``."""
    for s, e in sentences(text):
        if s <= start < e:
            sentence = text[s:e]
            cues = statement_cues(sentence)
            if cues.corrects:
                return "correct"
            if cues.withdrawn:
                return "retract"
            return "supersede" if UPDATE_CUE.search(sentence) and not cues.uncertain else "add"
    return "add"


def withdrawal_sentences(text: str) -> list[str]:
    found = []
    for s, e in sentences(text):
        cues = statement_cues(text[s:e])
        if cues.withdrawn and not cues.corrects:
            found.append(text[s:e])
    return found


def slot_words(fact: KeyFact) -> set[str]:
    """Words naming ``fact``'s slot: those before its value in its excerpt's clause ("office phone is 020 …")."""
    excerpt = fact.excerpt
    at = excerpt.find(fact.value)
    if at < 0:
        return set()
    before = _CLAUSE_BEFORE.split(excerpt[:at])[-1]
    words = [word.casefold() for word in _WORD.findall(before)][-4:]
    return {word for word in words if word not in _SLOT_STOP}


def withdrawn(text: str, facts: Iterable[KeyFact]) -> list[KeyFact]:
    """The active, unpinned ``facts`` a withdrawal sentence of ``text`` names, by value or by a slot word no other
    value of the slot shares ("forget my old work email"), in ``facts`` order (F-46)."""
    said = withdrawal_sentences(text)
    if not said:
        return []
    live = [fact for fact in facts if fact.active]
    found = []
    for fact in live:
        if fact.pinned_by_user:
            continue
        shared = {word for other in live if other.key == fact.key and other.id != fact.id for word in slot_words(other)}
        distinct = slot_words(fact) - shared
        for sentence in said:
            words = {word.casefold() for word in _WORD.findall(sentence)}
            if _norm(fact.value) in _norm(sentence) or distinct & words:
                found.append(fact)
                break
    return found


def corrected(candidate: FactCandidate, facts: Sequence[KeyFact]) -> KeyFact | None:
    """The active, unpinned fact a superseding rule value replaces: its slot's newest other value, else for a
    generic slot ("identifier") its kind's (F-48)."""
    others = [
        fact
        for fact in facts
        if fact.active and not fact.pinned_by_user and _norm(fact.value) != _norm(candidate.value)
    ]
    matching = [fact for fact in others if fact.key == candidate.key]
    if not matching and (candidate.key in GENERIC_KEYS or candidate.key == candidate.kind):
        matching = [fact for fact in others if fact.kind == candidate.kind]
    return max(matching, key=lambda fact: (fact.source_message_id or 0, fact.id), default=None)
