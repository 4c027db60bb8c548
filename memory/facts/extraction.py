"""LLM extraction of key facts (docs/memory.md §11): the prompt, tolerant parsing of the reply
and validation in code (grounding, supersession within a slot). Pure."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from memory.facts.operations import polarity_of, same_topic, withdrawal_sentences
from memory.facts.rules import _SNAKE, _text, excerpt_around
from memory.facts.values import (
    FACT_KINDS,
    MAX_KEY_CHARS,
    MAX_TEXT_CHARS,
    MAX_VALUE_CHARS,
    FactCandidate,
    KeyFact,
    Polarity,
)
from memory.messages import Message
from memory.text.provenance import own_text
from memory.text.secrets import redact_secrets, redact_values, secret_spans

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
                "required": ["operation", "kind", "key", "value", "polarity", "text", "source", "supersedes"],
                "properties": {
                    "operation": {"type": "string", "enum": ["add", "retract"]},
                    "kind": {"type": "string", "enum": list(FACT_KINDS)},
                    "polarity": {"type": "string", "enum": ["positive", "negative"]},
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
- "polarity": "negative" for what the user does not like, have or do (key e.g. dislikes), else "positive".
- When the user corrects or changes an existing fact of the same slot, put that fact's handle in "supersedes".
- When the user withdraws an existing fact without a new value ("I'm no longer allergic to X", "forget my old email"), give "operation": "retract", that fact's key and value, the withdrawing message in "source" and its handle in "supersedes"; otherwise "operation": "add".
- Values in quoted, forwarded or pasted text (emails, logs, code, tables) are not facts about the user.
- Do not extract the assistant's suggestions, options or listings as facts of the user; do not repeat existing facts unchanged.
- Reply with JSON only: {"facts": [{"operation", "kind", "key", "value", "polarity", "text", "source", "supersedes"}]}; {"facts": []} when there is nothing new."""


EXTRACTION_LINE_CHARS = 600


# Marks an extraction request, so a test double or the offline engine can recognise it.
EXTRACTION_MARKER = "<new_messages>"


@dataclass(frozen=True, kw_only=True)
class ExtractionInput:
    """One extraction request's material: the ``messages`` since the watermark (with ``id``, optional ``created_at``
    ISO 8601), numbered 1…n, and the chat's active ``facts``, handles 1…m."""

    messages: list[Message]
    facts: list[KeyFact]

    def message_by_number(self, number: int) -> Message | None:
        return self.messages[number - 1] if 1 <= number <= len(self.messages) else None

    def fact_by_handle(self, handle: int) -> KeyFact | None:
        return self.facts[handle - 1] if 1 <= handle <= len(self.facts) else None


def extraction_prompt(data: ExtractionInput) -> list[dict[str, Any]]:
    """The wire prompt ``[system, user]``: active facts as ``[handle] kind key: value``, then the new messages as
    ``N. (date) Role: text`` lines of at most 600 characters, credentials withheld."""
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
        body = redact_secrets(body)  # the extractor never sees a credential (F-51)
        line = " ".join(f"{number}. {f'({when}) ' if when else ''}{role}: {body}".split())
        lines.append(line if len(line) <= EXTRACTION_LINE_CHARS else line[: EXTRACTION_LINE_CHARS - 1] + "…")
    material = (
        f"<existing_facts>\n{facts or '(none)'}\n</existing_facts>\n\n"
        f"{EXTRACTION_MARKER}\n" + "\n".join(lines) + "\n</new_messages>\n\nReply with the JSON object now."
    )
    return [{"role": "system", "content": EXTRACTION_INSTRUCTIONS}, {"role": "user", "content": material}]


class ExtractionError(ValueError):
    """A reply with no readable ``facts`` list: nothing changes, the watermark stays (docs/memory.md F-29)."""


def parse_extraction(reply: str) -> list[dict[str, Any]]:
    """The ``facts`` list of a reply, tolerant of code fences, prose around the JSON and a bare list. Raises
    :class:`ExtractionError` when none can be read."""
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
    """``accepted`` candidates (``supersedes`` checked) and ``rejected`` items with the reason, for the job's record."""

    accepted: list[FactCandidate]
    rejected: list[dict[str, Any]]


