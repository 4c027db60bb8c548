"""The key-facts, summary and recall blocks of a chat request as the offline engine reads them (docs/memory.md §10),
found by their headers in a message of any role, also merged into one user message (F-38). Pure."""

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
    """One part of a message's text: a memory block, header included, or plain ``text``."""

    kind: BlockKind
    text: str


def message_blocks(text: str) -> list[Block]:
    """The parts of a message's ``text``, in order. A block starts the text or follows a blank line; key facts and
    recall end at the next blank line, a summary (it may hold paragraphs) at the next block."""
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
    """``(the user's own words, the memory blocks merged before them)``; after a final summary block, the words
    are its last paragraph."""
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


# "- slot: value", ungrouped lines then " (msg 12, current; replaces <old>)" or " (set by the user)".
_FACT_LINE_RE = re.compile(r"^-\s+(?P<key>[^:\n]+?):\s+(?P<rest>.+)$")
_PROVENANCE_RE = re.compile(r"\s+\((?P<where>(?:msg \d+|set by the user)(?:,[^()]*)?)\)\s*$")
_REPLACES_RE = re.compile(r"\bcurrent; replaces (?P<old>.+)$")
# A commitment's or other fact's line adds " - <its one-line text>": a sentence of 3+ words.
_TEXT_SPLIT_RE = re.compile(r"\s-\s(?=[A-Z][^\s]*(?:\s+\S+){2,}$)")
GROUPED_SEPARATOR = "; "


@dataclass(frozen=True, kw_only=True)
class FactLine:
    """One key-facts line: ``values`` newest first (several on a grouped line), ``text`` a commitment's description,
    ``replaces`` the superseded value, ``pinned`` pinned or set by the user."""

    key: str
    values: tuple[str, ...]
    text: str = ""
    replaces: str = ""
    pinned: bool = False


def facts_lines(block: str) -> list[FactLine]:
    """The facts of a key-facts block (header line first); other lines are skipped, so a newer format still reads."""
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


# "- 2024-05-20 (chat "Trip", msg 123) User: text", later lines of the text indented by two spaces.
_RECALL_LINE_RE = re.compile(
    r"^-\s(?P<date>\d{4}-\d{2}-\d{2})\s\((?:chat\s\"(?P<chat>.*?)\",\s)?(?P<msgs>msgs?\s[\d,\s]+)\)\s"
    r"(?P<role>[A-Z][A-Za-z]*):\s?(?P<text>.*)$"
)


@dataclass(frozen=True, kw_only=True)
class RecalledItem:
    """One recall-block item, verbatim: ``messages`` is ``msg 12`` or ``msgs 12, 13``, ``chat`` ``""`` for none."""

    date: str
    chat: str
    messages: str
    role: str
    text: str

    @property
    def where(self) -> str:
        """``2024-05-20, msg 12``: the chat's title, often too long to repeat, is left out."""
        return f"{self.date}, {self.messages}"


def recall_items(block: str) -> list[RecalledItem]:
    """The items of a recall block (header line first), in order. Never raises."""
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
