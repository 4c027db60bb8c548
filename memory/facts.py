"""Key facts: extraction, validation and the key-facts block (docs/memory.md §11).

A **key fact** is one value worth pinning (an identifier, an amount, a date, an email, a phone
number, a URL, an address, a name, a preference or a commitment), copied **verbatim** from the
message it came from, with that message's id as provenance. Facts never pass through the summary:
once their message is folded into it, they are pinned in the key-facts block right after the
system prompt, so no summary (LLM, extractive or raw archive) can lose them.

Three extractors feed the same rows:

- ``rule`` (:func:`rule_facts`): regular expressions over user text and tool-call arguments,
  synchronous at store time (microseconds), so the block is never behind the conversation;
- ``llm:<model>`` (:func:`extraction_prompt`, :func:`parse_extraction`,
  :func:`validate_extraction`): one request per memory job through the summarizer's degradation
  chain; every fact must be **grounded** (its value occurs in a message it cites) and supersession
  stays within one slot and never retires a fact the user pinned;
- ``user``: a value the owner edited in the inspector.

This module is pure: no ORM, no I/O. :mod:`memory.services` stores the facts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from memory.tokens import TokenCounter

# An OpenAI Chat Completions message dict (the same shape as memory.core.Message).
Message = dict[str, Any]

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

FACTS_HEADER = "[Key facts of this conversation, verbatim]"
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


# ----------------------------------------------------------------------------------------------
# Rule extraction (store time)
# ----------------------------------------------------------------------------------------------

_MONTHS = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|Jun(?:e)?|Jul(?:y)?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_CURRENCY_WORDS = r"(?:USD|EUR|GBP|JPY|CNY|RMB|dollars?|euros?|pounds?|yuan|yen|bucks)"
# Times of day ("11am", "3:30 pm", "15:00"): kind date, slot ``time``.
# A time that ends in its own period ("10 a.m."): the period is the value's, not the sentence's.
_TIME_PERIOD_END = re.compile(r"(?<![A-Za-z])[ap]\.m\.$", re.IGNORECASE)


def _trimmed(value: str) -> str:
    """``value`` without the sentence punctuation a pattern caught at its end (``.,;:!?)``),
    except the period of "a.m."/"p.m."."""
    while value and value[-1] in ".,;:!?)":
        if value[-1] == "." and _TIME_PERIOD_END.search(value):
            break
        value = value[:-1]
    return value


_TIME = re.compile(r"\b\d{1,2}(?::\d{2})?\s?(?:am|pm|a\.m\.|p\.m\.)(?![A-Za-z])|\b\d{1,2}:\d{2}\b", re.IGNORECASE)
# Patterns in priority order: a span taken by an earlier kind is not matched again by a later one.
_PATTERNS: tuple[tuple[FactKind | Literal["secret"], re.Pattern[str]], ...] = (
    ("url", re.compile(r"https?://[^\s<>\"'()\[\]{}，。！？、]+", re.IGNORECASE)),
    ("email", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")),
    # Never pinned: whole card numbers (13-19 digits) and US social security numbers.
    ("secret", re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])|(?<![\d-])\d{3}-\d{2}-\d{4}(?![\d-])")),
    (
        "date",
        re.compile(
            r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?"
            r"|\d{4}年\d{1,2}月\d{1,2}[日号]?|\d{1,2}月\d{1,2}[日号]"
            rf"|\b{_MONTHS}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b"
            rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTHS}\b(?:,?\s+\d{{4}})?"
            r"|\b\d{1,2}/\d{1,2}/\d{2,4}\b",
            re.IGNORECASE,
        ),
    ),
    ("date", _TIME),
    (
        "money",
        re.compile(
            r"[$€£¥]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:k|K|million|billion))?"
            rf"|\b(?:USD|EUR|GBP|CNY|RMB|JPY)\s?\d[\d,]*(?:\.\d+)?"
            rf"|\d(?:[\d.,]*\d)?\s?(?:{_CURRENCY_WORDS}\b|[元円块€£]|美元|欧元|日元|人民币)",
            re.IGNORECASE,
        ),
    ),
    # A Chinese mobile number: 11 digits starting 13-19.
    ("phone", re.compile(r"(?<!\d)1[3-9]\d{9}(?!\d)")),
    # International numbers with their groups ("+44 7700 900123", "0044 20 7946 0958", "+49 30
    # 12345678") and national ones with a trunk 0 ("07700 900123", "020 7946 0958").
    ("phone", re.compile(r"(?<![\w/+])(?:\+|00)\d{1,3}(?:[\s.-]?(?:\(\d{1,4}\)|\d{2,5})){2,4}(?![\w/])")),
    ("phone", re.compile(r"(?<![\w/.,-])0\d{2,4}[\s.-]?\d{3,4}[\s.-]?\d{3,4}(?![\w/])")),
    (
        "phone",
        re.compile(r"(?<![\w/])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)\s?|\d{2,4}[\s.-])\d{3,4}[\s.-]\d{3,4}(?![\w/])"),
    ),
    ("id", re.compile(r"(?:card|visa|mastercard|amex|ending(?:\s+in)?)\D{0,16}?\b(\d{4})\b", re.IGNORECASE)),
    ("id", re.compile(r"\b(\d{4})\s+(?:credit\s+|debit\s+|gift\s+)?card\b", re.IGNORECASE)),
    # Mixed letter-digit identifiers of 5 or more characters, with # - _ . / inside; ASCII only,
    # so an identifier glued to CJK text (订单号是A-48213) is still cut at the right place.
    ("id", re.compile(r"(?<![A-Za-z0-9_#-])#?[A-Za-z0-9][A-Za-z0-9_\-./]*[A-Za-z0-9](?![A-Za-z0-9_])")),
)
# Words that mark the value after them as a secret (in the same clause, shortly before it).
_SECRET_WORDS = re.compile(
    r"\b(?:password|passcode|passwd|pin(?: code)?|ssn|social security|cvv|cvc|security code|secret|token|api key)\b"
    r"|密码|口令",
    re.IGNORECASE,
)
_SECRET_CLAUSE = re.compile(r"[,.;!?\n，。；！？、]")
_HAS_DIGIT = re.compile(r"\d")
_HAS_LETTER = re.compile(r"[A-Za-z]")
# Words before a value that name its slot; the first that occurs in the preceding clause wins.
_SLOT_WORDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\border|订单", re.IGNORECASE), "order_id"),
    (re.compile(r"\b(?:reservation|booking|confirmation)|预订|预约", re.IGNORECASE), "reservation_id"),
    (re.compile(r"\b(?:user ?(?:id|name)|username|account|login)|用户", re.IGNORECASE), "user_id"),
    (re.compile(r"\b(?:zip|postal|post ?code)|邮编", re.IGNORECASE), "zip_code"),
    (re.compile(r"\btracking\b|快递|运单", re.IGNORECASE), "tracking_id"),
    (re.compile(r"\bflight\b|航班", re.IGNORECASE), "flight_number"),
    (re.compile(r"\b(?:card|visa|mastercard|amex|payment)|卡", re.IGNORECASE), "payment_card"),
    (re.compile(r"\b(?:ticket|case|issue)\b|工单", re.IGNORECASE), "ticket_id"),
    (re.compile(r"\b(?:item|product|sku)\b|商品", re.IGNORECASE), "item_id"),
    (re.compile(r"\b(?:invoice|receipt)\b|发票", re.IGNORECASE), "invoice_id"),
)
_CLAUSE_BREAK = re.compile(r"[.;!?\n。；！？]")
# How far back (characters) a value's slot word is looked for.
SLOT_WINDOW_CHARS = 48
_SNAKE = re.compile(r"[^0-9a-z]+")


def rule_facts(text: str, *, message_id: int) -> list[FactCandidate]:
    """The key facts regular expressions find in a user's ``text`` (docs/memory.md §11).

    Emails, URLs, amounts (``$``, ``€``, ``£``, ``¥``, currency words and codes, 元/円), ISO,
    textual and CJK dates, times of day ("11am", "15:00", slot ``time``), phone numbers, card
    tails ("card ending in 4421", "my 7447 card") and mixed letter-digit identifiers of at least 5 characters (``mia_li_3668``, ``ZFA04Y``, ``#W2378156``,
    ``KX-55190``, ``A-48213`` inside CJK text) or digit runs of at least 5. Secrets are never
    reported: whole card numbers, social security numbers, and any value shortly after
    "password", "PIN", "CVV", "token", "密码" and the like in the same clause. The slot is named
    from a word shortly before the value ("order" → ``order_id``), else after its kind. Each value
    is reported once, in order of appearance. Never raises.
    """
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, FactCandidate]] = []
    seen: set[tuple[str, str]] = set()
    for kind, pattern in _PATTERNS:
        for match in pattern.finditer(text):
            group = 1 if match.re.groups else 0
            start, end = match.span(group)
            value = _trimmed(match.group(group))
            end = start + len(value)
            if not value or any(start < t_end and t_start < end for t_start, t_end in taken):
                continue
            if kind == "secret" or _SECRET_WORDS.search(_SECRET_CLAUSE.split(text[max(0, start - 32) : start])[-1]):
                # Never pinned: credentials and whole card or social security numbers.
                taken.append((match.start(), max(end, match.end(group))))
                continue
            if kind == "id" and group == 0 and not _is_identifier(value):
                continue
            # A card tail (the only capturing pattern) names its slot itself.
            key = "payment_card" if group else _slot(text[:start], kind)
            if kind == "date" and _TIME.fullmatch(value):
                key = "time"
            if (key, value) in seen:
                continue
            seen.add((key, value))
            taken.append((match.start(), max(end, match.end(group))))
            found.append(
                (
                    start,
                    FactCandidate(
                        kind=kind,
                        key=key,
                        value=value,
                        text=f"user gave {key.replace('_', ' ')} {value}",
                        source_message_id=message_id,
                        excerpt=excerpt_around(text, start, end),
                    ),
                )
            )
    return [candidate for _, candidate in sorted(found, key=lambda item: item[0])]


def value_spans(text: str) -> list[tuple[int, int, str]]:
    """Where rule extraction sees a value in ``text``: ``(start, end, kind)`` character offsets,
    ordered by ``start``, never overlapping. The same patterns, in the same priority, as
    :func:`rule_facts` (docs/memory.md §11), for removing values from a text rather than
    pinning them (e.g. a chat's title made from its first message).

    ``kind`` is one of :data:`FACT_KINDS` (``url``, ``email``, ``date``, ``money``, ``phone``,
    ``id``) or ``"secret"``: a whole card or social security number, a value shortly after a
    secret word ("password", "PIN", "CVV", "token", "密码" …), and the rest of that word's clause
    (a password without digits matches no value pattern). A card tail ("card ending in 4421")
    spans its four digits. Never raises.
    """
    spans: list[tuple[int, int, str]] = []

    def free(start: int, end: int) -> bool:
        return end > start and not any(start < s_end and s_start < end for s_start, s_end, _ in spans)

    for kind, pattern in _PATTERNS:
        for match in pattern.finditer(text):
            group = 1 if match.re.groups else 0
            start = match.start(group)
            end = start + len(_trimmed(match.group(group)))
            if not free(start, end) or (kind == "id" and group == 0 and not _is_identifier(text[start:end])):
                continue
            clause = _SECRET_CLAUSE.split(text[max(0, start - 32) : start])[-1]
            secret = kind == "secret" or _SECRET_WORDS.search(clause)
            spans.append((start, end, "secret" if secret else kind))
    for word in _SECRET_WORDS.finditer(text):
        clause_end = _SECRET_CLAUSE.search(text, word.end())
        start, end = word.end(), clause_end.start() if clause_end else len(text)
        while start < end and text[start].isspace():
            start += 1
        overlapping = [span for span in spans if start < span[1] and span[0] < end]
        spans = [span for span in spans if span not in overlapping]
        start = min([start, *(span[0] for span in overlapping)])
        end = max([end, *(span[1] for span in overlapping)])
        if end > start:
            spans.append((start, end, "secret"))
    return sorted(spans)


def _is_identifier(value: str) -> bool:
    """A mixed letter-digit token of 5+ characters, or a digit run of 5+ digits."""
    core = value.lstrip("#")
    if len(core) < 5 or not _HAS_DIGIT.search(core):
        return False
    if not _HAS_LETTER.search(core):
        return sum(ch.isdigit() for ch in core) >= 5 and not re.fullmatch(r"\d+\.\d+", core)
    return True


def _slot(before: str, kind: FactKind) -> str:
    """The slot of a value: for an identifier, from a word shortly before it in the same clause
    ("order" → ``order_id``), else ``identifier``; for the other kinds, the kind (``amount`` for
    money)."""
    if kind == "id":
        clause = _CLAUSE_BREAK.split(before[-SLOT_WINDOW_CHARS:])[-1]
        best: tuple[int, str] | None = None
        for pattern, slot in _SLOT_WORDS:
            for match in pattern.finditer(clause):
                if best is None or match.start() > best[0]:
                    best = (match.start(), slot)
        return best[1] if best is not None else "identifier"
    return "amount" if kind == "money" else kind


def excerpt_around(text: str, start: int, end: int, *, chars: int = EXCERPT_CHARS) -> str:
    """Up to ``chars`` characters of ``text`` around ``text[start:end]``, on one line, with
    ``…`` where it was cut."""
    room = max(0, chars - (end - start)) // 2
    left, right = max(0, start - room), min(len(text), end + room)
    piece = " ".join(text[left:right].split())
    return f"{'…' if left else ''}{piece}{'…' if right < len(text) else ''}"


def tool_call_facts(tool_calls: Sequence[dict[str, Any]], *, message_id: int) -> list[FactCandidate]:
    """The key facts in the arguments of an assistant message's ``tool_calls``: every string or
    number leaf that is an identifier, amount, date, email, phone number or URL by
    :func:`rule_facts`, or a number under an amount-like argument name (``amount``, ``price``,
    ``refund``, ``cost``, ``fee``, ``balance``). The slot is the argument's name (``user_id``,
    ``payment_id``, ``flight_number``); ``text`` names the tool. Unparsable arguments are read
    as text. Never raises."""
    found: list[FactCandidate] = []
    seen: set[tuple[str, str]] = set()
    for call in tool_calls:
        function = call.get("function") or {}
        name = str(function.get("name") or "tool")
        raw = function.get("arguments")
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            arguments = raw
        for path, leaf in _leaves(arguments, ()):
            arg = path[-1] if path else "arguments"
            for candidate in _leaf_facts(leaf, arg=arg, tool=name, message_id=message_id):
                if (candidate.key, candidate.value) not in seen:
                    seen.add((candidate.key, candidate.value))
                    found.append(candidate)
    return found


_AMOUNT_ARGS = re.compile(r"amount|price|refund|cost|fee|balance|total_paid|paid", re.IGNORECASE)


def _leaves(value: Any, path: tuple[str, ...]) -> Iterable[tuple[tuple[str, ...], Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, str(key)))
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item, path)
    elif value is not None and not isinstance(value, bool):
        yield path, value


def _leaf_facts(leaf: Any, *, arg: str, tool: str, message_id: int) -> list[FactCandidate]:
    key = _SNAKE.sub("_", arg.lower()).strip("_")[:MAX_KEY_CHARS] or "argument"
    text = str(leaf)
    if isinstance(leaf, int | float):
        if _AMOUNT_ARGS.search(arg):
            return [_tool_fact("money", key, text, tool, message_id, f"{arg}={text}")]
        if len(text) >= 5 and text.isdigit():
            return [_tool_fact("id", key, text, tool, message_id, f"{arg}={text}")]
        return []
    if len(text) > MAX_VALUE_CHARS:
        return [
            replace(candidate, key=key if candidate.key in ("identifier", "amount", candidate.kind) else candidate.key)
            for candidate in rule_facts(text, message_id=message_id)
        ]
    whole = [candidate for candidate in rule_facts(text, message_id=message_id) if candidate.value == text.strip()]
    if whole:
        return [_tool_fact(whole[0].kind, key, whole[0].value, tool, message_id, f"{arg}={text}")]
    if _AMOUNT_ARGS.search(arg) and re.fullmatch(r"\d[\d,]*(?:\.\d+)?", text.strip()):
        return [_tool_fact("money", key, text.strip(), tool, message_id, f"{arg}={text}")]
    parts = rule_facts(text, message_id=message_id)
    return [_tool_fact(part.kind, key, part.value, tool, message_id, f"{arg}={text}") for part in parts]


def _tool_fact(kind: FactKind, key: str, value: str, tool: str, message_id: int, excerpt: str) -> FactCandidate:
    return FactCandidate(
        kind=kind,
        key=key,
        value=value,
        text=f"{tool} was called with {key} {value}",
        source_message_id=message_id,
        excerpt=excerpt[:EXCERPT_CHARS],
    )


def message_rule_facts(message: Message) -> list[FactCandidate]:
    """The rule facts of one stored message (it must carry its ``id``): a user message's text
    and an assistant message's tool-call arguments. Assistant text and tool results are not
    read (mostly listings and suggestions, docs/memory.md F-30). Never raises."""
    message_id = message.get("id")
    if not isinstance(message_id, int):
        return []
    role = message.get("role")
    if role == "user":
        content = message.get("content")
        return rule_facts(content if isinstance(content, str) else _text(content), message_id=message_id)
    if role == "assistant" and message.get("tool_calls"):
        return tool_call_facts(message["tool_calls"], message_id=message_id)
    return []


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


# ----------------------------------------------------------------------------------------------
# The key-facts block (request time)
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# LLM extraction (memory job)
# ----------------------------------------------------------------------------------------------

EXTRACTION_SCHEMA_NAME = "key_facts"
EXTRACTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["facts"],
    "properties": {
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["kind", "key", "value", "text", "source", "supersedes"],
                "properties": {
                    "kind": {"type": "string", "enum": list(FACT_KINDS)},
                    "key": {"type": "string"},
                    "value": {"type": "string"},
                    "text": {"type": "string"},
                    "source": {"type": "array", "items": {"type": "integer"}},
                    "supersedes": {"type": "array", "items": {"type": "integer"}},
                },
            },
        }
    },
}
EXTRACTION_INSTRUCTIONS = """You extract key facts from a conversation so that they are never forgotten.
A key fact is a value the USER stated about themselves or their request, or that a tool was called with: identifiers (order, reservation, account, ticket numbers), amounts, dates, emails, phone numbers, URLs, addresses, names, preferences (likes, dislikes, allergies, pets), and commitments (what the assistant promised to do).
Rules:
- Copy "value" VERBATIM from the message it comes from (same spelling, digits and script); never translate, normalize or invent it.
- "source": the numbers of the messages the value occurs in. "text": one short line saying what it is, with absolute dates.
- "key": the slot in lowercase snake_case (e.g. shipping_address, allergy, pet_name, order_id). Use the same key as an existing fact for the same slot.
- When the user corrects or changes an existing fact of the same slot, put that fact's handle in "supersedes".
- Do not extract the assistant's suggestions, options or listings as facts of the user; do not repeat existing facts unchanged.
- Reply with JSON only: {"facts": [{"kind", "key", "value", "text", "source", "supersedes"}]}; {"facts": []} when there is nothing new."""
EXTRACTION_LINE_CHARS = 600
# Marks an extraction request, so a test double or the offline engine can recognise it.
EXTRACTION_MARKER = "<new_messages>"


@dataclass(frozen=True, kw_only=True)
class ExtractionInput:
    """What one LLM extraction request is made of: the ``messages`` since the watermark (with
    ``id`` and, optionally, ``created_at`` as ISO 8601), numbered 1…n in the prompt, and the
    chat's ``facts`` that are active, given small integer handles 1…m."""

    messages: list[Message]
    facts: list[KeyFact]

    def message_by_number(self, number: int) -> Message | None:
        return self.messages[number - 1] if 1 <= number <= len(self.messages) else None

    def fact_by_handle(self, handle: int) -> KeyFact | None:
        return self.facts[handle - 1] if 1 <= handle <= len(self.facts) else None


