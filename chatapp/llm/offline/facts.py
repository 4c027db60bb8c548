"""The offline engine's answer to a key-facts extraction request (docs/memory.md §11, F-32): deterministic JSON in
the shape of :data:`memory.api.EXTRACTION_SCHEMA`, from the prompt alone: rule facts and digit-free English and
Chinese patterns on user lines, tool-call arguments on assistant lines. A new value of a single-valued slot, or any
value on a correcting line, supersedes the slot's other values; a withdrawing sentence retracts the existing facts it
names (F-46); facts already known are not repeated. Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from chatapp.llm.offline.evidence import plain_text
from memory.api import EXTRACTION_MARKER, FactCandidate, message_rule_facts, split_sentences

Message = dict[str, Any]

# Slots holding one value at a time: a new value supersedes the old one.
SINGLE_VALUED = frozenset({"name", "home_address", "address", "shipping_address"})
ADDRESS_KEYS = ("home_address", "address")
# Longest value (characters) a pattern may take: a place or a name, not a passage.
MAX_PATTERN_VALUE_CHARS = 60

_LINE = re.compile(r"^(?P<number>\d+)\. (?:\((?P<date>[^)]*)\) )?(?P<role>[A-Za-z]+): ?(?P<body>.*)$")
_EXISTING = re.compile(r"^\[(?P<handle>\d+)\] (?P<kind>\S+) (?P<key>[^:\s]+): (?P<value>.*)$")
_CALL = re.compile(r"(?<![\w.])(?P<name>[A-Za-z_][\w.-]*)\(")

# An English value ends at clause punctuation or a conjunction that starts a new clause.
_EN_END = re.compile(
    r"[,;:!?()\[\]\"“”，。；：！？]|(?<!\bSt)(?<!\bMt)(?<!\bDr)(?<!\bAve)(?<!\bApt)\.(?!\d)"
    r"|\s(?:and|but|because|so|since|which|who|where|though|although|or)\s",
    re.IGNORECASE,
)
# A Chinese value ends at punctuation, a space, or where the next clause starts with 我/我们.
_ZH_END = re.compile(r"[\s,.;:!?()，。；：！？、（）]|我")
# A user line that corrects or replaces a value it gives ("Actually my account is ACC-9902 now,
# the old one was closed"): its values supersede the other values of their slot, whatever the slot.
_CORRECTION = re.compile(
    r"\b(?:actually|instead|correction|i meant|no longer|changed|not [\w' -]{1,30} any ?more"
    r"|the (?:old|previous|former) (?:one|number|id|account|code|value))\b",
    re.IGNORECASE,
)
# A sentence that withdraws a fact without a new value ("I'm no longer allergic to …", "我已经不…了"): a model's
# reading of the withdrawal cues of docs/memory.md F-46.
_WITHDRAWAL = re.compile(
    r"\bno longer\b|\b(?:not|never)\b[^.;!?]{0,50}\bany ?more\b|n['’]t\b[^.;!?]{0,50}\bany ?more\b"
    r"|\bforget (?:about )?(?:my|the|that)\b|\bi(?: have|['’]ve)? (?:stopped|quit|given up|gave up)\b"
    r"|不再|已经不|已经没|(?:不|没)[^，。！？,.!?；;]{1,10}了|\bnicht mehr\b|\bkein\w*\b[^.;!?]{0,40}\bmehr\b"
    r"|\bne\b[^.;!?]{0,30}\bplus\b|\bn['’][^.;!?]{0,30}\bplus\b|\bya no\b",
    re.IGNORECASE,
)
_NEGATIVE_KEYS = frozenset({"dislikes"})
# Capitalised words after "I'm" that are not names.
_NOT_NAMES = frozenset({"Sorry", "Not", "So", "Just", "Still", "Also", "Really", "Very", "Here", "Allergic", "Looking"})
_PRONOUNS = frozenset({"it", "that", "this", "them", "those", "these", "you", "one", "him", "her"})


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[str]
    kind: str
    key: str
    text: str  # the fact's ``text``; ``{value}`` is replaced
    chinese: bool = False
    capitalized: bool = False  # the value is the run of capitalised words that follows


_ANY = re.IGNORECASE
PATTERNS: tuple[_Pattern, ...] = (
    _Pattern(re.compile(r"\bmy (?:full )?name is\s+", _ANY), "name", "name", "The user's name is {value}"),
    _Pattern(re.compile(r"\b(?:please )?call me\s+", _ANY), "name", "name", "The user's name is {value}"),
    # "I'm X" only for capitalised words: "I'm Mia Li", not "I'm looking for" (case-sensitive).
    _Pattern(re.compile(r"\b(?:I'm|I’m|I am)\s+"), "name", "name", "The user's name is {value}", capitalized=True),
    _Pattern(
        re.compile(r"\b(?:I|we) (?:now )?(?:live|am living|are living|reside) (?:in|at)\s+", _ANY),
        "address",
        "home_address",
        "The user lives at {value}",
    ),
    _Pattern(
        re.compile(r"\b(?:I|we)(?:'ve| have)? (?:just )?moved (?:to|into)\s+", _ANY),
        "address",
        "home_address",
        "The user lives at {value}",
    ),
    _Pattern(
        re.compile(r"\b(?:my|our|the) (?:new |current )?(?:shipping|delivery) address is(?: now)?\s+", _ANY),
        "address",
        "shipping_address",
        "The user's shipping address is {value}",
    ),
    _Pattern(
        re.compile(r"\b(?:my|our|the) (?:new |home |current )?address is(?: now)?\s+", _ANY),
        "address",
        "address",
        "The user's address is {value}",
    ),
    _Pattern(
        re.compile(r"\b(?:I'm|I’m|I am|we're|we are) (?:very |severely |also )?allergic to\s+", _ANY),
        "preference",
        "allergy",
        "The user is allergic to {value}",
    ),
    _Pattern(
        re.compile(
            r"\bmy (?:dog|cat|puppy|kitten|pet|parrot|rabbit|hamster)(?:'s name is| is called| is named)\s+", _ANY
        ),
        "name",
        "pet_name",
        "The user's pet is called {value}",
    ),
    _Pattern(
        re.compile(r"\bmy (?:dog|cat|puppy|kitten|pet|parrot|rabbit|hamster) is\s+", _ANY),
        "name",
        "pet_name",
        "The user's pet is called {value}",
        capitalized=True,
    ),
    _Pattern(
        re.compile(r"\bI (?:really |also |usually )?(?:love|like|enjoy|adore)\s+(?!to\b)", _ANY),
        "preference",
        "likes",
        "The user likes {value}",
    ),
    _Pattern(
        re.compile(r"\bI (?:really |also |usually )?prefer\s+", _ANY),
        "preference",
        "preference",
        "The user prefers {value}",
    ),
    _Pattern(
        re.compile(r"\bI (?:really )?(?:hate|dislike|can't stand|don't like|do not like)\s+", _ANY),
        "preference",
        "dislikes",
        "The user dislikes {value}",
    ),
    _Pattern(
        re.compile(r"我(?:很|也|特别|非常|最)?喜欢"), "preference", "likes", "The user likes {value}", chinese=True
    ),
    _Pattern(
        re.compile(r"我(?:现在)?不(?:再)?喜欢"), "preference", "dislikes", "The user dislikes {value}", chinese=True
    ),
    _Pattern(re.compile(r"我叫|我的名字(?:是|叫)"), "name", "name", "The user's name is {value}", chinese=True),
    _Pattern(
        re.compile(r"(?:我(?:们)?(?:现在)?|(?<=[，,]))住在"),
        "address",
        "home_address",
        "The user lives in {value}",
        chinese=True,
    ),
    _Pattern(
        re.compile(r"我(?:们)?搬(?:到|去)了?"), "address", "home_address", "The user lives in {value}", chinese=True
    ),
    _Pattern(re.compile(r"我的(?:新)?地址是"), "address", "address", "The user's address is {value}", chinese=True),
    _Pattern(re.compile(r"我的(?:狗|猫|宠物)叫"), "name", "pet_name", "The user's pet is called {value}", chinese=True),
)
# "我对X过敏": the value sits between two markers.
_ZH_ALLERGY = re.compile(r"(?:我(?:们)?|也)对([^，。；！？、,.;!?\s]{1,20}?)过敏")


def is_extraction_request(messages: list[Message]) -> bool:
    """Whether the last message is a key-facts extraction prompt (it holds ``EXTRACTION_MARKER``)."""
    return (
        bool(messages)
        and messages[-1].get("role") == "user"
        and (EXTRACTION_MARKER in plain_text(messages[-1].get("content")))
    )


def extraction_reply(messages: list[Message]) -> str:
    """The JSON text ``{"facts": [...]}`` answering the extraction prompt in ``messages[-1]``."""
    material = plain_text(messages[-1].get("content")) if messages else ""
    existing = list(_existing_facts(material))
    items: list[dict[str, Any]] = []
    single: dict[str, int] = {}  # single-valued key -> index of its item in ``items``
    seen: set[tuple[str, str]] = {(key, value.casefold()) for _, _, key, value in existing}
    for number, role, body in _new_lines(material):
        correcting = role == "user" and _CORRECTION.search(body) is not None
        if role == "user":
            candidates = [
                _rule_item(candidate, number)
                for candidate in message_rule_facts({"id": number, "role": "user", "content": body})
            ]
            candidates += list(_pattern_items(body, number))
        elif role == "assistant":
            candidates = [
                _rule_item(candidate, number)
                for candidate in message_rule_facts({"id": number, "role": "assistant", "tool_calls": _calls(body)})
            ]
        else:
            continue
        if role == "user":
            items += _retractions(body, number, existing, seen, {item["value"].casefold() for item in candidates})
        for item in candidates:
            if item["kind"] == "address":
                item["key"] = _address_key(item["key"], existing)
            slot = (item["key"], item["value"].casefold())
            if slot in seen:
                continue
            seen.add(slot)
            if correcting and item["key"] not in SINGLE_VALUED:
                item["supersedes"] = [
                    handle
                    for handle, _, key, value in existing
                    if key == item["key"] and value.casefold() != item["value"].casefold()
                ]
                # A value of the slot from an earlier line of this request is replaced too.
                items = [older for older in items if older["key"] != item["key"] or older["source"] == item["source"]]
                single = {older["key"]: index for index, older in enumerate(items) if older["key"] in single}
            if item["key"] in SINGLE_VALUED:
                item["supersedes"] = [
                    handle
                    for handle, _, key, value in existing
                    if key == item["key"] and value.casefold() != item["value"].casefold()
                ]
                if item["key"] in single:  # a newer value of the slot in this request wins
                    items[single[item["key"]]] = item
                    continue
                single[item["key"]] = len(items)
            items.append(item)
    return json.dumps({"facts": items}, ensure_ascii=False)


def _retractions(
    body: str, number: int, existing: list[tuple[int, str, str, str]], seen: set[tuple[str, str]], new: set[str]
) -> list[dict[str, Any]]:
    """``retract`` items for the existing facts whose value a withdrawing sentence of ``body`` names, unless the
    line gives that value again (a preference turned around supersedes, F-47)."""
    items = []
    for sentence in split_sentences(body):
        if not _WITHDRAWAL.search(sentence):
            continue
        for handle, kind, key, value in existing:
            folded = value.casefold()
            if folded in sentence.casefold() and (key, folded) in seen and folded not in new:
                seen.discard((key, value.casefold()))
                items.append(
                    {**_item(kind, key, "The user withdrew {value}", value, number), "operation": "retract"}
                    | {"supersedes": [handle]}
                )
    return items


def _existing_facts(material: str) -> Iterator[tuple[int, str, str, str]]:
    """``(handle, kind, key, value)`` of each ``[handle] kind key: value`` line of the prompt's
    ``<existing_facts>`` section."""
    start, end = material.find("<existing_facts>"), material.find("</existing_facts>")
    if start < 0 or end < start:
        return
    for line in material[start:end].splitlines():
        match = _EXISTING.match(line.strip())
        if match:
            yield int(match["handle"]), match["kind"], match["key"], match["value"].strip()


def _new_lines(material: str) -> Iterator[tuple[int, str, str]]:
    """``(number, role, body)`` of each numbered line between the marker and ``</new_messages>``
    (the role lowercased; a line the prompt cut off loses its trailing ``…``)."""
    start, end = material.find(EXTRACTION_MARKER), material.rfind("</new_messages>")
    if start < 0:
        return
    section = material[start + len(EXTRACTION_MARKER) : end if end > start else len(material)]
    for line in section.splitlines():
        match = _LINE.match(line.strip())
        if match:
            yield int(match["number"]), match["role"].lower(), match["body"].removesuffix("…")


def _calls(body: str) -> list[dict[str, Any]]:
    """The tool calls written on an assistant line as ``name({json arguments})``, in the OpenAI
    shape (arguments as JSON text; a call cut off by the line limit keeps the rest as text)."""
    calls = []
    decoder = json.JSONDecoder()
    for match in _CALL.finditer(body):
        rest = body[match.end() :]
        try:
            arguments, _ = decoder.raw_decode(rest)
            raw = json.dumps(arguments, ensure_ascii=False)
        except ValueError:
            raw = rest.rstrip(")")
            if not rest.lstrip().startswith("{"):
                continue
        calls.append({"type": "function", "function": {"name": match["name"], "arguments": raw}})
    return calls


def _rule_item(candidate: FactCandidate, number: int) -> dict[str, Any]:
    return {
        "operation": "add",
        "kind": candidate.kind,
        "polarity": "positive",
        "key": candidate.key,
        "value": candidate.value,
        "text": candidate.text,
        "source": [number],
        "supersedes": [],
    }


# What a user quotes or forwards says nothing about them (F-49): inline quotations, "> " quotes up to
# their sentence's end, and everything after a forwarded or original message's header.
_QUOTED = re.compile(
    r"\"[^\"]*\"|“[^”]*”|「[^」]*」|(?:^|\s)>\s[^.!?]*[.!?]?"
    r"|(?:-{3,}\s*(?:Forwarded message|Original Message)|Begin forwarded message:|\bOn [^.]{0,80}\bwrote:).*",
    re.IGNORECASE,
)


def _pattern_items(body: str, number: int) -> Iterator[dict[str, Any]]:
    """The items the digit-free patterns find in a user line's own words, in order of appearance."""
    found: list[tuple[int, dict[str, Any]]] = []
    body = _QUOTED.sub(lambda match: " " * len(match[0]), body)
    for pattern in PATTERNS:
        for match in pattern.regex.finditer(body):
            value = _value_at(body, match.end(), chinese=pattern.chinese)
            if pattern.capitalized:
                value = _capitalized_run(value)
            if value and (pattern.kind != "name" or pattern.key != "name" or _name_like(value, pattern.chinese)):
                found.append((match.start(), _item(pattern.kind, pattern.key, pattern.text, value, number)))
    for match in _ZH_ALLERGY.finditer(body):
        found.append(
            (match.start(), _item("preference", "allergy", "The user is allergic to {value}", match[1], number))
        )
    found.sort(key=lambda pair: pair[0])
    yield from (item for _, item in found)


