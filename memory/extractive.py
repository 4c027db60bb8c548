"""A deterministic extractive summarizer: the offline stand-in for an LLM summarizer.

It keeps the transcript sentences most likely to matter later (identifiers, numbers, dates,
user requests and questions, tool calls and their results) and merges them under the previous
summary, so it honours the same contract as an LLM summarizer: one flat self-contained text
(docs/memory.md F-12) within ``max_tokens``. Older facts keep priority over newer ones (docs/memory.md I7).
"""

from __future__ import annotations

import re

from memory.core import RAW_ARCHIVE_MARKER
from memory.prompts import split_summary_prompt
from memory.summarizer import SummaryRequest
from memory.tokens import TokenCounter, get_counter

_LINE_RE = re.compile(r"^- (?P<label>[^:\n]{1,80}): ?(?P<text>.*)$")
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+")
_IDENTIFIER_RE = re.compile(
    r"\b(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{4,}\b|\b[A-Z]{2,}[0-9A-Z]{2,}\b|\b\w+_\w+\b"
)
_NUMBER_RE = re.compile(r"\d")
_DATE_RE = re.compile(
    r"\b(\d{4}-\d{2}-\d{2}|jan(uary)?|feb(ruary)?|mar(ch)?|apr(il)?|may|june?|july?|aug(ust)?|sep(tember)?|oct(ober)?|"
    r"nov(ember)?|dec(ember)?|monday|tuesday|wednesday|thursday|friday|saturday|sunday|today|tomorrow|yesterday)\b",
    re.IGNORECASE,
)
_REQUEST_RE = re.compile(
    r"\?|\b(please|i want|i need|i'd like|i would like|can you|could you|remember|my name|book|cancel|change|update|refund)\b",
    re.IGNORECASE,
)
SENTENCE_CHARS = 300
# Share of a full summary's room reserved for newly summarized material.
NEW_SHARE = 0.4
SUMMARY_MODEL = "extractive"


def _score(label: str, sentence: str) -> int:
    score = 0
    if _IDENTIFIER_RE.search(sentence):
        score += 3
    if _NUMBER_RE.search(sentence):
        score += 2
    if _DATE_RE.search(sentence):
        score += 2
    if label == "User" and _REQUEST_RE.search(sentence):
        score += 3
    if "[tools:" in label or label.startswith("Tool"):
        score += 1
    return score


def _extract_line(line: str) -> str | None:
    match = _LINE_RE.match(line.strip())
    if match is None:
        return line.strip() or None
    label, text = match.group("label"), " ".join(match.group("text").split())
    sentences = [s for s in _SENTENCE_RE.split(text) if s.strip()]
    kept = [s for s in sentences if _score(label, s) > 0]
    if not kept and label == "User" and sentences:
        kept = sentences[:1]
    if "[tools:" in label and not kept:
        kept = [text]
    if not kept:
        return None
    body = " ".join(s if len(s) <= SENTENCE_CHARS else s[: SENTENCE_CHARS - 1] + "…" for s in kept)
    return f"- {label}: {body}"


def extractive_summary(
    previous_summary: str, transcript: str, *, max_tokens: int, counter: TokenCounter | None = None
) -> str:
    """Merge ``previous_summary`` (its lines, raw archive lines included) with the salient
    sentences of ``transcript`` (lines ``- Label: text``) into one flat text of at most
    ``max_tokens`` tokens. When everything does not fit, the new material keeps up to 40 % of
    the room and the previous summary loses its most recent lines first, so the first facts and
    the newest ones both survive. Deterministic. Returns ``""`` when nothing is worth keeping."""
    counter = counter or get_counter(SUMMARY_MODEL)
    previous_lines = [
        line.strip()
        for line in previous_summary.replace(RAW_ARCHIVE_MARKER, "").splitlines()
        if line.strip() and not line.strip().endswith("earlier archived messages omitted]")
    ]
    new_lines = [extracted for line in transcript.splitlines() if (extracted := _extract_line(line))]
    old_cost = sum(counter.count_text(line) + 1 for line in previous_lines)
    new_cost = sum(counter.count_text(line) + 1 for line in new_lines)
    # When both do not fit, the new material gets up to NEW_SHARE of the room and the old lines
    # give way from their end: the earliest facts (docs/memory.md I7) and the newest both survive.
    new_budget = min(new_cost, max(int(max_tokens * NEW_SHARE), max_tokens - old_cost))
    kept = _fit(previous_lines, max_tokens - new_budget, counter, set())
    used = sum(counter.count_text(line) + 1 for line in kept)
    kept += _fit(new_lines, max_tokens - used, counter, set(kept))
    return "\n".join(kept)


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


class ExtractiveSummarizer:
    """:class:`memory.summarizer.Summarizer` backed by :func:`extractive_summary`; no LLM."""

    model = SUMMARY_MODEL

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter

    async def summarize(self, request: SummaryRequest) -> str:
        parsed = split_summary_prompt(request.prompt[-1]["content"])
        previous, transcript = parsed if parsed else (request.previous_summary, "")
        return extractive_summary(previous, transcript, max_tokens=request.max_tokens, counter=self.counter)
