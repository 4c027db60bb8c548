"""The memory blocks of a chat request, as the offline engine reads them: the key-facts block, the
summary block and the recall block (docs/memory.md §10: ``[system] [key facts] [summary] [recall]
[retained window] [current turn]``). Pure and deterministic.

The blocks are found by their first lines, which the memory engine writes
(:data:`memory.api.FACTS_HEADER`, the ``[Memory Summary - …]`` header of docs/memory.md §3 step 5,
:data:`memory.api.RECALL_HEADER`), in a message of any role: each is a message of its own, or,
with ``LLM_STRICT_ALTERNATION`` and ``MEMORY_SUMMARY_ROLE=user``, merged with its neighbours
into one user message, parts joined by a blank line (docs/memory.md F-38). Everything the engine
answers about the conversation comes from these blocks and the messages of the request, never
from the database: that is what shows memory working.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from memory.api import FACTS_HEADER, RECALL_HEADER

BlockKind = Literal["facts", "summary", "recall", "text"]

_SUMMARY_HEADER = r"\[Memory Summary\b"
_BLOCK_START_RE = re.compile(
    rf"(?:\A|(?<=\n\n))[ \t]*(?={re.escape(FACTS_HEADER)}|{_SUMMARY_HEADER}|{re.escape(RECALL_HEADER)})"
)
_BLOCK_KINDS: tuple[tuple[str, BlockKind], ...] = (
    (FACTS_HEADER, "facts"),
    ("[Memory Summary", "summary"),
    (RECALL_HEADER, "recall"),
)
# A merged message joins its parts with a blank line (memory.core.MERGE_SEPARATOR).
_PARAGRAPH_BREAK = "\n\n"


@dataclass(frozen=True, kw_only=True)
class Block:
    """One part of a message's text: a memory block (``kind`` ``facts``, ``summary`` or
    ``recall``, ``text`` with its header line) or plain ``text`` (kind ``text``)."""

    kind: BlockKind
    text: str


def message_blocks(text: str) -> list[Block]:
    """The parts of a message's ``text``, in order.

    A block starts at the beginning of the text or after a blank line, with its header. The
    key-facts and recall blocks have no blank line inside, so each ends at the next blank line;
    the summary block (an LLM's summary may hold paragraphs) runs to the next block or the end.
    Text outside blocks is returned as ``text`` parts; a message without blocks is one ``text``
    part (empty text: no part).
    """
    starts = [match.end() for match in _BLOCK_START_RE.finditer(text)]
    if not starts:
        return [Block(kind="text", text=text)] if text.strip() else []
    parts: list[Block] = []
    if text[: starts[0]].strip():
        parts.append(Block(kind="text", text=text[: starts[0]].strip()))
    for number, start in enumerate(starts):
        end = starts[number + 1] if number + 1 < len(starts) else len(text)
        chunk = text[start:end].strip()
        kind = next(kind for header, kind in _BLOCK_KINDS if chunk.startswith(header))
        if kind != "summary" and _PARAGRAPH_BREAK in chunk:
            chunk, rest = chunk.split(_PARAGRAPH_BREAK, 1)
            parts.append(Block(kind=kind, text=chunk.strip()))
            if rest.strip():
                parts.append(Block(kind="text", text=rest.strip()))
        else:
            parts.append(Block(kind=kind, text=chunk))
    return parts


def question_and_blocks(text: str) -> tuple[str, list[Block]]:
    """The user's own words of the last message of a request, and the memory blocks merged into
    it (none unless strict alternation merged them, docs/memory.md F-38).

    The words are the text after the last block; when a summary block comes last, its last
    paragraph (the merge put the user's message after a blank line).
    """
    parts = message_blocks(text)
    if not any(part.kind != "text" for part in parts):
        return text, []
    if parts[-1].kind == "text":
        return parts[-1].text, parts[:-1]
    last = parts[-1]
    if last.kind == "summary" and _PARAGRAPH_BREAK in last.text:
        summary, words = last.text.rsplit(_PARAGRAPH_BREAK, 1)
        return words.strip(), [*parts[:-1], Block(kind="summary", text=summary)]
    return "", parts


# --- the key-facts block (memory.facts.render_facts) -------------------------------------------

# "- slot: value" then, on lines of facts that are not grouped, " (msg 12)", " (msg 12, current;
# replaces <old>)", " (set by the user, pinned by the user)" (memory.facts.fact_line).
_FACT_LINE_RE = re.compile(r"^-\s+(?P<key>[^:\n]+?):\s+(?P<rest>.+)$")
_PROVENANCE_RE = re.compile(r"\s+\((?P<where>(?:msg \d+|set by the user)(?:,[^()]*)?)\)\s*$")
_REPLACES_RE = re.compile(r"\bcurrent; replaces (?P<old>.+)$")
# A commitment's or other fact's line adds " - <its one-line text>": a sentence of 3+ words.
_TEXT_SPLIT_RE = re.compile(r"\s-\s(?=[A-Z][^\s]*(?:\s+\S+){2,}$)")
GROUPED_SEPARATOR = "; "


@dataclass(frozen=True, kw_only=True)
class FactLine:
    """One line of the key-facts block.

    ``key``: the slot (``user_id``, ``home_address``); ``values``: its value, or for a grouped
    line of identifiers, amounts, dates or contact data every value, newest first; ``text``: the
    fact's one-line description (commitments and other facts only, else ``""``); ``replaces``:
    the older value it superseded (``""`` if none); ``pinned``: pinned or set by the user.
    """

    key: str
    values: tuple[str, ...]
    text: str = ""
    replaces: str = ""
    pinned: bool = False


def facts_lines(block: str) -> list[FactLine]:
    """The facts of a key-facts block (its header line first); lines that are not facts are
    skipped, so a block written by a newer engine still reads. Never raises."""
    facts: list[FactLine] = []
    for line in block.splitlines()[1:]:
        match = _FACT_LINE_RE.match(line.strip())
        if match is None:
            continue
        key, rest = match["key"].strip(), match["rest"].strip()
        provenance = _PROVENANCE_RE.search(rest)
        if provenance is None:
            values = tuple(value.strip() for value in rest.split(GROUPED_SEPARATOR) if value.strip())
            if values:
                facts.append(FactLine(key=key, values=values))
            continue
        where = provenance["where"]
        value, text = rest[: provenance.start()].strip(), ""
        split = _TEXT_SPLIT_RE.search(value)
        if split is not None:
            value, text = value[: split.start()].strip(), value[split.end() :].strip()
        replaces = _REPLACES_RE.search(where)
        if value:
            facts.append(
                FactLine(
                    key=key,
                    values=(value,),
                    text=text,
                    replaces=replaces["old"].strip() if replaces else "",
                    pinned="by the user" in where,
                )
            )
    return facts


# --- the recall block (memory.recall.render_recall) ---------------------------------------------

# "- 2024-05-20 (chat "Trip", msg 123) User: text", later lines of the text indented by two spaces.
_RECALL_LINE_RE = re.compile(
    r"^-\s(?P<date>\d{4}-\d{2}-\d{2})\s\((?:chat\s\"(?P<chat>.*?)\",\s)?(?P<msgs>msgs?\s[\d,\s]+)\)\s"
    r"(?P<role>[A-Z][A-Za-z]*):\s?(?P<text>.*)$"
)


@dataclass(frozen=True, kw_only=True)
class RecalledItem:
    """One item of the recall block: ``date`` (``YYYY-MM-DD``), ``chat`` (the chat's title,
    ``""`` for none), ``messages`` (``msg 12`` or ``msgs 12, 13``), ``role`` (``user``,
    ``assistant``, ``tool``) and ``text``, verbatim."""

    date: str
    chat: str
    messages: str
    role: str
    text: str

    @property
    def where(self) -> str:
        """Where it comes from, for a reply: ``2024-05-20, msg 12`` (the chat's title is left
        out: often its first message, too long to repeat; the inspector links the message)."""
        return f"{self.date}, {self.messages}"


def recall_items(block: str) -> list[RecalledItem]:
    """The items of a recall block (its header line first), in block order. Never raises."""
    items: list[RecalledItem] = []
    for line in block.splitlines()[1:]:
        match = _RECALL_LINE_RE.match(line)
        if match is not None:
            items.append(
                RecalledItem(
                    date=match["date"],
                    chat=match["chat"] or "",
                    messages=" ".join(match["msgs"].split()),
                    role=match["role"].lower(),
                    text=match["text"].strip(),
                )
            )
        elif items and line.startswith("  "):
            items[-1] = replace(items[-1], text=f"{items[-1].text}\n{line[2:]}")
    return [replace(item, text=item.text.strip()) for item in items]
