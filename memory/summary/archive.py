"""The raw archive, the summary needing no LLM (docs/memory.md §4), and the summary block's header. Pure."""

from __future__ import annotations

import json
import re
from typing import Any

from memory.messages import Message
from memory.text.secrets import redact_secrets
from memory.tokens.counter import TokenCounter

RAW_ARCHIVE_LINE_CHARS = 500


RAW_ARCHIVE_MARKER = "[Raw archive of newly added messages]"


ARCHIVE_OMITTED = "- [{count} earlier archived messages omitted]"


_OMITTED_RE = re.compile(r"- \[(\d+) earlier archived messages omitted\]")


# Line lengths (characters) tried in turn when the archive is over its token cap.
ARCHIVE_LINE_STEPS = (RAW_ARCHIVE_LINE_CHARS, 200, 80)


SUMMARY_TRIMMED = "[… earlier summary trimmed to fit the summary cap]"


SUMMARY_SHORTENED = "[… summary shortened to fit the summary cap]"


# Where a sentence or line ends, in Latin and CJK punctuation.
_SENTENCE_END_RE = re.compile(r"[.!?…。！？](?=[\s\"')\]]|$)|\n")


def summary_header(*, summary_type: str, compressed_count: int) -> str:
    """The first line of the summary block (docs/memory.md §3 step 5): a raw archive says it is verbatim, true both
    when the summarizer failed and when the memory job has not compressed yet."""
    if summary_type == "raw":
        return f"[Memory Summary - {compressed_count} earlier messages archived verbatim (not summarized)]"
    return f"[Memory Summary - {compressed_count} earlier messages consolidated]"


def summary_block(*, content: str, summary_type: str, compressed_count: int, role: str) -> Message:
    """The message carrying the summary; ``role`` ``system``, or ``user`` for strict providers (F-10)."""
    header = summary_header(summary_type=summary_type, compressed_count=compressed_count)
    return {"role": role, "content": f"{header}\n{content}"}


def trim_summary(content: str, max_tokens: int, counter: TokenCounter) -> str:
    """A stored summary over the cap brought within ``max_tokens`` tokens without an LLM (docs/memory.md F-40): an
    archive as in :func:`raw_archive_merge`; a plain summary keeps its head (I7) and ends with a marker."""
    if counter.count_text(content) <= max_tokens:
        return content
    _, lines, omitted = _split_archive(content)
    if lines or omitted:
        return raw_archive_merge(content, [], max_tokens=max_tokens, counter=counter)
    # +2: the joining newline may not merge with either side's tokens.
    room = max_tokens - counter.count_text(SUMMARY_TRIMMED) - 2
    if room <= 0:
        return counter.truncate_text(content, max_tokens)
    return f"{counter.truncate_text(content, room).rstrip()}\n{SUMMARY_TRIMMED}"


def shorten_at_sentence(content: str, max_tokens: int, counter: TokenCounter) -> str:
    """A new summary over the cap cut to its whole sentences within ``max_tokens`` tokens, ending with
    :data:`SUMMARY_SHORTENED` (docs/memory.md §4): a cut is never silent and never mid-sentence."""
    if counter.count_text(content) <= max_tokens:
        return content
    room = max_tokens - counter.count_text(SUMMARY_SHORTENED) - 2
    head = counter.truncate_text(content, max(0, room))
    ends = [match.end() for match in _SENTENCE_END_RE.finditer(head)]
    cut = ends[-1] if ends else head.rfind(" ")
    return f"{head[: max(cut, 0)].rstrip()}\n{SUMMARY_SHORTENED}".lstrip("\n")


