"""A deterministic extractive summarizer, the offline stand-in for an LLM one: keeps the sentences likely to matter
later (identifiers, numbers, dates, requests, tool traffic) in one flat text (docs/memory.md F-12, I7)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from memory.ports import SummaryRequest
from memory.summary.archive import RAW_ARCHIVE_MARKER
from memory.summary.chain import METHOD_EXTRACTIVE, is_marker_line
from memory.summary.prompts import split_summary_prompt, stated_budget
from memory.text.secrets import redact_secrets
from memory.text.sentences import split_sentences
from memory.tokens.counter import TokenCounter, get_counter

_LINE_RE = re.compile(r"^- (?P<label>[^:\n]{1,80}): ?(?P<text>.*)$")
_CLAUSE_END_RE = re.compile(r"[,;:](?=\s)|[，、：；]")
# ASCII look-arounds, not \b: in "订单号是ZX-88213" the CJK character is a word character.
_IDENTIFIER_RE = re.compile(
    r"(?<![A-Za-z0-9_-])(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{4,}(?![A-Za-z0-9_-])"
    r"|(?<![A-Za-z0-9])[A-Z]{2,}[0-9A-Z]{2,}(?![A-Za-z0-9])|(?<![A-Za-z0-9_])[A-Za-z0-9]+_[A-Za-z0-9_]+"
)
_NUMBER_RE = re.compile(r"\d")
_DATE_RE = re.compile(
    r"\b(\d{4}-\d{2}-\d{2}|jan(uary)?|feb(ruary)?|mar(ch)?|apr(il)?|may|june?|july?|aug(ust)?|sep(tember)?|oct(ober)?|"
    r"nov(ember)?|dec(ember)?|monday|tuesday|wednesday|thursday|friday|saturday|sunday|today|tomorrow|yesterday)\b"
    r"|[今明昨]天|星期|周[一二三四五六日]|\d+\s*[年月日号]",
    re.IGNORECASE,
)
_REQUEST_RE = re.compile(
    r"\?|？|\b(please|i want|i need|i'd like|i would like|can you|could you|remember|my name|book|cancel|change|update|refund)\b"
    r"|请|帮我|我想|我要|我需要|记住|取消|预订|退款",
    re.IGNORECASE,
)
# The user about themselves ("my dog is called …", "我对青霉素过敏"): digit-free facts to keep (F-32).
_SELF_RE = re.compile(r"\b(i|i'm|i am|i've|i have|my|mine|me|we|we're|our)\b|我", re.IGNORECASE)
# A capitalised word after the first one of a sentence: most likely a name (Biscuit, Lisbon, Ada).
_NAME_RE = re.compile(r"(?<=[\s,;:(\"“])[A-Z][a-z]+(?:[-'][A-Za-z]+)*\b")
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_CJK_EDGE_RE = re.compile(_CJK_RE.pattern[:-1] + "。！？；，、：「」『』（）]")
# Longer sentences (characters) are kept in pieces of PIECE_CHARS: a cut never loses a CJK sentence's end (F-39).
SENTENCE_CHARS = 300
PIECE_CHARS = 100
# Characters of a sentence that count towards its rank; longer adds nothing (docs/memory.md F-39).
RANK_CHARS_CAP = 120
# Share of a full summary's room reserved for newly summarized material.
NEW_SHARE = 0.4
SUMMARY_MODEL = "extractive"


def _salience(label: str, sentence: str) -> int:
    """How likely ``sentence`` is to matter later; 0 for small talk."""
    score = 0
    if _IDENTIFIER_RE.search(sentence):
        score += 3
    if _NUMBER_RE.search(sentence):
        score += 2
    if _DATE_RE.search(sentence):
        score += 2
    if _NAME_RE.search(sentence):
        score += 2
    if label == "User" and _REQUEST_RE.search(sentence):
        score += 3
    if label == "User" and _SELF_RE.search(sentence):
        score += 2
    if "[tools:" in label or label.startswith("Tool"):
        score += 1
    return score


def _rank(salience: int, sentence: str) -> float:
    """Salience plus up to 3 for length (a CJK character weighs three): the more informative wins, not the shorter."""
    weighted = len(sentence) + 2 * len(_CJK_RE.findall(sentence))
    return salience + min(weighted, RANK_CHARS_CAP) / (RANK_CHARS_CAP / 3)


def _split_long(sentence: str, limit: int = PIECE_CHARS) -> list[str]:
    """``sentence``, or over :data:`SENTENCE_CHARS` its pieces of at most ``limit`` characters, cut at clause
    breaks, else a space, else anywhere; joined again they give it back."""
    if len(sentence) <= SENTENCE_CHARS:
        return [sentence]
    clauses, start = [], 0
    for match in _CLAUSE_END_RE.finditer(sentence):
        clauses.append(sentence[start : match.end()])
        start = match.end()
    clauses.append(sentence[start:])
    pieces: list[str] = []
    current = ""
    for clause in clauses:
        while len(clause) > limit:  # one clause longer than the limit: cut at a space if any
            cut = clause.rfind(" ", 0, limit)
            cut = cut if cut > limit // 2 else limit
            if current:
                pieces.append(current)
                current = ""
            pieces.append(clause[:cut])
            clause = clause[cut:]
        if len(current) + len(clause) > limit:
            pieces.append(current)
            current = ""
        current += clause
    pieces.append(current)
    return [piece.strip() for piece in pieces if piece.strip()]


@dataclass(frozen=True)
class _Unit:
    """A sentence or a piece of one; ``joined_*``: continued by the neighbouring piece."""

    text: str
    rank: float
    joined_before: bool = False
    joined_after: bool = False


@dataclass(frozen=True)
class _Line:
    """One transcript line reduced to the units worth keeping, in transcript order."""

    label: str
    units: tuple[_Unit, ...]

    def render(self, keep: frozenset[int] | None = None) -> str:
        """The line with the units in ``keep`` (all by default), ``…`` where a sentence's piece is left out."""
        parts = []
        for index, unit in enumerate(self.units):
            if keep is not None and index not in keep:
                continue
            text = unit.text
            if unit.joined_before and keep is not None and index - 1 not in keep:
                text = "…" + text
            if unit.joined_after and keep is not None and index + 1 not in keep:
                text += "…"
            parts.append(text)
        body = _join(parts)
        return f"- {self.label}: {body}" if self.label else body

    def shortened(self, budget: int, counter: TokenCounter) -> str | None:
        """The line's best-ranked units fitting ``budget`` tokens, in order, or None: a long line sheds its least
        informative sentences instead of vanishing (F-39)."""
        keep: set[int] = set()
        best: str | None = None
        for index in sorted(range(len(self.units)), key=lambda i: (-self.units[i].rank, i)):
            candidate = self.render(frozenset(keep | {index}))
            if counter.count_text(candidate) + 1 <= budget:
                keep.add(index)
                best = candidate
        return best