def validate_extraction(items: list[dict[str, Any]], data: ExtractionInput, *, extractor: str) -> Validation:
    """Code-side validation of an extraction reply (docs/memory.md §11, F-28, F-30): a known ``kind``, a ``key``, a
    value of at most 200 characters grounded (case and spacing aside) in a cited user message or tool-call arguments,
    the first such being the source; ``supersedes`` keeps only unpinned active facts of the same slot. A ``retract``
    needs a cited user message that withdraws (F-46). Restatements (same slot, polarity and value) are dropped."""
    accepted: list[FactCandidate] = []
    rejected: list[dict[str, Any]] = []
    current = {(fact.key, fact.polarity, _norm(fact.value)) for fact in data.facts}
    for item in items:
        kind = str(item.get("kind") or "other").lower()
        key = _SNAKE.sub("_", str(item.get("key") or "").lower()).strip("_")[:MAX_KEY_CHARS]
        value = " ".join(str(item.get("value") or "").split())
        polarity: Polarity = "negative" if item.get("polarity") == "negative" else "positive"
        if item.get("polarity") not in ("positive", "negative"):
            polarity = polarity_of(key)
        if kind not in FACT_KINDS:
            kind = "other"
        if not key or not value or len(value) > MAX_VALUE_CHARS:
            rejected.append({"item": item, "reason": "missing or oversized key or value"})
            continue
        sources = [n for n in _ints(item.get("source")) if data.message_by_number(n) is not None]
        if item.get("operation") == "retract":
            retraction = _retraction(item, data, kind=kind, key=key, value=value, sources=sources)
            if isinstance(retraction, str):
                rejected.append({"item": item, "reason": retraction})
            else:
                accepted.append(replace(retraction, extractor=extractor, polarity=polarity))
            continue
        grounding = next((n for n in sources if _grounds(data.message_by_number(n), value)), None)
        if grounding is None:
            rejected.append({"item": item, "reason": "value does not occur in a cited user message or tool call"})
            continue
        if (key, polarity, _norm(value)) in current:
            continue
        message = data.message_by_number(grounding)
        assert message is not None
        provenance = _provenance(message, value)
        if provenance == "mentioned" and kind in ABOUT_THE_USER:
            rejected.append({"item": item, "reason": "quoted or pasted text says nothing about the user"})
            continue
        supersedes = []
        for handle in _ints(item.get("supersedes")):
            old = data.fact_by_handle(handle)
            if old is None or old.key != key or old.pinned_by_user or not old.active:
                rejected.append({"item": item, "reason": f"supersedes handle {handle}: not an active fact of {key}"})
                continue
            supersedes.append(old.id)
        source_text = " ".join(_grounding_text(message).split())
        at = max(_norm(source_text).find(_norm(value)), 0)
        # A credential is never a fact, nor shown in one's text or excerpt (F-51).
        secrets = secret_spans(source_text)
        if any(span.start < at + len(value) and at < span.end for span in secrets) or redact_secrets(value) != value:
            rejected.append({"item": item, "reason": "value is a credential"})
            continue
        known = {source_text[span.start : span.end]: span.kind for span in secrets}
        accepted.append(
            FactCandidate(
                kind=kind,  # type: ignore[arg-type]  # checked against FACT_KINDS above
                key=key,
                value=_verbatim(source_text, value),
                text=redact_values(" ".join(str(item.get("text") or value).split()), known)[:MAX_TEXT_CHARS],
                source_message_id=int(message["id"]),
                excerpt=excerpt_around(source_text, at, at + len(value), secrets=secrets),
                extractor=extractor,
                supersedes=tuple(supersedes),
                polarity=polarity,
                provenance=provenance,
            )
        )
        current.add((key, polarity, _norm(value)))
    return Validation(accepted=accepted, rejected=rejected)


# Kinds that describe the user: never taken from text the user quotes or pastes (F-49).
ABOUT_THE_USER = frozenset({"name", "address", "preference"})


def _provenance(message: Message, value: str) -> str:
    """``tool_args``, ``user`` (the value is in the user's own words) or ``mentioned`` (only in quoted or pasted
    text, docs/memory.md F-49)."""
    if message.get("role") != "user":
        return "tool_args"
    return "user" if _norm(value) in _norm(own_text(_text(message.get("content")))) else "mentioned"


def _retraction(
    item: dict[str, Any], data: ExtractionInput, *, kind: str, key: str, value: str, sources: list[int]
) -> FactCandidate | str:
    """A ``retract`` item as a candidate ending the active facts it names, or why it is rejected: no cited user
    message withdraws, or no handle names an active, unpinned fact of that slot or value."""
    withdrawing = next(
        (
            n
            for n in sources
            if (message := data.message_by_number(n)) is not None
            and message.get("role") == "user"
            and withdrawal_sentences(_text(message.get("content")))
        ),
        None,
    )
    if withdrawing is None:
        return "retract: no cited user message withdraws a fact"
    ends = [
        old.id
        for handle in _ints(item.get("supersedes"))
        if (old := data.fact_by_handle(handle)) is not None
        and old.active
        and not old.pinned_by_user
        and (old.key == key or same_topic(old.value, value))
    ]
    if not ends:
        return f"retract: no active fact of {key} named by its handles"
    message = data.message_by_number(withdrawing)
    assert message is not None
    return FactCandidate(
        kind=kind,  # type: ignore[arg-type]  # checked against FACT_KINDS by the caller
        key=key,
        value=value,
        text=f"withdrawn: {value}",
        source_message_id=int(message["id"]),
        operation="retract",
        supersedes=tuple(ends),
    )


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
    """A user's words or an assistant's tool-call arguments; never prose nor a tool's result."""
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
