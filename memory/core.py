"""The pure memory core: splitting, grouping, budgeting, repairing, eliding, assembling.

Everything here works on lists of OpenAI Chat Completions message dicts (``role``, ``content``,
``tool_calls``, ``tool_call_id``, ``name``) that may carry their persisted ``id``; no ORM, no I/O.
Rules and numbers come from docs/memory.md §3 (compression) and section 4 (raw archive).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from memory.facts import FactsBlock
from memory.recall import RecallResult
from memory.tokens import REPLY_PRIMING_TOKENS, TokenCounter

Message = dict[str, Any]
SourceKind = Literal["system", "facts", "summary", "recall", "history", "current"]

WIRE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
RAW_ARCHIVE_LINE_CHARS = 500
RAW_ARCHIVE_MARKER = "[Raw archive of newly added messages]"
ARCHIVE_OMITTED = "- [{count} earlier archived messages omitted]"
_OMITTED_RE = re.compile(r"- \[(\d+) earlier archived messages omitted\]")
SYSTEM_NOTICE = "[System message]"
# Line lengths (characters) tried in turn when the archive is over its token cap.
ARCHIVE_LINE_STEPS = (RAW_ARCHIVE_LINE_CHARS, 200, 80)
ELISION_MARKER = "[… {tokens} tokens elided to fit the context window; the stored message is intact]"
SUMMARY_TRIMMED = "[… earlier summary trimmed to fit the summary cap]"
STEPS_NOTE_HEADER = "[Steps so far in this turn - {count} earlier messages folded to fit the context window]"
STEPS_NOTE_RAW_HEADER = (
    "[Steps so far in this turn - {count} earlier messages archived to fit the context window "
    "(LLM summarization unavailable)]"
)
# Joins the contents of two same-role neighbours merged for strict alternation (F-38).
MERGE_SEPARATOR = "\n\n"


def to_wire(message: Message) -> Message:
    """A copy of ``message`` with only the keys the Chat Completions API accepts
    (``content`` is ``None`` only on an assistant message carrying ``tool_calls``)."""
    wire = {key: message[key] for key in WIRE_KEYS if message.get(key) not in (None, [])}
    wire.setdefault("content", None if wire.get("tool_calls") else "")
    return wire


def call_ids(message: Message) -> list[str]:
    """The ``tool_calls`` ids of an assistant message, in order (empty for anything else)."""
    if message.get("role") != "assistant":
        return []
    return [call.get("id") for call in message.get("tool_calls") or () if call.get("id")]


def split_system_prompt(messages: list[Message]) -> tuple[Message | None, list[Message]]:
    """``(system prompt, rest)``: only a *first* message with role ``system`` is the system
    prompt; later system messages are ordinary history (docs/memory.md F-09)."""
    if messages and messages[0].get("role") == "system":
        return messages[0], messages[1:]
    return None, list(messages)


def split_current_turn(messages: list[Message]) -> tuple[list[Message], list[Message]]:
    """``(history, current turn)``: the current turn is the last user message and everything
    after it (docs/memory.md §1). With no user message at all, everything is history."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return messages[:index], messages[index:]
    return list(messages), []


@dataclass(kw_only=True)
class Unit:
    """An atomic unit of history: a plain message, or a tool group.

    ``members`` are the persisted messages the unit stands for (coverage is by these);
    ``wire`` is the repaired model-facing copy (orphan results dropped, unanswered calls removed);
    ``repairs`` says what was dropped and why; ``tokens`` is the cost of ``wire`` in tokens.
    """

    members: list[Message]
    wire: list[Message]
    tokens: int = 0
    repairs: list[str] = field(default_factory=list)

    @property
    def starts_turn(self) -> bool:
        return bool(self.members) and self.members[0].get("role") == "user"


