"""What the recall index holds (docs/memory.md §12 "The index"): messages in verbatim pieces of ≤ 120 tokens. Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memory.messages import found_nothing
from memory.summary.archive import unescaped
from memory.text.fulltext import search_text
from memory.text.secrets import redact_secrets
from memory.tokens.counter import TokenCounter

INDEX_PIECE_TOKENS = 120


# Tokens of a tool call's arguments kept in the header of each piece of its result.
CALL_ARGS_TOKENS = 40


# Tokens left for a piece of a tool result however long its header is.
MIN_BODY_TOKENS = 40


# Sentence ends (docs/memory.md F-39) without the summarizer's abbreviation rule: a piece is a verbatim slice packed up
# to a budget, so a cut after an abbreviation leaves nothing out.
_SENTENCE_END_RE = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s)|[。！？；]+[」』”’）)]*|\n")


# Clause breaks inside an over-long sentence: commas, colons, semicolons, ideographic commas.
_CLAUSE_END_RE = re.compile(r"[,;:](?=\s)|[，、：；]|\s")


def message_text(content: Any) -> str:
    """A stored ``content`` as text: a string as it is, content parts' ``text`` joined by spaces, ``""`` for None."""
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _call_header(call: dict[str, Any], counter: TokenCounter) -> str:
    """``name(arguments) -> `` of a tool call, its arguments redacted (F-51) and cut to :data:`CALL_ARGS_TOKENS`."""
    function = call.get("function") or {}
    name = str(function.get("name") or "tool")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False) if arguments is not None else ""
    arguments = redact_secrets(unescaped(arguments))
    if counter.count_text(arguments) > CALL_ARGS_TOKENS:
        arguments = _prefix_within(arguments, CALL_ARGS_TOKENS, counter).rstrip() + "…"
    return f"{name}({arguments}) -> "


def _prefix_within(text: str, max_tokens: int, counter: TokenCounter) -> str:
    """The longest prefix of ``text`` within ``max_tokens`` (at least one character), by bisection."""
    # No token spans more than 32 characters in practice, so a huge text costs no more than a short one.
    low, high = 1, min(len(text), max(1, max_tokens) * 32)
    while low < high:
        middle = (low + high + 1) // 2
        if counter.count_text(text[:middle]) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def _spans(text: str, pattern: re.Pattern[str]) -> list[str]:
    pieces, start = [], 0
    for match in pattern.finditer(text):
        if match.end() > start:
            pieces.append(text[start : match.end()])
            start = match.end()
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def _pack(parts: list[str], max_tokens: int, counter: TokenCounter, *, finer: list[re.Pattern[str]]) -> list[str]:
    """``parts`` joined greedily into pieces of at most ``max_tokens``; a part that alone is larger is cut by the next
    pattern of ``finer``, else between characters. Joined, the pieces give the parts back."""
    pieces: list[str] = []
    current = ""
    for part in parts:
        if counter.count_text(current + part) <= max_tokens:
            current += part
            continue
        if current:
            pieces.append(current)
            current = ""
        if counter.count_text(part) <= max_tokens:
            current = part
        elif finer:
            pieces.extend(_pack(_spans(part, finer[0]), max_tokens, counter, finer=finer[1:]))
        else:
            while part:
                head = _prefix_within(part, max_tokens, counter)
                pieces.append(head)
                part = part[len(head) :]
    if current:
        pieces.append(current)
    return pieces


def split_for_index(
    message: dict[str, Any],
    *,
    counter: TokenCounter,
    max_tokens: int = INDEX_PIECE_TOKENS,
    call: dict[str, Any] | None = None,
) -> list[str]:
    """The verbatim pieces of one stored message that recall indexes (docs/memory.md §12 "The index"): user or assistant
    text (``name: text`` when it names its speaker), a tool result as ``name(arguments) -> result`` with the header on
    each piece; credentials withheld (F-51); cut to ``max_tokens`` at sentence ends, then clause breaks or spaces, then
    characters. ``[]`` for other roles or no text; never raises."""
    role = message.get("role")
    if role not in ("user", "assistant", "tool"):
        return []
    # Credentials never enter the index, its search text or embeddings (F-51).
    text = redact_secrets(message_text(message.get("content")).strip())
    if not text:
        return []
    header = ""
    speaker = str(message.get("name") or "").strip() if role in ("user", "assistant") else ""
    if speaker:
        header = f"{speaker}: "
    if role == "tool":
        named = {"function": {"name": message.get("name") or "tool", "arguments": ""}}
        header = _call_header(call or named, counter) if call is not None else f"{named['function']['name']} -> "
    budget = max(max_tokens - counter.count_text(header), MIN_BODY_TOKENS if header else 1)
    if counter.count_text(text) <= budget:
        return [header + text]
    pieces = _pack(_spans(text, _SENTENCE_END_RE), budget, counter, finer=[_CLAUSE_END_RE])
    return [header + piece.strip() for piece in pieces if piece.strip()]


@dataclass(frozen=True, kw_only=True)
class IndexPiece:
    """One item to store: ``message_ids`` oldest first, ``piece`` its place in the newest message (from 0), verbatim
    ``text``, its ``tokens`` and ``created_at`` (the newest message's, aware)."""

    message_ids: tuple[int, ...]
    last_message_id: int
    piece: int
    role: str
    text: str
    search_text: str
    tokens: int
    created_at: datetime

    @property
    def slot(self) -> tuple[int, int]:
        """``(last_message_id, piece)``: the piece's identity within its conversation."""
        return (self.last_message_id, self.piece)


def _tool_name(call: dict[str, Any] | None, message: dict[str, Any]) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return str(name or message.get("name") or "")


def message_pieces(
    messages: Sequence[dict[str, Any]],
    *,
    counter: TokenCounter,
    calls: dict[str, tuple[int, dict[str, Any]]],
    max_tokens: int = INDEX_PIECE_TOKENS,
    skip_tools: frozenset[str] = frozenset(),
    empty_results: tuple[str, ...] = (),
) -> list[IndexPiece]:
    """The items of ``messages`` in order (:func:`split_for_index`); ``calls``: call id → (message id, call) for calls
    stored before the batch. None for a result of a tool in ``skip_tools``, a result that found nothing
    (:func:`memory.messages.found_nothing`), or the answer after tool results that all found nothing (docs/memory.md
    §12). Never raises."""
    known = dict(calls)
    for message in messages:
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and call.get("id"):
                known[str(call["id"])] = (int(message["id"]), call)
    found: list[IndexPiece] = []
    results: list[bool] = []  # whether each tool result of the current turn found nothing
    for message in messages:
        message_id = int(message["id"])
        ids: tuple[int, ...] = (message_id,)
        call = None
        role = message.get("role")
        if role == "user":
            results = []
        elif role == "assistant" and not message.get("tool_calls") and results and all(results):
            continue
        if role == "tool":
            call_message_id, call = known.get(str(message.get("tool_call_id") or ""), (None, None))
            results.append(found_nothing(message, empty_results))
            if results[-1] or _tool_name(call, message) in skip_tools:
                continue
            if call_message_id is not None and call_message_id < message_id:
                ids = (call_message_id, message_id)
        for number, text in enumerate(split_for_index(message, counter=counter, max_tokens=max_tokens, call=call)):
            found.append(
                IndexPiece(
                    message_ids=ids,
                    last_message_id=message_id,
                    piece=number,
                    role=str(message.get("role")),
                    text=text,
                    search_text=search_text(text),
                    tokens=counter.count_text(text),
                    created_at=message["created_at"],
                )
            )
    return found
