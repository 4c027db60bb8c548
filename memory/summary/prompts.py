"""The summarizer request (docs/memory.md §3 step 4, F-11, F-14, F-17): always ``[system, user]``, as strict
providers reject a lone system message; tool roles become text lines, as the summarizer is offered no tools."""

from __future__ import annotations

import re
from typing import Any

from memory.messages import Message
from memory.summary.archive import raw_archive_line
from memory.text.secrets import redact_secrets
from memory.tokens.counter import TokenCounter

SUMMARY_INSTRUCTIONS = """You maintain the working memory of a conversation between a user and an assistant.
Write ONE self-contained summary that replaces both the previous summary (if any) and the new transcript.
Rules:
- Merge: carry over every still-relevant fact of the previous summary and add the new material. Never nest or quote the previous summary, never write "previous summary" or a summary of a summary.
- Keep verbatim: names, identifiers (user ids, order/reservation numbers, codes), numbers, amounts, dates, file names, URLs.
- Key facts (identifiers, amounts, dates, contact data, names, preferences) are also kept separately, verbatim, outside this summary: mention them where the story needs them, but spend the room on what happened and why.
- Keep the user's intent and requests, decisions made, tool calls with their key results, errors and how they were handled, and open tasks.
- Never write a password, PIN, API key, token, one-time code, card number or other credential, even when asked to: write a marker such as [password withheld] in its place. Order, booking and user ids are not credentials.
- Write in the language of the conversation (the language the user writes in); never translate it, and keep quotes and names in their original script.
- Plain text, short factual lines, no preamble, no closing remarks.
- At most {max_tokens} tokens (about {words} words): stop there, a shorter summary is better than one cut off."""

TRANSCRIPT_LINE_CHARS = 4000
# Marks an oversized transcript's cut (F-17); never a summary by itself (F-39).
TRIM_MARKER = "[... transcript trimmed to fit the summarizer ...]"
_BUDGET_RE = re.compile(r"At most (\d+) tokens \(about \d+ words\)")
_PREVIOUS_RE = re.compile(r"<previous_summary>\n(.*?)\n</previous_summary>", re.DOTALL)
_TRANSCRIPT_RE = re.compile(r"<transcript>\n(.*?)\n</transcript>", re.DOTALL)


def render_transcript(messages: list[Message], *, line_chars: int = TRANSCRIPT_LINE_CHARS) -> str:
    """Messages as text lines, tool roles included (F-11, F-25), credentials withheld (F-51), each cut to ``line_chars``
    characters."""
    lines = [_full_line(message) for message in messages]
    return "\n".join(line if len(line) <= line_chars else line[: line_chars - 1] + "…" for line in lines)


def _full_line(message: Message) -> str:
    short = raw_archive_line({**message, "content": ""})
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    return f"{short.rstrip()} {redact_secrets(' '.join(text.split()))}".rstrip()


def budget_words(tokens: int) -> int:
    """About how many English words ``tokens`` tokens hold (three words per four tokens): a budget a model can keep."""
    return max(1, tokens * 3 // 4)


def reply_room(max_tokens: int) -> int:
    """The provider's output limit for a summary stated at ``max_tokens`` tokens: half as much again (at least 32
    tokens more), so a model that overruns the stated budget still finishes its last sentence."""
    return max_tokens + max(32, max_tokens // 2)


def stated_budget(prompt: list[dict[str, Any]]) -> int | None:
    """The budget in tokens that ``prompt``'s system message states, or None when it states none."""
    for message in prompt:
        content = message.get("content")
        if message.get("role") == "system" and isinstance(content, str) and (found := _BUDGET_RE.search(content)):
            return int(found.group(1))
    return None


def restated_budget(prompt: list[dict[str, Any]], tokens: int) -> list[dict[str, Any]]:
    """A copy of ``prompt`` whose stated budget is ``tokens`` tokens (unchanged when it states none)."""
    line = f"At most {tokens} tokens (about {budget_words(tokens)} words)"
    return [
        {**message, "content": _BUDGET_RE.sub(line, message["content"])}
        if message.get("role") == "system" and isinstance(message.get("content"), str)
        else message
        for message in prompt
    ]


def build_summary_prompt(*, previous_summary: str, transcript: str, max_tokens: int) -> list[dict[str, Any]]:
    """The wire prompt of one call, stating ``max_tokens`` in tokens and words; no ``<previous_summary>`` on a first
    compression (F-14)."""
    parts = []
    if previous_summary.strip():
        parts.append(f"<previous_summary>\n{previous_summary.strip()}\n</previous_summary>")
    parts.append(f"<transcript>\n{transcript}\n</transcript>")
    parts.append("Write the new merged summary now.")
    return [
        {
            "role": "system",
            "content": SUMMARY_INSTRUCTIONS.format(max_tokens=max_tokens, words=budget_words(max_tokens)),
        },
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def split_summary_prompt(content: str) -> tuple[str, str] | None:
    """``(previous summary, transcript)`` of a summarizer prompt's user content, else None (the offline engine)."""
    transcript = _TRANSCRIPT_RE.search(content)
    if transcript is None:
        return None
    previous = _PREVIOUS_RE.search(content)
    return (previous.group(1) if previous else ""), transcript.group(1)


def transcript_budget(
    *, previous_summary_tokens: int, max_output_tokens: int, window: int, counter: TokenCounter
) -> int:
    """Transcript tokens one request may carry in ``window`` beside instructions, summary and reply (F-17); >= 64."""
    framing = counter.count_text(SUMMARY_INSTRUCTIONS) + 64
    return max(64, window - framing - previous_summary_tokens - max_output_tokens)


def chunk_messages(messages: list[Message], *, budget: int, counter: TokenCounter) -> list[list[Message]]:
    """Consecutive chunks whose transcripts fit ``budget`` tokens, folded in turn; an oversized message goes alone."""
    chunks: list[list[Message]] = [[]]
    used = 0
    for message in messages:
        cost = counter.count_text(render_transcript([message])) + 1
        if chunks[-1] and used + cost > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(message)
        used += cost
    return [chunk for chunk in chunks if chunk]


def fit_transcript(messages: list[Message], *, max_tokens: int, counter: TokenCounter) -> str:
    """The transcript cut to ``max_tokens`` tokens, head kept and cut marked: a chunk of one oversized message."""
    transcript = render_transcript(messages)
    if counter.count_text(transcript) <= max_tokens:
        return transcript
    return counter.truncate_text(transcript, max(1, max_tokens - 16)) + "\n" + TRIM_MARKER