def extraction_prompt(data: ExtractionInput) -> list[dict[str, Any]]:
    """The wire prompt ``[system instructions, user material]`` of one extraction request: the
    active facts as ``[handle] kind key: value``, then the new messages as numbered lines
    ``N. (date) Role: text`` (tool calls with their arguments, each line at most 600
    characters)."""
    facts = "\n".join(f"[{n}] {fact.kind} {fact.key}: {fact.value}" for n, fact in enumerate(data.facts, 1))
    lines = []
    for number, message in enumerate(data.messages, 1):
        role = str(message.get("role") or "user").capitalize()
        body = _text(message.get("content"))
        calls = message.get("tool_calls") or ()
        if calls:
            body += " " + "; ".join(
                f"{(c.get('function') or {}).get('name', '?')}({(c.get('function') or {}).get('arguments', '')})"
                for c in calls
            )
        when = str(message.get("created_at") or "")[:10]
        line = " ".join(f"{number}. {f'({when}) ' if when else ''}{role}: {body}".split())
        lines.append(line if len(line) <= EXTRACTION_LINE_CHARS else line[: EXTRACTION_LINE_CHARS - 1] + "…")
    material = (
        f"<existing_facts>\n{facts or '(none)'}\n</existing_facts>\n\n"
        f"{EXTRACTION_MARKER}\n" + "\n".join(lines) + "\n</new_messages>\n\nReply with the JSON object now."
    )
    return [{"role": "system", "content": EXTRACTION_INSTRUCTIONS}, {"role": "user", "content": material}]


