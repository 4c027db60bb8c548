"""Which parts of a user message the user says about themselves, and which they quote or paste (F-49, F-50): a forwarded
email's "my name is Tom" is not the user's name. Kinds: ``own``, ``quoted`` (``>`` lines, reported speech),
``forwarded`` (to the end or an end marker), ``code``, ``log``, ``table`` (3+ rows) and ``document`` (announced, or a
paragraph far longer than chat); :func:`repetitive_values` finds bursts of one-shaped values (a log's ids) for
extraction to collapse or cap. Pure."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

ProvenanceKind = Literal["own", "quoted", "forwarded", "code", "log", "table", "document"]

# A paragraph this long (characters) is a pasted passage, not chat.
DOCUMENT_CHARS = 1200
# Rows that make a table.
TABLE_MIN_ROWS = 3
# Values of one shape in one message that make a burst.
BURST_MIN_VALUES = 4


@dataclass(frozen=True, slots=True)
class ProvenanceSpan:
    """``text[start:end]`` (character offsets) has provenance ``kind``."""

    start: int
    end: int
    kind: ProvenanceKind


@dataclass(frozen=True, slots=True)
class ValueBurst:
    """Values of one ``shape`` seen together, in order, and their ``indexes`` in what :func:`repetitive_values` got."""

    shape: str
    values: tuple[str, ...]
    indexes: tuple[int, ...]


_FENCE = re.compile(r"^[ \t]{0,3}(```|~~~)")
# Where a forwarded part starts: a marker ("-----Original Message-----", "---- From: …") or a cue ending in a colon
# ("my boss forwarded this:", "Fwd:", "转发给我:"); the rest of the message is forwarded.
_FORWARD = re.compile(
    r"(?P<marker>-{2,}\s*(?:forwarded message|original message|weitergeleitete nachricht|message transféré"
    r"|mensaje reenviado)\s*-{2,}|begin forwarded message:|-{3,}\s*(?=(?:from|von|de|发件人)\s*[:：])"
    r"|-*\s*(?:转发的邮件|转发邮件|原始邮件|转发的消息|以下为转发内容)\s*-*)"
    r"|(?P<cue>\b(?:forwarded|forwarding|fwd?)\b[^\n:：.!?]{0,40}[:：]|转发(?:了|给我)?[^\n:：。]{0,20}[:：])",
    re.IGNORECASE,
)
# Substrings without which _FORWARD cannot match (a cheap test before the slow alternation).
_FORWARD_NEEDLES = (
    "forward",
    "fwd",
    "fw",
    "original message",
    "---",
    "weitergeleitet",
    "transféré",
    "reenviado",
    "转发",
    "原始邮件",
)
_FORWARD_END = re.compile(
    r"-{2,}\s*end (?:of )?forwarded message\s*-{2,}|\(end of forwarded message\)|^\s*end of forwarded message\.?\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_HEADER = re.compile(
    r"^[\s>]*(?:from|to|cc|bcc|subject|date|sent|reply-to|von|an|betreff|datum|gesendet|de|à|objet|envoyé|para|asunto"
    r"|fecha|enviado|发件人|收件人|抄送|主题|日期|发送时间)\s*[:：]",
    re.IGNORECASE,
)
_WROTE = re.compile(
    r"^[\s>]*(?:on .{4,80}(?:wrote|writes)|am .{4,80}schrieb .{1,60}|le .{4,80}a écrit|el .{4,80}escribió)\s*:?\s*$"
    r"|^[\s>]*.{1,60}\s(?:wrote|schrieb|a écrit|escribió)\s*:\s*$|^.{1,40}(?:写道|寫道)\s*[:：]\s*$",
    re.IGNORECASE,
)
# "[12:03] Alice: …", "12:03 Alice: …", "Alice (12:03): …", "11/02/26, 12:03 - Alice: …".
_CHAT_LINE = re.compile(
    r"^\s*(?:\[[^\]\n]{4,25}\]\s*|\d{1,2}:\d{2}(?::\d{2})?\s+|\d{1,4}[/.-]\d{1,2}[/.-]\d{1,4},?\s+\d{1,2}:\d{2}\s*-\s*)"
    r"(?P<name>[^\W\d][\w .'-]{0,30}?)\s*[:：]\s"
    r"|^\s*(?P<name2>[^\W\d][\w .'-]{0,30}?)\s*\(\d{1,2}:\d{2}(?::\d{2})?\)\s*[:：]"
)
_LOG_LEVEL = r"(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|FATAL|CRITICAL|SEVERE)"
_LOG_LINE = re.compile(
    rf"^\s*(?:\[?\d{{4}}-\d{{2}}-\d{{2}}[T ]\d{{2}}:\d{{2}}(?::\d{{2}}(?:[.,]\d+)?)?(?:Z|[+-]\d{{2}}:?\d{{2}})?\]?"
    rf"|\[?\d{{2}}:\d{{2}}:\d{{2}}(?:[.,]\d+)?\]?|\[?{_LOG_LEVEL}\]?[\s:])"
    rf"|^\s*\w{{3}} \d{{1,2}} \d{{2}}:\d{{2}}:\d{{2}} "
    rf"|^\s*(?:(?i:mon|tue|wed|thu|fri|sat|sun)[a-z]*\.?,?\s+)?\d{{1,2}}:\d{{2}}(?::\d{{2}})?\s"
)
_TRACE_LINE = re.compile(
    r"^Traceback \(most recent call last\):|^\s+File \".*\", line \d+|^\s+at [\w.$<>]+\(.*\)\s*$"
    r"|^(?:[\w.]+\.)?\w*(?:Error|Exception)(?::.*)?$|^\s+\.\.\. \d+ more\s*$|^Caused by: "
)
_MD_ROW = re.compile(r"^\s*\|.*\|\s*$")
_INDENTED = re.compile(r"^(?: {4}|\t)\S")
_DOCUMENT_CUE = re.compile(
    r"(?:here(?:'s| is) (?:the|my|a|his|her|their) (?:document|text|article|letter|email|essay|contract|report|draft|passage"
    r"|policy|terms|notes?|transcript|description)|(?:pasted|copied|quoted|included) (?:it |the text )?below"
    r"|(?:the|full) text (?:is )?below|see (?:the text )?below|below is (?:the|my)"
    r"|以下是|全文如下|原文如下|内容如下|如下所示|hier ist (?:der|das|die) (?:text|dokument)|voici le (?:texte|document)"
    r"|aquí está el (?:texto|documento))[^\n]{0,40}[:：]\s*$",
    re.IGNORECASE,
)
_SAYS = (
    r"(?:said|says|wrote|writes|replied|asked|texted|messaged|told me|tells me|put it|reads|read|goes|stated|"
    r"sagte|schrieb|a dit|a écrit|dijo|escribió)"
)
# "he said: "…"", "the email says "…"", "Tom wrote “…”".
_QUOTE_AFTER_CUE = re.compile(
    rf"\b{_SAYS}(?:\s+(?:to me|me|that))?\s*[:,]?\s*(?P<open>[\"“«„「『])"
    r"|(?:说|说道|写道|写着|回复|问)\s*[:：，,]?\s*(?P<zhopen>[“「『\"])",
    re.IGNORECASE,
)
# A quotation followed by its cue: "“…,” she said".
_QUOTE_BEFORE_CUE = re.compile(
    rf"(?P<quote>[\"“«„][^\"”»\n]{{2,400}}[\"”»])\s*,?\s*(?:he|she|they|it|[A-Z][a-z]+|my \w+|the \w+)\s+{_SAYS}\b"
)
# "he said: my name is Tom" (a reported line without quotation marks, to the end of the line).
_SAID_COLON = re.compile(rf"\b(?:he|she|they|it|[A-Z][a-z]+|my \w+|the \w+)\s+{_SAYS}\s*:\s*(?P<rest>[^\"“«„\s][^\n]*)")
_ALNUM_RUN = re.compile(r"[^\W_]+")
_CLOSING = {'"': '"', "“": "”", "«": "»", "„": "“", "「": "」", "『": "』"}


def text_spans(text: str) -> list[ProvenanceSpan]:
    """``text`` as consecutive spans of one provenance each, covering it with no gap (a newline belongs to its line),
    neighbours of one kind merged; ``[]`` for an empty text. Blocks are decided per line, quotations inside the user's
    own lines per character. Never raises."""
    if not text:
        return []
    lower = text.lower()
    forward = _FORWARD.search(text) if any(needle in lower for needle in _FORWARD_NEEDLES) else None
    if forward:
        cut = forward.start() if forward["marker"] else forward.end()
        end = _FORWARD_END.search(text, cut)
        stop = end.end() if end else len(text)
        after = [ProvenanceSpan(s.start + stop, s.end + stop, s.kind) for s in text_spans(text[stop:])]
        return _merged([*_block_spans(text[:cut]), ProvenanceSpan(cut, stop, "forwarded"), *after])
    return _block_spans(text)


def _block_spans(text: str) -> list[ProvenanceSpan]:
    """:func:`text_spans` of a text with no forwarded marker or cue."""
    if not text:
        return []
    lines = text.splitlines(keepends=True)
    kinds = _line_kinds([line.rstrip("\r\n") for line in lines])
    spans: list[ProvenanceSpan] = []
    position = 0
    for line, kind in zip(lines, kinds, strict=True):
        if kind == "own":
            spans += _inline_quotes(text, position, position + len(line))
        else:
            spans.append(ProvenanceSpan(position, position + len(line), kind))
        position += len(line)
    return _merged(spans)


def own_text(text: str) -> str:
    """Only the user's own words of ``text`` (:func:`text_spans` of kind ``own``), joined as they
    stood; what extraction may read as statements about the user."""
    return "".join(text[span.start : span.end] for span in text_spans(text) if span.kind == "own")


def value_shape(value: str) -> str:
    """The shape of a value: each run of digits becomes ``9``, of letters ``a``, of mixed
    letters and digits ``x``; other characters stay (``#W2378156`` → ``#x``, ``09:30`` →
    ``9:9``, ``KX-55190`` → ``a-9``)."""
    return _ALNUM_RUN.sub(lambda m: "9" if m[0].isdigit() else "a" if m[0].isalpha() else "x", value.strip())


def repetitive_values(values: Sequence[str], *, min_count: int = BURST_MIN_VALUES) -> list[ValueBurst]:
    """The bursts among ``values`` (as extracted from one message, in order): groups of at least
    ``min_count`` distinct values of one :func:`value_shape`, largest first, then by first
    appearance. A burst is a log's or a checklist's values, not a user giving their own
    identifiers, and extraction collapses or caps it (F-50)."""
    groups: dict[str, list[int]] = {}
    seen: set[str] = set()
    for index, value in enumerate(values):
        if value in seen:
            continue
        seen.add(value)
        groups.setdefault(value_shape(value), []).append(index)
    bursts = [
        ValueBurst(shape=shape, values=tuple(values[i] for i in indexes), indexes=tuple(indexes))
        for shape, indexes in groups.items()
        if len(indexes) >= min_count
    ]
    return sorted(bursts, key=lambda burst: (-len(burst.values), burst.indexes[0]))


# --- line kinds ------------------------------------------------------------------------------


def _line_kinds(lines: list[str]) -> list[ProvenanceKind]:
    kinds: list[ProvenanceKind | None] = [None] * len(lines)
    _mark_fences(lines, kinds)
    _mark_forwarded(lines, kinds)
    _mark_chat_logs(lines, kinds)
    _mark_runs(lines, kinds, lambda line: line.lstrip().startswith(">"), "quoted", 1)
    _mark_logs(lines, kinds)
    _mark_tables(lines, kinds)
    _mark_indented_code(lines, kinds)
    _mark_documents(lines, kinds)
    return [kind or "own" for kind in kinds]


def _mark_fences(lines: list[str], kinds: list[ProvenanceKind | None]) -> None:
    opening: int | None = None
    for index, line in enumerate(lines):
        if _FENCE.match(line):
            if opening is None:
                opening = index
            else:
                kinds[opening : index + 1] = ["code"] * (index + 1 - opening)
                opening = None
    if opening is not None:  # an unclosed fence runs to the end
        kinds[opening:] = ["code"] * (len(lines) - opening)


def _mark_forwarded(lines: list[str], kinds: list[ProvenanceKind | None]) -> None:
    """From a quoted reply ("On …, X wrote:") or an email header block to the end."""
    for index in range(len(lines)):
        if kinds[index] is None and _forward_start(lines, index):
            for following in range(index, len(lines)):
                kinds[following] = kinds[following] or "forwarded"
            return


def _forward_start(lines: list[str], index: int) -> bool:
    """Whether a forwarded part starts at line ``index``: "X wrote:", or a header block of two
    lines or more."""
    line = lines[index]
    if _WROTE.match(line):
        return True
    if _HEADER.match(line):
        following = index + 1
        while following < len(lines) and _HEADER.match(lines[following]):
            following += 1
        return following - index >= 2
    return False


def _mark_chat_logs(lines: list[str], kinds: list[ProvenanceKind | None]) -> None:
    """Two or more timestamped "Name: text" lines (with their continuation lines) are a chat
    excerpt the user pasted; a log level is not a name."""

    def chat(line: str) -> bool:
        match = _CHAT_LINE.match(line)
        name = (match["name"] or match["name2"] or "") if match else ""
        return bool(name) and not re.fullmatch(_LOG_LEVEL, name.strip(), re.IGNORECASE)

    index = 0
    while index < len(lines):
        if kinds[index] is not None or not chat(lines[index]):
            index += 1
            continue
        # Lines between two chat lines continue the first; lines after the last one are the user's.
        end, last, count = index + 1, index, 1
        while end < len(lines) and kinds[end] is None and lines[end].strip():
            if chat(lines[end]):
                count, last = count + 1, end
            end += 1
        if count >= 2:
            kinds[index : last + 1] = ["forwarded"] * (last + 1 - index)
        index = last + 1


def _mark_logs(lines: list[str], kinds: list[ProvenanceKind | None]) -> None:
    """Timestamped or levelled lines and stack traces: a run of two or more (continuation lines
    that are indented or part of a trace included), or any traceback header."""
    index = 0
    while index < len(lines):
        line = lines[index]
        if kinds[index] is not None or not (_LOG_LINE.match(line) or _TRACE_LINE.match(line)):
            index += 1
            continue
        end, count = index + 1, 1
        while end < len(lines) and kinds[end] is None:
            following = lines[end]
            if _LOG_LINE.match(following) or _TRACE_LINE.match(following):
                count += 1
            elif not (following.startswith((" ", "\t")) and following.strip()):
                break
            end += 1
        if count >= 2 or line.startswith("Traceback"):
            kinds[index:end] = ["log"] * (end - index)
        index = end


def _mark_tables(lines: list[str], kinds: list[ProvenanceKind | None]) -> None:
    _mark_runs(lines, kinds, lambda line: bool(_MD_ROW.match(line)), "table", TABLE_MIN_ROWS)
    for separator in ("\t", ","):
        index = 0
        while index < len(lines):
            cells = _cells(lines[index], separator)
            # One tab makes two columns; prose has commas, so a comma table needs three columns.
            if kinds[index] is not None or cells < (1 if separator == "\t" else 2):
                index += 1
                continue
            end = index + 1
            while end < len(lines) and kinds[end] is None and _cells(lines[end], separator) == cells:
                end += 1
            if end - index >= TABLE_MIN_ROWS:
                kinds[index:end] = ["table"] * (end - index)
            index = end


def _cells(line: str, separator: str) -> int:
    """Separators in a row-like line (0 for prose: a comma-separated row has no sentence in it)."""
    if separator == "," and (len(line) > 200 or re.search(r"[.!?]\s+\S", line)):
        return 0
    return line.count(separator)


def _mark_indented_code(lines: list[str], kinds: list[ProvenanceKind | None]) -> None:
    """Two or more lines indented by four spaces or a tab, after a blank line or at the start."""
    index = 0
    while index < len(lines):
        after_blank = index == 0 or not lines[index - 1].strip()
        if kinds[index] is not None or not after_blank or not _INDENTED.match(lines[index]):
            index += 1
            continue
        end = index
        while end < len(lines) and kinds[end] is None and (_INDENTED.match(lines[end]) or not lines[end].strip()):
            end += 1
        while end > index and not lines[end - 1].strip():
            end -= 1
        if sum(1 for line in lines[index:end] if line.strip()) >= 2:
            kinds[index:end] = ["code"] * (end - index)
        index = max(end, index + 1)


def _mark_documents(lines: list[str], kinds: list[ProvenanceKind | None]) -> None:
    """After a line announcing a pasted text ("here is the document:"), the rest of the message;
    anywhere, a paragraph of :data:`DOCUMENT_CHARS` or more."""
    for index, line in enumerate(lines):
        announces = line.rstrip().endswith((":", "：")) and _DOCUMENT_CUE.search(line)
        if kinds[index] is None and announces and index + 1 < len(lines):
            for following in range(index + 1, len(lines)):
                if kinds[following] is None:
                    kinds[following] = "document"
            break
    index = 0
    while index < len(lines):
        end = index
        while end < len(lines) and kinds[end] is None and lines[end].strip():
            end += 1
        if sum(len(line) for line in lines[index:end]) >= DOCUMENT_CHARS:
            kinds[index:end] = ["document"] * (end - index)
        index = end + 1


def _mark_runs(
    lines: list[str], kinds: list[ProvenanceKind | None], test: Callable[[str], bool], kind: ProvenanceKind, least: int
) -> None:
    index = 0
    while index < len(lines):
        end = index
        while end < len(lines) and kinds[end] is None and test(lines[end]):
            end += 1
        if end - index >= least:
            kinds[index:end] = [kind] * (end - index)
        index = max(end, index + 1)


# --- quotations inside the user's own lines --------------------------------------------------


def _inline_quotes(text: str, start: int, end: int) -> list[ProvenanceSpan]:
    """The own line ``text[start:end]`` split around the quotations it reports."""
    quoted: list[tuple[int, int]] = []
    line = text[start:end]
    if any(mark in line for mark in _CLOSING):
        for match in _QUOTE_AFTER_CUE.finditer(text, start, end):
            opening = match["open"] or match["zhopen"]
            close = text.find(_CLOSING[opening], match.end(), end)
            quoted.append((match.end() - 1, close + 1 if close >= 0 else end))
        for match in _QUOTE_BEFORE_CUE.finditer(text, start, end):
            quoted.append(match.span("quote"))
    if ":" in line:
        for match in _SAID_COLON.finditer(text, start, end):
            quoted.append((match.start("rest"), match.end("rest")))
    spans: list[ProvenanceSpan] = []
    position = start
    for q_start, q_end in sorted(quoted):
        if q_start < position:
            q_start = position
        if q_end <= q_start:
            continue
        if q_start > position:
            spans.append(ProvenanceSpan(position, q_start, "own"))
        spans.append(ProvenanceSpan(q_start, q_end, "quoted"))
        position = q_end
    if position < end:
        spans.append(ProvenanceSpan(position, end, "own"))
    return spans


def _merged(spans: list[ProvenanceSpan]) -> list[ProvenanceSpan]:
    merged: list[ProvenanceSpan] = []
    for span in spans:
        if merged and merged[-1].kind == span.kind and merged[-1].end == span.start:
            merged[-1] = ProvenanceSpan(merged[-1].start, span.end, span.kind)
        else:
            merged.append(span)
    return merged