def _item(kind: str, key: str, text: str, value: str, number: int) -> dict[str, Any]:
    return {
        "operation": "add",
        "kind": kind,
        "polarity": "negative" if key in _NEGATIVE_KEYS else "positive",
        "key": key,
        "value": value,
        "text": text.format(value=value),
        "source": [number],
        "supersedes": [],
    }


def _value_at(body: str, start: int, *, chinese: bool) -> str:
    """The verbatim value starting at ``body[start]``: up to the end of its clause, without
    surrounding quotes or a leading article's pronoun-only value; ``""`` when none is left."""
    rest = body[start:]
    end = (_ZH_END if chinese else _EN_END).search(rest)
    value = rest[: end.start() if end else len(rest)].strip(" '\"‘’“”「」")
    if chinese:
        value = value.removesuffix("了")
    else:
        value = re.sub(
            r"(?:\s+(?:now|too|as well|anymore|though|actually|instead|please|here|today|myself|ourselves))+$",
            "",
            value,
            flags=re.IGNORECASE,
        )
    if not value or len(value) > MAX_PATTERN_VALUE_CHARS or value.casefold() in _PRONOUNS:
        return ""
    return value


def _capitalized_run(value: str) -> str:
    """The leading words of ``value`` that start with a capital letter (``""`` when none)."""
    words = []
    for word in value.split():
        if not word[0].isupper() or (word.isupper() and len(word) > 1):
            break
        words.append(word)
    return " ".join(words) if words and words[0] not in _NOT_NAMES else ""


def _name_like(value: str, chinese: bool) -> bool:
    """A plausible person's name: 1-6 CJK characters, or 1-4 words."""
    if any(ch.isdigit() for ch in value):
        return False
    if chinese:
        return 1 <= len(value) <= 6
    return 1 <= len(value.split()) <= 4


def _address_key(key: str, existing: list[tuple[int, str, str, str]]) -> str:
    """The key of a new address: the key of the newest existing address fact in
    :data:`ADDRESS_KEYS` (so a new address supersedes it, F-28), else ``key``."""
    keys = [fact_key for _, kind, fact_key, _ in existing if kind == "address" and fact_key in ADDRESS_KEYS]
    return keys[-1] if keys else key