def raw_archive_line(message: Message) -> str:
    """One raw archive line (docs/memory.md §4), credentials withheld (F-51), cut to 500 characters of content."""
    role = message.get("role")
    content = _plain_text(message.get("content"))
    if role == "assistant":
        names = [(call.get("function") or {}).get("name", "?") for call in message.get("tool_calls") or ()]
        if names:
            arguments = "; ".join(
                f"{(call.get('function') or {}).get('name', '?')}({unescaped((call.get('function') or {}).get('arguments'))})"
                for call in message.get("tool_calls") or ()
            )
            content = f"{content} {arguments}".strip()
            label = f"Assistant [tools: {', '.join(names)}]"
        else:
            label = "Assistant"
    elif role == "tool":
        label = f"Tool[{message.get('name') or message.get('tool_call_id') or '?'}]"
    elif role == "system":
        label = "System"
    else:
        label = "User"
    if role in ("user", "assistant") and message.get("name"):
        label = f"{label} ({message['name']})"
    content = redact_secrets(" ".join(content.split()))
    if len(content) > RAW_ARCHIVE_LINE_CHARS:
        content = content[: RAW_ARCHIVE_LINE_CHARS - 1] + "…"
    return f"- {label}: {content}"


def raw_text(message: Message) -> str:
    """A message's text and tool-call arguments, unredacted: where its credentials are looked for (F-51)."""
    calls = [unescaped((call.get("function") or {}).get("arguments")) for call in message.get("tool_calls") or ()]
    return "\n".join([_plain_text(message.get("content")), *calls])


def unescaped(arguments: Any) -> str:
    """Tool-call arguments as text, JSON ``\\u`` escapes decoded ("密码" is a cue word, its escape is not, F-51)."""
    text = "" if arguments is None else str(arguments)
    if "\\u" in text:
        try:
            return json.dumps(json.loads(text), ensure_ascii=False)
        except ValueError:
            return text
    return text


def _plain_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return json.dumps(content, ensure_ascii=False)


def raw_archive_merge(previous_summary: str, messages: list[Message], *, max_tokens: int, counter: TokenCounter) -> str:
    """The degraded summary: ``previous_summary`` plus one merged raw-archive section (F-12). Over ``max_tokens``,
    lines shorten by :data:`ARCHIVE_LINE_STEPS`, then the oldest become an ``N … omitted`` count; the LLM-written part
    loses its tail last, so the archive always says how many messages it folded in. Credentials are withheld (F-51)."""
    base, old_lines, omitted = _split_archive(redact_secrets(previous_summary))
    lines = old_lines + [raw_archive_line(m) for m in messages]

    def section(kept: list[str], dropped: int, line_chars: int) -> str:
        cut = [line if len(line) <= line_chars else line[: line_chars - 1] + "…" for line in kept]
        head = [ARCHIVE_OMITTED.format(count=dropped)] if dropped else []
        return "\n".join([RAW_ARCHIVE_MARKER, *head, *cut])

    def render(kept: list[str], dropped: int, line_chars: int) -> str:
        return f"{base}\n\n{section(kept, dropped, line_chars)}" if base else section(kept, dropped, line_chars)

    # Shorter lines first, so more messages stay covered; then the oldest lines give way.
    for line_chars in ARCHIVE_LINE_STEPS:
        text = render(lines, omitted, line_chars)
        if counter.count_text(text) <= max_tokens:
            return text
    line_chars = ARCHIVE_LINE_STEPS[-1]
    # Binary search the number of oldest lines to drop: O(log n) renders, not O(n).
    low, high = 0, len(lines)
    while low < high:
        middle = (low + high) // 2
        if counter.count_text(render(lines[middle:], omitted + middle, line_chars)) <= max_tokens:
            high = middle
        else:
            low = middle + 1
    text = render(lines[low:], omitted + low, line_chars)
    if counter.count_text(text) <= max_tokens:
        return text
    tail = section([], omitted + len(lines), line_chars)
    room = max_tokens - counter.count_text(tail) - 4
    if room <= 0:
        return tail
    return f"{counter.truncate_text(base, room).rstrip()}…\n\n{tail}"


def _split_archive(summary: str) -> tuple[str, list[str], int]:
    """``(LLM-written part, archive lines, omitted count)`` of a stored summary text."""
    if RAW_ARCHIVE_MARKER not in summary:
        return summary.strip(), [], 0
    base, _, section = summary.partition(RAW_ARCHIVE_MARKER)
    lines = [line for line in section.strip().splitlines() if line.strip()]
    omitted = 0
    if lines and (match := _OMITTED_RE.fullmatch(lines[0].strip())):
        omitted = int(match.group(1))
        lines = lines[1:]
    return base.strip(), lines, omitted