class ExtractionError(ValueError):
    """An extraction reply that is not a JSON object with a ``facts`` list (docs/memory.md
    F-29): nothing is changed and the watermark stays."""


def parse_extraction(reply: str) -> list[dict[str, Any]]:
    """The ``facts`` list of an extraction reply, tolerant of code fences and prose around the
    JSON object and of a bare list. Raises :class:`ExtractionError` when no JSON object or list
    with facts can be read."""
    text = reply.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1).strip()
    for attempt in (text, _outermost(text, "{", "}"), _outermost(text, "[", "]")):
        if not attempt:
            continue
        try:
            data = json.loads(attempt)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("facts"), list):
            return [item for item in data["facts"] if isinstance(item, dict)]
        if isinstance(data, list):
            return [item for item in data if isinstance(item, dict)]
    raise ExtractionError(f"not a JSON object with a facts list: {reply.strip()[:120]!r}")


def _outermost(text: str, opening: str, closing: str) -> str:
    start, end = text.find(opening), text.rfind(closing)
    return text[start : end + 1] if 0 <= start < end else ""


@dataclass(frozen=True, kw_only=True)
class Validation:
    """The outcome of :func:`validate_extraction`: ``accepted`` candidates (with ``supersedes``
    already checked) and ``rejected`` items with the reason, for the job's record."""

    accepted: list[FactCandidate]
    rejected: list[dict[str, Any]]