def _join(parts: list[str]) -> str:
    """``parts`` joined by spaces, but not next to CJK text."""
    text = ""
    for part in parts:
        if text and not (_CJK_EDGE_RE.match(text[-1]) or _CJK_EDGE_RE.match(part[0])):
            text += " "
        text += part
    return text


def _extract_line(line: str) -> _Line | None:
    """The salient units of a transcript line, or None. A user line keeps at least its best sentence; tool-call and
    unlabelled lines stay whole; marker lines never (F-39)."""
    stripped = line.strip()
    if not stripped or is_marker_line(stripped):
        return None
    match = _LINE_RE.match(stripped)
    label, text = (match.group("label"), match.group("text")) if match else ("", stripped)
    units: list[tuple[_Unit, int]] = []
    for sentence in split_sentences(text):
        sentence = " ".join(sentence.split())
        pieces = _split_long(sentence)
        for number, piece in enumerate(pieces):
            salience = _salience(label, piece)
            unit = _Unit(piece, _rank(salience, piece), number > 0, number < len(pieces) - 1)
            units.append((unit, salience))
    if not units:
        return None
    kept = [unit for unit, salience in units if salience > 0]
    if not label or "[tools:" in label:
        kept = [unit for unit, _ in units]
    elif not kept and label == "User":
        kept = [max((unit for unit, _ in units), key=lambda unit: unit.rank)]
    return _Line(label, _relinked(kept, [unit for unit, _ in units])) if kept else None


def _relinked(kept: list[_Unit], units: list[_Unit]) -> tuple[_Unit, ...]:
    """``kept`` with ``joined_*`` true only towards kept neighbours, ``…`` on a dropped side."""
    chosen = {id(unit) for unit in kept}
    result = []
    for index, unit in enumerate(units):
        if id(unit) not in chosen:
            continue
        before_dropped = unit.joined_before and id(units[index - 1]) not in chosen
        after_dropped = unit.joined_after and id(units[index + 1]) not in chosen
        text = ("…" if before_dropped else "") + unit.text + ("…" if after_dropped else "")
        result.append(
            _Unit(text, unit.rank, unit.joined_before and not before_dropped, unit.joined_after and not after_dropped)
        )
    return tuple(result)