def group_units(
    messages: list[Message], counter: TokenCounter, *, allow_trailing_calls: bool = False, single_system: bool = False
) -> list[Unit]:
    """Group ``messages`` into atomic units, pairing tool calls and results **by id**.

    An assistant message with ``tool_calls`` takes every directly following tool message whose
    ``tool_call_id`` it issued, however many (docs/memory.md F-03, F-04, F-06). A tool message whose
    caller is not there is an orphan (F-01, F-05): it stays a member of the unit it sits in (so
    coverage accounting holds) but is dropped from ``wire``. Calls without a result are removed
    from the ``wire`` copy of the assistant message (and the message dropped when nothing is left),
    except, with ``allow_trailing_calls``, on a last message whose calls are still executing.
    With ``single_system`` (providers that accept one leading system message, docs/memory.md F-10) a
    later system message is sent as a user message marked ``[System message]`` (F-09: it is
    ordinary history, never the system prompt). Stored dicts are never modified.
    """
    units: list[Unit] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        ids = call_ids(message)
        if not ids:
            unit = Unit(members=[message], wire=[])
            if message.get("role") == "tool":
                unit.repairs.append(
                    f"dropped tool result {message.get('tool_call_id')!r}: its call is not in the context"
                )
            elif message.get("role") == "system" and single_system:
                content = _plain_text(message.get("content"))
                unit.wire.append(
                    {**message, "role": "user", "content": f"{SYSTEM_NOTICE} {content}", "token_count": None}
                )
            else:
                unit.wire.append(message)
            units.append(unit)
            index += 1
            continue
        members = [message]
        answered: list[Message] = []
        pending = set(ids)
        repairs: list[str] = []
        index += 1
        while index < len(messages) and messages[index].get("role") == "tool":
            result = messages[index]
            members.append(result)
            if result.get("tool_call_id") in pending:
                pending.discard(result["tool_call_id"])
                answered.append(result)
            else:
                repairs.append(f"dropped tool result {result.get('tool_call_id')!r}: its call is not in the context")
            index += 1
        caller = message
        in_progress = allow_trailing_calls and index == len(messages) and len(members) == 1
        if pending and not in_progress:
            kept_calls = [call for call in message["tool_calls"] if call.get("id") not in pending]
            repairs.append(f"removed unanswered tool calls {sorted(pending)}")
            caller = {**message, "tool_calls": kept_calls, "token_count": None}
        wire = [caller, *answered] if caller.get("tool_calls") or caller.get("content") else []
        units.append(Unit(members=members, wire=wire, repairs=repairs))
    for unit in units:
        unit.tokens = sum(_message_tokens(m, counter) for m in unit.wire)
    return units


def _message_tokens(message: Message, counter: TokenCounter) -> int:
    cached = message.get("token_count")
    if isinstance(cached, int) and cached >= 0:
        return cached
    return counter.count_message(message)


def back_scan(units: list[Unit], budget: int) -> tuple[list[Unit], list[Unit]]:
    """Split ``units`` into ``(to summarize, retained)``: keep whole units from the tail while
    their tokens fit ``budget`` (tokens). The first unit from the tail that does not fit, and
    everything before it, is summarized whole. A zero or negative budget keeps nothing (F-18)."""
    kept_tokens = 0
    cut = len(units)
    for index in range(len(units) - 1, -1, -1):
        if kept_tokens + units[index].tokens > budget:
            break
        kept_tokens += units[index].tokens
        cut = index
    return units[:cut], units[cut:]


def snap_to_turn_start(
    to_summarize: list[Unit], retained: list[Unit], *, pinned_from: int | None = None
) -> tuple[list[Unit], list[Unit]]:
    """Move the units at the head of ``retained`` that do not open a turn (an answer, a tool
    group, a later system message) over to ``to_summarize``, so the retained window after the
    summary block starts with a user message and no turn is split between summary and window
    (docs/memory.md F-38). Moving the cut forward only retains less, so the budget still holds.
    A unit holding a message with id ``pinned_from`` or above (a turn still in flight, F-26)
    is never moved. Returns the new ``(to summarize, retained)``."""
    cut = 0
    while cut < len(retained) and not retained[cut].starts_turn:
        if pinned_from is not None and any((m.get("id") or 0) >= pinned_from for m in retained[cut].members):
            break
        cut += 1
    return [*to_summarize, *retained[:cut]], retained[cut:]


