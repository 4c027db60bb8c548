"""The request's building blocks (docs/memory.md §3): the system prompt, the current turn and
tool groups kept or summarized whole. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from memory.messages import Message, call_ids
from memory.summary.archive import _plain_text
from memory.tokens.counter import TokenCounter

SourceKind = Literal["system", "facts", "summary", "recall", "history", "current"]


SYSTEM_NOTICE = "[System message]"


def split_system_prompt(messages: list[Message]) -> tuple[Message | None, list[Message]]:
    """``(system prompt, rest)``: only a *first* system message is the prompt; later ones are history (F-09)."""
    if messages and messages[0].get("role") == "system":
        return messages[0], messages[1:]
    return None, list(messages)


def split_current_turn(messages: list[Message]) -> tuple[list[Message], list[Message]]:
    """``(history, current turn)``: the turn is the last user message and what follows (docs/memory.md §1)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return messages[:index], messages[index:]
    return list(messages), []


@dataclass(kw_only=True)
class Unit:
    """An atomic unit of history, a plain message or a tool group: ``members`` are the stored messages it covers,
    ``wire`` its repaired model-facing copy (cost: ``tokens``), ``repairs`` what was dropped and why."""

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
    """Group ``messages`` into units, pairing tool calls and results by id (docs/memory.md F-01 to F-06): orphan results
    stay members but leave ``wire``; unanswered calls leave ``wire`` unless ``allow_trailing_calls`` and still running.
    ``single_system`` sends a later system message as a marked user message (F-09, F-10); stored dicts stay intact."""
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
    """``(to summarize, retained)``: whole units from the tail while they fit ``budget`` tokens; from the first that
    does not, everything is summarized (a budget of 0 or less keeps nothing, F-18)."""
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
    """Move the head units of ``retained`` that do not open a turn to ``to_summarize``, so the window starts with a user
    message (docs/memory.md F-38; retaining less keeps the budget); never a unit from id ``pinned_from`` on (F-26)."""
    cut = 0
    while cut < len(retained) and not retained[cut].starts_turn:
        if pinned_from is not None and any((m.get("id") or 0) >= pinned_from for m in retained[cut].members):
            break
        cut += 1
    return [*to_summarize, *retained[:cut]], retained[cut:]


def count_turns(units: Iterable[Unit]) -> int:
    """Number of turns that start in ``units`` (a turn starts at a user message)."""
    return sum(1 for unit in units if unit.starts_turn)