def extractive_summary(
    previous_summary: str, transcript: str, *, max_tokens: int, counter: TokenCounter | None = None
) -> str:
    """Merge ``previous_summary``'s lines with the salient sentences of ``transcript`` (``- Label: text`` lines)
    into one flat text of at most ``max_tokens`` tokens, ``""`` when nothing is worth keeping. Deterministic; marker
    lines are never kept, so the result is never a bare marker (F-36, F-39); credentials are withheld (F-51)."""
    counter = counter or get_counter(SUMMARY_MODEL)
    previous_summary, transcript = redact_secrets(previous_summary), redact_secrets(transcript)
    previous_lines = [
        line.strip()
        for line in previous_summary.replace(RAW_ARCHIVE_MARKER, "").splitlines()
        if line.strip() and not is_marker_line(line)
    ]
    new_lines = [extracted for line in transcript.splitlines() if (extracted := _extract_line(line))]
    if not new_lines and not previous_lines:
        new_lines = _best_single_unit(transcript)
    old_cost = sum(counter.count_text(line) + 1 for line in previous_lines)
    new_cost = sum(counter.count_text(line.render()) + 1 for line in new_lines)
    # Over budget, the new material gets up to NEW_SHARE and the old lines give way from their end (I7).
    new_budget = min(new_cost, max(int(max_tokens * NEW_SHARE), max_tokens - old_cost))
    kept = _fit(previous_lines, max_tokens - new_budget, counter, set())
    used = sum(counter.count_text(line) + 1 for line in kept)
    kept += _fit_new(new_lines, max_tokens - used, counter, set(kept))
    return "\n".join(kept)


def _best_single_unit(transcript: str) -> list[_Line]:
    """The transcript's most informative sentence, so a non-empty transcript never gives an empty summary."""
    candidates = []
    for line in transcript.splitlines():
        if not line.strip() or is_marker_line(line):
            continue
        match = _LINE_RE.match(line.strip())
        label, text = (match.group("label"), match.group("text")) if match else ("", line.strip())
        for sentence in split_sentences(text):
            for piece in _split_long(" ".join(sentence.split())):
                candidates.append(_Line(label, (_Unit(piece, _rank(0, piece)),)))
    return [max(candidates, key=lambda line: line.units[0].rank)] if candidates else []


def _fit(lines: list[str], budget: int, counter: TokenCounter, seen: set[str]) -> list[str]:
    """The lines, in order and without repeats, that fit ``budget`` tokens (greedy)."""
    kept: list[str] = []
    for line in lines:
        cost = counter.count_text(line) + 1
        if line in seen or cost > budget:
            continue
        kept.append(line)
        seen.add(line)
        budget -= cost
    return kept


def _fit_new(lines: list[_Line], budget: int, counter: TokenCounter, seen: set[str]) -> list[str]:
    """The new lines within ``budget`` tokens, in order, no repeats: whole where they fit, then shortened."""
    rendered = [line.render() for line in lines]
    chosen: dict[int, str] = {}
    for index, text in enumerate(rendered):
        cost = counter.count_text(text) + 1
        if text in seen or cost > budget:
            continue
        chosen[index] = text
        seen.add(text)
        budget -= cost
    for index, line in enumerate(lines):
        if index in chosen or rendered[index] in seen:
            continue
        short = line.shortened(budget, counter)
        if short is None or short in seen:
            continue
        chosen[index] = short
        seen.add(short)
        budget -= counter.count_text(short) + 1
    return [chosen[index] for index in sorted(chosen)]


class ExtractiveSummarizer:
    """:class:`memory.ports.Summarizer` backed by :func:`extractive_summary`; no LLM."""

    model = SUMMARY_MODEL
    method = METHOD_EXTRACTIVE

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter

    @staticmethod
    def is_prompt(content: str) -> bool:
        return split_summary_prompt(content) is not None

    @staticmethod
    def reply(content: str, *, max_tokens: int, prompt: list[dict[str, Any]] | None = None) -> str | None:
        """The extractive summary a summarizer prompt's ``content`` asks for, None for other content (the offline
        engine's answer); within ``max_tokens`` tokens and the budget the whole ``prompt`` states, as a good model."""
        parsed = split_summary_prompt(content)
        stated = stated_budget(prompt or [])
        budget = min(max_tokens, stated) if stated else max_tokens
        return None if parsed is None else extractive_summary(*parsed, max_tokens=budget)

    async def summarize(self, request: SummaryRequest) -> str:
        parsed = split_summary_prompt(request.prompt[-1]["content"])
        previous, transcript = parsed if parsed else (request.previous_summary, "")
        return extractive_summary(previous, transcript, max_tokens=request.max_tokens, counter=self.counter)