def count_turns(units: Iterable[Unit]) -> int:
    """Number of turns that start in ``units`` (a turn starts at a user message)."""
    return sum(1 for unit in units if unit.starts_turn)


def summary_header(*, summary_type: str, compressed_count: int) -> str:
    """The first line of the summary block (docs/memory.md §3 step 5)."""
    if summary_type == "raw":
        return f"[Memory Summary - {compressed_count} earlier messages archived (LLM summarization unavailable)]"
    return f"[Memory Summary - {compressed_count} earlier messages consolidated]"


def summary_block(*, content: str, summary_type: str, compressed_count: int, role: str) -> Message:
    """The one message that carries the summary into the request; ``role`` is ``system`` or
    ``user`` (for providers that accept a single leading system message, F-10)."""
    header = summary_header(summary_type=summary_type, compressed_count=compressed_count)
    return {"role": role, "content": f"{header}\n{content}"}


def steps_note(*, content: str, summary_type: str, count: int) -> Message:
    """The "steps so far" note standing, in the model-facing copy only, for ``count`` older
    messages of the current turn folded to fit the context window (docs/memory.md I5, in-turn
    compaction). An assistant message: it takes the place of the assistant's own earlier steps;
    ``summary_type`` ``raw`` marks a raw archive (no summarizer)."""
    header = (STEPS_NOTE_RAW_HEADER if summary_type == "raw" else STEPS_NOTE_HEADER).format(count=count)
    return {"role": "assistant", "content": f"{header}\n{content}"}


def trim_summary(content: str, max_tokens: int, counter: TokenCounter) -> str:
    """``content`` (a stored summary) brought to at most ``max_tokens`` tokens without any LLM,
    for a summary over the current cap when no summarizer can shrink it (docs/memory.md F-40).

    A raw archive section is bounded as in :func:`raw_archive_merge` (lines shortened, then the
    oldest counted as omitted); a plain summary keeps its head, the earliest facts (I7), and ends
    with a visible ``[… earlier summary trimmed …]`` marker. Text already within the cap is
    returned unchanged."""
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


