"""Assembling the model-facing list (docs/memory.md §3 step 5): blocks in order, elision of an
oversized current turn, same-role merging for strict providers. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from memory.context.units import SourceKind, Unit, _message_tokens
from memory.facts.block import FactsBlock
from memory.messages import Message, to_wire
from memory.recall.values import RecallResult
from memory.summary.archive import _plain_text
from memory.tokens.counter import REPLY_PRIMING_TOKENS, TokenCounter

ELISION_MARKER = "[… {tokens} tokens elided to fit the context window; the stored message is intact]"


STEPS_NOTE_HEADER = "[Steps so far in this turn - {count} earlier messages folded to fit the context window]"


STEPS_NOTE_RAW_HEADER = (
    "[Steps so far in this turn - {count} earlier messages archived verbatim to fit the context window]"
)


# Joins the contents of two same-role neighbours merged for strict alternation (F-38).
MERGE_SEPARATOR = "\n\n"


def steps_note(*, content: str, summary_type: str, count: int) -> Message:
    """The "steps so far" note standing, in the model-facing copy only, for ``count`` folded older messages of the
    current turn (docs/memory.md I5); an assistant message, as it replaces the assistant's own steps."""
    header = (STEPS_NOTE_RAW_HEADER if summary_type == "raw" else STEPS_NOTE_HEADER).format(count=count)
    return {"role": "assistant", "content": f"{header}\n{content}"}


def elide_current_turn(
    current: list[Message], excess: int, counter: TokenCounter, *, first: Iterable[int] = ()
) -> tuple[list[Message], list[dict[str, Any]]]:
    """Shrink content in the current turn by about ``excess`` tokens, no more (docs/memory.md I5, F-07): messages at
    ``first`` (a steps note) go first, then tool results and assistant text, oldest first; the user's never. Each keeps
    its head and a marker. Returns ``(new list, [{"id", "role", "tokens_before", "tokens_after"}])``, inputs intact."""
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
    """A model-facing request: wire ``messages`` (no ids), ``sources`` aligned with them (``{"id", "kind"}``),
    ``sections`` and ``tokens`` in tokens."""

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
    """``[system] + [key facts] + [summary] + [recall] + retained window + current turn`` (docs/memory.md §3 step 5,
    §11, §12): internal keys stay off the wire, ``sources`` keep the ids; a steps note's source carries ``folded``
    and ``message_ids``; with ``strict_alternation`` same-role neighbours are merged (F-38), the first part's source
    listing the others in ``merged``."""
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
                source["message_ids"] = list(message["folded_ids"])
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
    """Both ``user``, or both ``assistant`` without ``tool_calls`` on ``first`` (its results must follow it)."""
    return (
        first.get("role") == second.get("role")
        and first.get("role") in ("user", "assistant")
        and not first.get("tool_calls")
    )


def merge_messages(first: Message, second: Message) -> Message:
    """One wire message saying what ``first`` then ``second`` said: contents joined by a blank line, ``second``'s
    ``tool_calls`` kept, a ``name`` only when both carry it. Inputs are not modified."""
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
    """Strict alternation (docs/memory.md F-38): every run of :func:`mergeable` messages merged into one, the
    ``sections`` of ``owners`` corrected in place (each part's section counts the tokens it adds). Returns the new
    aligned ``(messages, sources)``."""
    out: list[Message] = []
    out_sources: list[dict[str, Any]] = []
    out_owners: list[str] = []
    for message, source, owner in zip(messages, sources, owners, strict=True):
        if out and mergeable(out[-1], message):
            merged = merge_messages(out[-1], message)
            # The later part's section keeps what it adds to the merged message: a current turn merged into the
            # key-facts block still counts as the current turn.
            sections[owner] += counter.count_message(merged) - counter.count_message(out[-1])
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
