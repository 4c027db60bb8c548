"""What the recall index holds (docs/memory.md §12): each stored message split into pieces of
at most 120 tokens, tool results headed by their call. Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memory.text.fulltext import search_text
from memory.tokens.counter import TokenCounter

# Largest piece of a message that is indexed as one item, in tokens (docs/memory.md §12).
INDEX_PIECE_TOKENS = 120


# Tokens of a tool call's arguments kept in the header of each piece of its result.
CALL_ARGS_TOKENS = 40


# Tokens left for a piece of a tool result however long its header is.
MIN_BODY_TOKENS = 40


# Sentence ends: ASCII .!? before whitespace (so "A-1.5" or "example.com" stay whole), the CJK
# full stops 。！？ and the full-width semicolon ；, each with closing quotes or brackets, and line
# breaks (docs/memory.md F-39). A piece is a verbatim slice packed up to a token budget, so a cut
# after an abbreviation leaves out nothing; the summarizer's rule (memory.sentences) skips those.
_SENTENCE_END_RE = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s)|[。！？；]+[」』”’）)]*|\n")


# Clause breaks inside an over-long sentence: commas, colons, semicolons, ideographic commas.
_CLAUSE_END_RE = re.compile(r"[,;:](?=\s)|[，、：；]|\s")


def message_text(content: Any) -> str:
    """The text of a stored message's ``content``: a string as it is, the ``text`` parts of a
    list of content parts joined by spaces, ``""`` for None."""
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _call_header(call: dict[str, Any], counter: TokenCounter) -> str:
    """``name(arguments) -> `` of a tool call, its arguments cut to :data:`CALL_ARGS_TOKENS`."""
    function = call.get("function") or {}
    name = str(function.get("name") or "tool")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False) if arguments is not None else ""
    if counter.count_text(arguments) > CALL_ARGS_TOKENS:
        arguments = _prefix_within(arguments, CALL_ARGS_TOKENS, counter).rstrip() + "…"
    return f"{name}({arguments}) -> "


def _prefix_within(text: str, max_tokens: int, counter: TokenCounter) -> str:
    """The longest prefix of ``text`` (whole characters, at least one) of at most ``max_tokens``
    tokens, found by bisection on the character count (no token spans more than 32 characters
    in practice, so longer prefixes are not tried: a huge text costs no more than a short one)."""
    low, high = 1, min(len(text), max(1, max_tokens) * 32)
    while low < high:
        middle = (low + high + 1) // 2
        if counter.count_text(text[:middle]) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def _spans(text: str, pattern: re.Pattern[str]) -> list[str]:
    """``text`` cut after each match of ``pattern``; the pieces joined give ``text`` back."""
    pieces, start = [], 0
    for match in pattern.finditer(text):
        if match.end() > start:
            pieces.append(text[start : match.end()])
            start = match.end()
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def _pack(parts: list[str], max_tokens: int, counter: TokenCounter, *, finer: list[re.Pattern[str]]) -> list[str]:
    """Consecutive ``parts`` joined greedily into pieces of at most ``max_tokens`` tokens; a part
    that alone is larger is cut by the next pattern of ``finer``, and when none is left, into
    prefixes of whole characters. Joined, the pieces give the parts back."""
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
    """The pieces of one stored message that recall indexes (docs/memory.md §12, "the index").

    ``message``: a stored message as a dict with ``role``, ``content`` (str, content parts or
    None) and, for a tool result, ``name``; ``call``: for a tool result, the assistant's tool call
    it answers (``{"function": {"name", "arguments"}}``). A user or assistant message gives its
    text, or ``name: text`` when the message names its speaker (OpenAI ``name``, e.g. a replayed
    conversation between two people: a question about one of them then finds what they said); a
    tool result gives ``name(arguments) -> result`` (arguments cut to
    :data:`CALL_ARGS_TOKENS` tokens), the header repeated on every piece so each stands alone.
    Other roles (system), and messages without text (an assistant message that only calls tools:
    its calls are indexed with their results), give ``[]``.

    A text of at most ``max_tokens`` tokens (:class:`memory.tokens.TokenCounter`) is one piece;
    a longer one is cut into consecutive pieces of at most ``max_tokens`` tokens at sentence ends
    (``.!?`` before whitespace, ``。！？；``, line breaks), an over-long sentence at clause
    breaks or spaces, else between characters. Pieces are verbatim slices of the text, stripped of
    surrounding whitespace; empty ones are dropped. Never raises.
    """
    role = message.get("role")
    if role not in ("user", "assistant", "tool"):
        return []
    text = message_text(message.get("content")).strip()
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
    """One item to store: ``message_ids`` oldest first (a tool result: its call's message, then
    itself), ``last_message_id`` the newest of them, ``piece`` its place in that message (from
    0), ``role``, verbatim ``text``, ``search_text`` (see :func:`memory.fulltext.search_text`),
    ``tokens`` (its size in tokens) and ``created_at`` (its newest message's time, aware)."""

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
    """The name of the tool a result answers: its call's function name, else the message's name."""
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
) -> list[IndexPiece]:
    """The items of ``messages`` (stored messages as dicts with ``id``, ``role``, ``content``,
    ``tool_calls``, ``tool_call_id``, ``name`` and ``created_at``), in message order, by
    :func:`memory.recall.split_for_index`. ``calls``: tool-call id → ``(message id, call)`` of
    the assistant messages that made calls answered among ``messages`` (the caller reads the ones
    outside the batch); the calls made inside ``messages`` are added here. A tool result whose
    call is unknown is indexed as ``name -> result``. The results of the tools named in
    ``skip_tools`` (the call's function name, else the message's ``name``) give no item (the
    owning app's choice, docs/memory.md §12, "the index"). Never raises."""
    known = dict(calls)
    for message in messages:
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and call.get("id"):
                known[str(call["id"])] = (int(message["id"]), call)
    found: list[IndexPiece] = []
    for message in messages:
        message_id = int(message["id"])
        ids: tuple[int, ...] = (message_id,)
        call = None
        if message.get("role") == "tool":
            call_message_id, call = known.get(str(message.get("tool_call_id") or ""), (None, None))
            if _tool_name(call, message) in skip_tools:
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