def raw_archive_line(message: Message) -> str:
    """One raw archive line (docs/memory.md §4), cut to 500 characters of content."""
    role = message.get("role")
    content = _plain_text(message.get("content"))
    if role == "assistant":
        names = [(call.get("function") or {}).get("name", "?") for call in message.get("tool_calls") or ()]
        if names:
            arguments = "; ".join(
                f"{(call.get('function') or {}).get('name', '?')}({(call.get('function') or {}).get('arguments', '')})"
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
    content = " ".join(content.split())
    if len(content) > RAW_ARCHIVE_LINE_CHARS:
        content = content[: RAW_ARCHIVE_LINE_CHARS - 1] + "…"
    return f"- {label}: {content}"


def _plain_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return json.dumps(content, ensure_ascii=False)


def raw_archive_merge(previous_summary: str, messages: list[Message], *, max_tokens: int, counter: TokenCounter) -> str:
    """The degraded summary: ``previous_summary`` kept plus one
    ``[Raw archive of newly added messages]`` section holding an archive line per message.

    A previous raw section is merged into the single section (no stacking, F-12). When the text
    exceeds ``max_tokens``, archive lines are shortened (500, 200, then 80 characters), then the
    oldest give way to an ``N earlier archived messages omitted`` line, so the archive stays
    bounded across many degraded compressions. The LLM-written part is kept whole while it
    leaves room for that count line; otherwise its tail gives way (its head, with the earliest
    facts, stays), so the archive always says how many messages it folded in.
    """
    base, old_lines, omitted = _split_archive(previous_summary)
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


def elide_current_turn(
    current: list[Message], excess: int, counter: TokenCounter, *, first: Iterable[int] = ()
) -> tuple[list[Message], list[dict[str, Any]]]:
    """Shrink oversized content inside the current turn by about ``excess`` tokens, and no more.

    The messages at the indexes ``first`` go first (a "steps so far" note, which stands for the
    oldest material), then tool results, oldest first, then assistant text; the user's messages
    are never touched (docs/memory.md I5, docs/memory.md F-07). Only what is needed is cut, so a
    newer result stays whole when cutting older ones is enough. Each shortened content keeps its
    head and ends with a visible marker. Returns the new model-facing list and one record per
    elision ``{"id", "role", "tokens_before", "tokens_after"}``. Input dicts are not modified.
    """
    result = list(current)
    records: list[dict[str, Any]] = []
    order = [i for i in first if 0 <= i < len(current) and current[i].get("role") != "user"]
    order += [i for i, m in enumerate(current) if m.get("role") == "tool" and i not in order]
    order += [i for i, m in enumerate(current) if m.get("role") == "assistant" and m.get("content") and i not in order]
    for index in order:
        if excess <= 0:
            break
        message = result[index]
        content = _plain_text(message.get("content"))
        before = counter.count_text(content)
        if before <= 32:
            continue
        # +2: the newline joining head and marker may not merge with either side's tokens.
        marker_tokens = counter.count_text(ELISION_MARKER.format(tokens=before)) + 2
        keep = max(0, before - excess - marker_tokens)
        if keep >= before:
            continue
        head = counter.truncate_text(content, keep)
        new_content = f"{head}\n{ELISION_MARKER.format(tokens=before - keep)}"
        after = counter.count_text(new_content)
        if after >= before:
            continue
        result[index] = {**message, "content": new_content, "token_count": None}
        excess -= before - after
        records.append(
            {"id": message.get("id"), "role": message.get("role"), "tokens_before": before, "tokens_after": after}
        )
    return result, records


@dataclass(kw_only=True)
class Assembly:
    """A model-facing request: ``messages`` (wire dicts, no ids), ``sources`` aligned with them
    (``{"id", "kind"}``), ``sections`` in tokens and ``tokens`` for the whole request."""

    messages: list[Message]
    sources: list[dict[str, Any]]
    sections: dict[str, int]
    tokens: int


def assemble(
    *,
    system: Message | None,
    summary: Message | None,
    retained: list[Message],
    current: list[Message],
    tools: list[dict[str, Any]] | None,
    counter: TokenCounter,
    strict_alternation: bool = False,
    facts: FactsBlock | None = None,
    recall: RecallResult | None = None,
) -> Assembly:
    """``[system] + [key facts] + [summary block] + [recall] + retained window + current turn``
    (docs/memory.md §3 step 5, §11, §12).

    Internal keys (``id``, ``token_count``) never reach the wire; ``sources`` keeps the ids. A
    message carrying the internal key ``folded_ids`` (a "steps so far" note) gets a source
    ``{"id": None, "kind": "current", "folded": [ids]}``. With ``strict_alternation`` two user or
    two assistant messages in a row are merged into one (docs/memory.md F-38, see
    :func:`merge_same_role_neighbours`); the merged message's source is the first part's with
    ``"merged": [sources of the later parts]``, and its tokens count in the first part's section.
    ``facts``: the key-facts block (nothing is sent when it holds no message); its source is
    :attr:`memory.facts.FactsBlock.source` (kind ``facts`` with ``fact_ids`` and ``message_ids``).
    ``recall``: the recall block (none when it recalled nothing); its source has kind ``recall``
    with ``item_ids`` and the recalled ``message_ids``.
    """
    messages: list[Message] = []
    sources: list[dict[str, Any]] = []
    owners: list[str] = []
    sections = {
        "system": 0,
        "facts": 0,
        "summary": 0,
        "recall": 0,
        "retained": 0,
        "current": 0,
        "tools": counter.count_tools(tools),
    }
    parts: list[tuple[str, SourceKind, list[Message]]] = [
        ("system", "system", [system] if system else []),
        ("facts", "facts", [facts.message] if facts is not None and facts.message else []),
        ("summary", "summary", [summary] if summary else []),
        ("recall", "recall", [recall.message] if recall is not None and recall.message else []),
        ("retained", "history", retained),
        ("current", "current", current),
    ]
    for section, kind, items in parts:
        for message in items:
            messages.append(to_wire(message))
            source: dict[str, Any] = {"id": message.get("id") if kind in ("history", "current") else None, "kind": kind}
            if kind == "facts" and facts is not None:
                source = facts.source
            elif kind == "recall" and recall is not None:
                source = {
                    "id": None,
                    "kind": "recall",
                    "item_ids": [scored.item.id for scored in recall.items],
                    "message_ids": sorted({i for scored in recall.items for i in scored.item.message_ids}),
                }
            if message.get("folded_ids"):
                source["folded"] = list(message["folded_ids"])
            sources.append(source)
            owners.append(section)
            sections[section] += _message_tokens(message, counter)
    if strict_alternation:
        messages, sources = merge_same_role_neighbours(
            messages, sources, owners=owners, sections=sections, counter=counter
        )
    tokens = sum(sections.values()) + REPLY_PRIMING_TOKENS
    return Assembly(messages=messages, sources=sources, sections=sections, tokens=tokens)


def mergeable(first: Message, second: Message) -> bool:
    """Whether ``second`` may be merged into ``first`` for strict alternation: both ``user``, or
    both ``assistant`` with no ``tool_calls`` on ``first`` (its results must follow it directly,
    so nothing is appended after a call). System and tool messages are never merged."""
    return (
        first.get("role") == second.get("role")
        and first.get("role") in ("user", "assistant")
        and not first.get("tool_calls")
    )


def merge_messages(first: Message, second: Message) -> Message:
    """One wire message saying what ``first`` then ``second`` said: contents joined by a blank
    line (text parts concatenated when either content is a list), ``second``'s ``tool_calls``
    kept (an assistant's text followed by its calls is one legal message). A ``name`` survives
    only when both carry the same. Neither input is modified."""
    merged = {key: value for key, value in second.items() if key != "name"}
    if first.get("name") and first.get("name") == second.get("name"):
        merged["name"] = first["name"]
    a, b = first.get("content"), second.get("content")
    if isinstance(a, list) or isinstance(b, list):
        merged["content"] = [*_as_parts(a), {"type": "text", "text": MERGE_SEPARATOR}, *_as_parts(b)]
    else:
        texts = [text for text in (a, b) if text]
        merged["content"] = MERGE_SEPARATOR.join(texts) if texts else (None if merged.get("tool_calls") else "")
    return merged


def _as_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content}] if content else []


