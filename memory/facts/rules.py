"""Rule extraction of key facts (docs/memory.md §11): values regular expressions find in a user's text and in
tool-call arguments, with their slot. Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal

from memory.facts.operations import value_operation
from memory.facts.values import EXCERPT_CHARS, MAX_KEY_CHARS, MAX_VALUE_CHARS, FactCandidate, FactKind, Operation
from memory.messages import Message, created_at
from memory.text.dates import ResolvedDate, resolve_relative
from memory.text.provenance import ProvenanceSpan, repetitive_values, text_spans
from memory.text.secrets import MARKERS, SecretSpan, redact_values, secret_spans, secret_values

_MONTHS = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|Jun(?:e)?|Jul(?:y)?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)


_CURRENCY_WORDS = r"(?:USD|EUR|GBP|JPY|CNY|RMB|dollars?|euros?|pounds?|yuan|yen|bucks)"


# A time ending in its own period ("10 a.m."): the period is the value's, not the sentence's.
_TIME_PERIOD_END = re.compile(r"(?<![A-Za-z])[ap]\.m\.$", re.IGNORECASE)


def _trimmed(value: str) -> str:
    """``value`` without the sentence punctuation caught at its end, but with the period of "a.m."."""
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
    # International numbers with their groups ("+44 7700 900123") and national ones with a trunk 0 ("020 7946 0958").
    ("phone", re.compile(r"(?<![\w/+])(?:\+|00)\d{1,3}(?:[\s.-]?(?:\(\d{1,4}\)|\d{2,5})){2,4}(?![\w/])")),
    ("phone", re.compile(r"(?<![\w/.,-])0\d{2,4}[\s.-]?\d{3,4}[\s.-]?\d{3,4}(?![\w/])")),
    (
        "phone",
        re.compile(r"(?<![\w/])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)\s?|\d{2,4}[\s.-])\d{3,4}[\s.-]\d{3,4}(?![\w/])"),
    ),
    ("id", re.compile(r"(?:card|visa|mastercard|amex|ending(?:\s+in)?)\D{0,16}?\b(\d{4})\b", re.IGNORECASE)),
    ("id", re.compile(r"\b(\d{4})\s+(?:credit\s+|debit\s+|gift\s+)?card\b", re.IGNORECASE)),
    # A flight number with its airline's code apart ("UA 882"); glued ones are identifiers below.
    ("id", re.compile(r"(?<![\w-])(?!(?:ID|NO|PO|OK|AM|PM|TV|UK|US|EU)\s)[A-Z]{2}\s\d{2,4}(?![\w-])")),
    # Mixed letter-digit identifiers of 5+ characters; ASCII only, so one glued to CJK text (订单号是A-48213) is cut right.
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


def rule_facts(
    text: str, *, message_id: int, operations: bool = False, at: datetime | None = None
) -> list[FactCandidate]:
    """The key facts regular expressions find in a user's ``text`` (docs/memory.md §11), each once, in order of
    appearance. Secrets are never reported: whole card and social security numbers, values shortly after "password",
    "PIN", "密码" and the like. The slot comes from a word shortly before the value ("order" → ``order_id``), else
    the kind. With ``operations`` (a user's message), a value's operation comes from its sentence's cues (F-46, F-48);
    one in quoted or pasted text is only ``mentioned``, and a burst of one shape keeps its first values (F-49, F-50).
    With ``at`` (the message's aware time), relative dates are stored resolved, their words kept (F-52). Never raises."""
    # Credentials (F-51) are taken first: no value inside one is reported, no excerpt shows one.
    secrets = secret_spans(text)
    taken: list[tuple[int, int]] = [(span.start, span.end) for span in secrets]
    spans = text_spans(text) if operations else []
    found: list[tuple[int, FactCandidate]] = []
    seen: set[tuple[str, str]] = set()
    for resolved in _relative_dates(text, at):
        if any(resolved.start < t_end and t_start < resolved.end for t_start, t_end in taken):
            continue
        taken.append((resolved.start, resolved.end))
        seen.add(("date", resolved.value))
        operation, provenance = _said(text, resolved.start, spans)
        found.append(
            (
                resolved.start,
                FactCandidate(
                    kind="date",
                    key="date",
                    value=resolved.value,
                    text=f"{_rule_text('date', resolved.value, provenance)} (“{resolved.words}”, said on {at:%Y-%m-%d})",
                    source_message_id=message_id,
                    excerpt=excerpt_around(text, resolved.start, resolved.end, secrets=secrets),
                    operation=operation,
                    provenance=provenance,
                ),
            )
        )
    for kind, pattern in _PATTERNS:
        for match in pattern.finditer(text):
            group = 1 if match.re.groups else 0
            start, end = match.span(group)
            value = _trimmed(match.group(group))
            end = start + len(value)
            if not value or any(start < t_end and t_start < end for t_start, t_end in taken):
                continue
            if kind == "secret" or _SECRET_WORDS.search(_SECRET_CLAUSE.split(text[max(0, start - 32) : start])[-1]):
                taken.append((match.start(), max(end, match.end(group))))
                continue
            if kind == "id" and group == 0 and not _is_identifier(value):
                continue
            # A card tail (the only capturing pattern) names its slot itself.
            key = "payment_card" if group else _slot(text[:start], kind)
            if kind == "id" and " " in value:
                key = "flight_number"
            if kind == "date" and _TIME.fullmatch(value):
                key = "time"
            if (key, value) in seen:
                continue
            seen.add((key, value))
            taken.append((match.start(), max(end, match.end(group))))
            operation, provenance = _said(text, start, spans)
            found.append(
                (
                    start,
                    FactCandidate(
                        kind=kind,
                        key=key,
                        value=value,
                        text=_rule_text(key, value, provenance),
                        source_message_id=message_id,
                        excerpt=excerpt_around(text, start, end, secrets=secrets),
                        operation=operation,
                        provenance=provenance,
                    ),
                )
            )
    ordered = [candidate for _, candidate in sorted(found, key=lambda item: item[0])]
    return _capped(ordered) if operations else ordered


def _relative_dates(text: str, at: datetime | None) -> list[ResolvedDate]:
    """The relative dates of ``text`` resolved against ``at``; none without an aware ``at``."""
    if at is None or at.tzinfo is None:
        return []
    return resolve_relative(text, at)


# Values a burst of one shape keeps (F-50): enough to show what it was, never enough to crowd the block.
BURST_KEPT = 2


def _said(text: str, start: int, spans: list[ProvenanceSpan]) -> tuple[Operation, str]:
    """A user's value's ``operation`` and ``provenance``: quoted or pasted text neither corrects nor withdraws."""
    kind = next((span.kind for span in spans if span.start <= start < span.end), "own")
    if not spans:
        return "add", "user"
    return (value_operation(text, start), "user") if kind == "own" else ("add", "mentioned")


def _rule_text(key: str, value: str, provenance: str) -> str:
    """A rule fact's text: who stated the value, so a quoted or pasted one never reads as the user's (F-49)."""
    who = "user gave" if provenance == "user" else "mentioned"
    return f"{who} {key.replace('_', ' ')} {value}"


def _capped(candidates: list[FactCandidate]) -> list[FactCandidate]:
    """``candidates`` with each burst of one-shaped values cut to its first :data:`BURST_KEPT`, marked mentioned."""
    bursts = repetitive_values([candidate.value for candidate in candidates])
    dropped = {value for burst in bursts for value in burst.values[BURST_KEPT:]}
    listed = {value for burst in bursts for value in burst.values}
    return [
        replace(
            candidate,
            provenance="mentioned",
            operation="add",
            text=_rule_text(candidate.key, candidate.value, "mentioned"),
        )
        if candidate.value in listed
        else candidate
        for candidate in candidates
        if candidate.value not in dropped
    ]


def value_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, kind)`` offsets of the values :func:`rule_facts`' patterns see in ``text``, sorted, never
    overlapping, for removing values from a text (a chat's title). A ``secret`` also covers the rest of its secret
    word's clause (a password without digits matches no pattern). Never raises."""
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
    """An identifier's slot from a word shortly before it in its clause, else ``identifier``; else the kind."""
    if kind == "id":
        clause = _CLAUSE_BREAK.split(before[-SLOT_WINDOW_CHARS:])[-1]
        best: tuple[int, str] | None = None
        for pattern, slot in _SLOT_WORDS:
            for match in pattern.finditer(clause):
                if best is None or match.start() > best[0]:
                    best = (match.start(), slot)
        return best[1] if best is not None else "identifier"
    return "amount" if kind == "money" else kind


def excerpt_around(
    text: str, start: int, end: int, *, chars: int = EXCERPT_CHARS, secrets: Sequence[SecretSpan] = ()
) -> str:
    """Up to ``chars`` characters of ``text`` around ``text[start:end]``, on one line, ``…`` where cut; each of
    ``secrets`` (sorted spans of ``text``) in reach is replaced by its marker (F-51)."""
    room = max(0, chars - (end - start)) // 2
    left, right = max(0, start - room), min(len(text), end + room)
    parts: list[str] = []
    position = left
    for span in secrets:
        if span.end > position and span.start < right:
            parts += [text[position : max(position, span.start)], MARKERS[span.kind]]
            position = min(span.end, right)
    piece = " ".join("".join([*parts, text[position:right]]).split())
    return f"{'…' if left else ''}{piece}{'…' if right < len(text) else ''}"


def tool_call_facts(tool_calls: Sequence[dict[str, Any]], *, message_id: int) -> list[FactCandidate]:
    """The key facts in ``tool_calls`` arguments: leaves :func:`rule_facts` finds whole, or numbers under amount-like
    names; the slot is the argument's name, ``text`` names the tool. Never raises."""
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
    # The argument's name is the cue ("password", "card_number"): a credential is never a fact (F-51).
    secrets = secret_values([f"{arg.replace('_', ' ')}: {text}"])
    found = _leaf_candidates(leaf, text, key=key, arg=arg, tool=tool, message_id=message_id)
    return [
        replace(candidate, excerpt=redact_values(candidate.excerpt, secrets))
        for candidate in found
        if not any(candidate.value in secret or secret in candidate.value for secret in secrets)
    ]


def _leaf_candidates(leaf: Any, text: str, *, key: str, arg: str, tool: str, message_id: int) -> list[FactCandidate]:
    if isinstance(leaf, int | float):
        if _AMOUNT_ARGS.search(arg):
            return [_tool_fact("money", key, text, tool, message_id, f"{arg}={text}")]
        if len(text) >= 5 and text.isdigit():
            return [_tool_fact("id", key, text, tool, message_id, f"{arg}={text}")]
        return []
    if len(text) > MAX_VALUE_CHARS:
        return [
            replace(
                candidate,
                key=key if candidate.key in ("identifier", "amount", candidate.kind) else candidate.key,
                provenance="tool_args",
            )
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
        provenance="tool_args",
    )


def message_rule_facts(message: Message) -> list[FactCandidate]:
    """The rule facts of one stored message with its ``id``: a user's text, an assistant's tool-call arguments
    (assistant text and tool results are mostly listings and suggestions, docs/memory.md F-30). Never raises."""
    message_id = message.get("id")
    if not isinstance(message_id, int):
        return []
    role = message.get("role")
    if role == "user":
        content = message.get("content")
        return rule_facts(
            content if isinstance(content, str) else _text(content),
            message_id=message_id,
            operations=True,
            at=created_at(message),
        )
    if role == "assistant" and message.get("tool_calls"):
        return tool_call_facts(message["tool_calls"], message_id=message_id)
    return []


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)
