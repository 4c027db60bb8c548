"""The summarizer request: instructions, transcript rendering and chunking (docs/memory.md §3
step 4; docs/memory.md F-11, F-14, F-17).

The request is always ``[system: instructions, user: material]``: strict providers reject a lone
system message, and tool roles are rendered as text lines so that no tool message reaches a
summarizer that was offered no tools.
"""

from __future__ import annotations

import re
from typing import Any

from memory.messages import Message
from memory.summary.archive import raw_archive_line
from memory.tokens.counter import TokenCounter

SUMMARY_INSTRUCTIONS = """You maintain the working memory of a conversation between a user and an assistant.
Write ONE self-contained summary that replaces both the previous summary (if any) and the new transcript.
Rules:
- Merge: carry over every still-relevant fact of the previous summary and add the new material. Never nest or quote the previous summary, never write "previous summary" or a summary of a summary.
- Keep verbatim: names, identifiers (user ids, order/reservation numbers, codes), numbers, amounts, dates, file names, URLs.
- Key facts (identifiers, amounts, dates, contact data, names, preferences) are also kept separately, verbatim, outside this summary: mention them where the story needs them, but spend the room on what happened and why.
- Keep the user's intent and requests, decisions made, tool calls with their key results, errors and how they were handled, and open tasks.
- Write in the language of the conversation (the language the user writes in); never translate it, and keep quotes and names in their original script.
- Plain text, short factual lines, no preamble, no closing remarks.
- At most {max_tokens} tokens."""

TRANSCRIPT_LINE_CHARS = 4000
# Marks where an oversized transcript was cut (F-17). It is never a summary by itself: the chain
# refuses a reply made only of markers and the extractive summarizer skips it (docs/memory.md F-39).
TRIM_MARKER = "[... transcript trimmed to fit the summarizer ...]"
_PREVIOUS_RE = re.compile(r"<previous_summary>\n(.*?)\n</previous_summary>", re.DOTALL)
_TRANSCRIPT_RE = re.compile(r"<transcript>\n(.*?)\n</transcript>", re.DOTALL)


def render_transcript(messages: list[Message], *, line_chars: int = TRANSCRIPT_LINE_CHARS) -> str:
    """Messages as text lines for the summarizer (tool roles included, F-11; ``content: null``
    on tool-call messages is fine, F-25). Each line is cut to ``line_chars`` characters."""
    lines = [_full_line(message) for message in messages]
    return "\n".join(line if len(line) <= line_chars else line[: line_chars - 1] + "…" for line in lines)


def _full_line(message: Message) -> str:
    short = raw_archive_line({**message, "content": ""})
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    return f"{short.rstrip()} {' '.join(text.split())}".rstrip()


def build_summary_prompt(*, previous_summary: str, transcript: str, max_tokens: int) -> list[dict[str, Any]]:
    """The wire prompt for one summarizer call. The ``<previous_summary>`` section is absent on
    a session's first compression (F-14)."""
    parts = []
    if previous_summary.strip():
        parts.append(f"<previous_summary>\n{previous_summary.strip()}\n</previous_summary>")
    parts.append(f"<transcript>\n{transcript}\n</transcript>")
    parts.append("Write the new merged summary now.")
    return [
        {"role": "system", "content": SUMMARY_INSTRUCTIONS.format(max_tokens=max_tokens)},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def split_summary_prompt(content: str) -> tuple[str, str] | None:
    """``(previous summary, transcript)`` parsed from a summarizer prompt's user content, or
    None when ``content`` is not a summarizer prompt (used by the offline engine)."""
    transcript = _TRANSCRIPT_RE.search(content)
    if transcript is None:
        return None
    previous = _PREVIOUS_RE.search(content)
    return (previous.group(1) if previous else ""), transcript.group(1)


def transcript_budget(
    *, previous_summary_tokens: int, max_output_tokens: int, window: int, counter: TokenCounter
) -> int:
    """Tokens of transcript one summarizer request may carry within ``window`` tokens: what is
    left after the instructions, the previous summary (at most ``previous_summary_tokens``), the
    prompt's framing and ``max_output_tokens`` of reply (docs/memory.md F-17). At least 64."""
    framing = counter.count_text(SUMMARY_INSTRUCTIONS) + 64
    return max(64, window - framing - previous_summary_tokens - max_output_tokens)


def chunk_messages(messages: list[Message], *, budget: int, counter: TokenCounter) -> list[list[Message]]:
    """Split ``messages`` into consecutive chunks whose transcripts fit ``budget`` tokens (see
    :func:`transcript_budget`). Chunks are folded one after another, each merged into the summary
    produced by the one before. A single message larger than the budget gets a chunk of its own
    and its line is trimmed by :func:`fit_transcript`."""
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
    """The transcript of ``messages`` cut to at most ``max_tokens`` tokens (keeping its head
    and marking the cut); used for a chunk that is one oversized message."""
    transcript = render_transcript(messages)
    if counter.count_text(transcript) <= max_tokens:
        return transcript
    return counter.truncate_text(transcript, max(1, max_tokens - 16)) + "\n" + TRIM_MARKER