def merge_same_role_neighbours(
    messages: list[Message],
    sources: list[dict[str, Any]],
    *,
    owners: list[str],
    sections: dict[str, int],
    counter: TokenCounter,
) -> tuple[list[Message], list[dict[str, Any]]]:
    """Strict alternation (docs/memory.md F-38): merge every run of same-role ``user`` or
    ``assistant`` wire messages (see :func:`mergeable`) into one, in the model-facing copy only.

    ``sources`` are aligned with ``messages``; ``owners`` names each message's section, whose
    entry in ``sections`` (tokens) is corrected in place by what a merge saves. Tool pairing is
    untouched: a tool message is never merged and nothing is put between a call and its results.
    Returns the new aligned ``(messages, sources)``; inputs are not modified.
    """
    out: list[Message] = []
    out_sources: list[dict[str, Any]] = []
    out_owners: list[str] = []
    for message, source, owner in zip(messages, sources, owners, strict=True):
        if out and mergeable(out[-1], message):
            merged = merge_messages(out[-1], message)
            sections[out_owners[-1]] += counter.count_message(merged) - counter.count_message(out[-1])
            sections[owner] -= counter.count_message(message)
            later = {key: value for key, value in source.items() if key != "merged"}
            out[-1] = merged
            out_sources[-1] = {
                **out_sources[-1],
                "merged": [*out_sources[-1].get("merged", []), later, *source.get("merged", [])],
            }
            continue
        out.append(message)
        out_sources.append(source)
        out_owners.append(owner)
    return out, out_sources


def flatten(units: Iterable[Unit], *, wire: bool) -> list[Message]:
    """The messages of ``units`` in order: their ``wire`` copies or their stored ``members``."""
    return [message for unit in units for message in (unit.wire if wire else unit.members)]