def validate_extraction(items: list[dict[str, Any]], data: ExtractionInput, *, extractor: str) -> Validation:
    """Code-side validation of an extraction reply (docs/memory.md F-28, F-30).

        Each item needs a known ``kind``, a ``key`` and a non-empty ``value`` of at most 200
        characters. **Grounding**: the value must occur (case-insensitively, spacing normalised) in a
        cited message, and that message must be the user's or an assistant message with tool calls
        whose arguments hold it; assistant prose and tool results ground nothing, so the assistant's
        suggestions are never stored as facts the user stated. ``supersedes`` keeps only handles of
        active facts of the **same slot** that the user did not pin. The source is the first
        grounding message. Items restating the value of an active fact (in any slot: a rule fact may
    already hold it) are dropped.
    """
    accepted: list[FactCandidate] = []
    rejected: list[dict[str, Any]] = []
    current = {_norm(fact.value) for fact in data.facts}
    for item in items:
        kind = str(item.get("kind") or "other").lower()
        key = _SNAKE.sub("_", str(item.get("key") or "").lower()).strip("_")[:MAX_KEY_CHARS]
        value = " ".join(str(item.get("value") or "").split())
        if kind not in FACT_KINDS:
            kind = "other"
        if not key or not value or len(value) > MAX_VALUE_CHARS:
            rejected.append({"item": item, "reason": "missing or oversized key or value"})
            continue
        sources = [n for n in _ints(item.get("source")) if data.message_by_number(n) is not None]
        grounding = next((n for n in sources if _grounds(data.message_by_number(n), value)), None)
        if grounding is None:
            rejected.append({"item": item, "reason": "value does not occur in a cited user message or tool call"})
            continue
        if _norm(value) in current:
            continue
        message = data.message_by_number(grounding)
        assert message is not None
        supersedes = []
        for handle in _ints(item.get("supersedes")):
            old = data.fact_by_handle(handle)
            if old is None or old.key != key or old.pinned_by_user or not old.active:
                rejected.append({"item": item, "reason": f"supersedes handle {handle}: not an active fact of {key}"})
                continue
            supersedes.append(old.id)
        source_text = _grounding_text(message)
        at = _norm(source_text).find(_norm(value))
        accepted.append(
            FactCandidate(
                kind=kind,  # type: ignore[arg-type]  # checked against FACT_KINDS above
                key=key,
                value=_verbatim(source_text, value),
                text=" ".join(str(item.get("text") or value).split())[:MAX_TEXT_CHARS],
                source_message_id=int(message["id"]),
                excerpt=excerpt_around(" ".join(source_text.split()), max(at, 0), max(at, 0) + len(value)),
                extractor=extractor,
                supersedes=tuple(supersedes),
            )
        )
        current.add(_norm(value))
    return Validation(accepted=accepted, rejected=rejected)


def _ints(value: Any) -> list[int]:
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        try:
            out.append(int(item))
        except (TypeError, ValueError):
            continue
    return out


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def _grounding_text(message: Message) -> str:
    """The text a fact of ``message`` may be grounded in: a user's words, or an assistant's
    tool-call arguments (never its prose nor a tool's result)."""
    if message.get("role") == "user":
        return _text(message.get("content"))
    if message.get("role") == "assistant" and message.get("tool_calls"):
        return " ".join(str((call.get("function") or {}).get("arguments") or "") for call in message["tool_calls"])
    return ""


def _grounds(message: Message | None, value: str) -> bool:
    return message is not None and _norm(value) in _norm(_grounding_text(message))


def _verbatim(source: str, value: str) -> str:
    """``value`` as spelled in ``source`` (the model may have changed its case or spacing)."""
    flat = " ".join(source.split())
    at = flat.casefold().find(" ".join(value.split()).casefold())
    return flat[at : at + len(" ".join(value.split()))] if at >= 0 else value
