"""Pure planning of one model request (docs/memory.md §3): what to keep, what to summarize,
what to elide. No ORM, no I/O; :mod:`memory.engine` wraps it with storage and summarizers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from memory.budget import MemoryBudget, Mode
from memory.core import (
    Assembly,
    Message,
    Unit,
    assemble,
    back_scan,
    count_turns,
    elide_current_turn,
    flatten,
    group_units,
    split_current_turn,
    summary_block,
)
from memory.store import Summary
from memory.tokens import REPLY_PRIMING_TOKENS, TokenCounter

# A summary shorter than this many tokens is never asked for, however small the prefix.
MIN_SUMMARY_TOKENS = 48


def summary_message(summary: Summary, role: str) -> Message | None:
    """The summary block of ``summary`` as sent with ``role`` (None while it has no text)."""
    if not summary.content.strip():
        return None
    return summary_block(
        content=summary.content, summary_type=summary.summary_type, compressed_count=summary.compressed_count, role=role
    )


@dataclass(kw_only=True)
class Plan:
    """The decision for one request.

    ``tokens_before``: estimated request with the old summary and the whole increment (tokens).
    ``needs_compression``: ``tokens_before`` exceeds the trigger. ``to_summarize`` / ``retained``:
    the back-scan's split of the history units (``to_summarize`` empty without compression).
    ``current``: the current turn's units, never summarized. ``retain_budget``: tokens the
    retained window may take. ``tools``: the tool schemas of the request. ``notes``: why things
    happened, as sentences.
    """

    system: Message | None
    history: list[Unit]
    current: list[Unit]
    to_summarize: list[Unit]
    retained: list[Unit]
    tokens_before: int
    needs_compression: bool
    retain_budget: int
    tools: list[dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def summarized_messages(self) -> list[Message]:
        """The persisted messages the new summary will cover (members, orphans included)."""
        return flatten(self.to_summarize, wire=False)


def plan_request(
    *,
    system: Message | None,
    summary: Summary,
    increment: list[Message],
    budget: MemoryBudget,
    counter: TokenCounter,
    tools: list[dict[str, Any]] | None = None,
    mode: Mode = "quick-answer",
    summarize_below: int | None = None,
    force: bool = False,
) -> Plan:
    """Decide what a request keeps verbatim and what must be folded into the summary.

    ``increment``: every persisted message after the boundary, ascending id. The budget for the
    retained window is ``target - system - current turn - summary reserve - tool schemas``; a zero
    or negative budget retains nothing (docs/memory.md F-18). In agent mode a note records when the
    budget forced fewer than ``budget.preserve_turns`` whole turns to be kept.
    ``summarize_below``: no message with this id or above may be summarized (the start of a
    concurrent turn still in flight, docs/memory.md F-26); units from there on stay verbatim, unless
    that would put the request over the context window (the window always wins).
    ``force``: compress now whatever the size: all history before the current turn is summarized.
    """
    history, current = split_current_turn(increment)
    single_system = budget.summary_role == "user"
    history_units = group_units(history, counter, single_system=single_system)
    current_units = group_units(current, counter, allow_trailing_calls=True, single_system=single_system)
    before = assemble(
        system=system,
        summary=summary_message(summary, budget.summary_role),
        retained=flatten(history_units, wire=True),
        current=flatten(current_units, wire=True),
        tools=tools,
        counter=counter,
    )
    fixed = (
        (counter.count_message(system) if system else 0)
        + sum(unit.tokens for unit in current_units)
        + counter.count_tools(tools)
        + REPLY_PRIMING_TOKENS
    )
    retain_budget = budget.target_tokens - fixed - budget.summary_reserve_tokens
    plan = Plan(
        system=system,
        history=history_units,
        current=current_units,
        to_summarize=[],
        retained=history_units,
        tokens_before=before.tokens,
        needs_compression=force or before.tokens > budget.trigger_tokens,
        retain_budget=0 if force else retain_budget,
        tools=tools,
    )
    if not plan.needs_compression:
        return plan
    plan.to_summarize, plan.retained = back_scan(history_units, plan.retain_budget)
    if summarize_below is not None:
        pinned = next(
            (
                i
                for i, unit in enumerate(plan.to_summarize)
                if any((m.get("id") or 0) >= summarize_below for m in unit.members)
            ),
            None,
        )
        if pinned is not None:
            pinned_units = plan.to_summarize[pinned:] + plan.retained
            # The pin yields to the window: a dead turn that still looks in flight must not
            # block compression for good.
            if (
                fixed + budget.summary_reserve_tokens + sum(unit.tokens for unit in pinned_units)
                <= budget.context_window
            ):
                plan.retained = pinned_units
                plan.to_summarize = plan.to_summarize[:pinned]
                plan.notes.append(f"messages from id {summarize_below} on belong to a turn in flight: kept verbatim")
            else:
                plan.notes.append(
                    f"messages from id {summarize_below} on belong to a turn in flight, but keeping them verbatim "
                    "would overflow the context window: summarized"
                )
    if force:
        plan.notes.append("compression requested by the user: all history before the current turn is summarized")
    elif retain_budget <= 0:
        plan.notes.append(
            f"system prompt + current turn + summary reserve need {fixed + budget.summary_reserve_tokens} tokens, "
            f"over the target of {budget.target_tokens}: no history can be retained"
        )
    if mode == "agent" and budget.preserve_turns and not force:
        wanted = min(budget.preserve_turns, count_turns(history_units))
        kept = count_turns(plan.retained)
        if kept < wanted:
            plan.notes.append(
                f"kept {kept} of the last {wanted} whole turns (preserve_turns={budget.preserve_turns}): the budget won"
            )
    if not plan.to_summarize and force:
        plan.notes.append("nothing to compress: every message before the current turn is already in the summary")
    elif not plan.to_summarize:
        plan.notes.append(
            "nothing left to summarize: the request is over the trigger because of the system prompt, "
            "the current turn or the summary itself"
        )
    return plan


def summary_output_tokens(*, previous_summary_tokens: int, transcript_tokens: int, cap: int, ratio: float) -> int:
    """The summarizer's output limit in tokens: the old summary may be carried over whole and
    the new material may add at most ``ratio`` (default 30 %) of its own size (docs/memory.md §3
    step 4; by induction the summary stays within that share of everything it covers), never
    over ``cap``."""
    wanted = previous_summary_tokens + math.ceil(ratio * transcript_tokens)
    return max(min(MIN_SUMMARY_TOKENS, cap), min(cap, wanted))


@dataclass(kw_only=True)
class Request:
    """The final model-facing request and what was elided to make it fit."""

    assembly: Assembly
    elisions: list[dict[str, Any]]
    overflow: bool


def build_request(
    *,
    plan: Plan,
    summary: Summary,
    retained: list[Unit],
    budget: MemoryBudget,
    counter: TokenCounter,
    tools: list[dict[str, Any]] | None = None,
) -> Request:
    """Assemble ``[system] + [summary block] + retained + current turn``; if that is over the
    target with no history left to give up, elide inside the current turn (docs/memory.md I5).
    ``overflow`` is True when the request is still over the context window."""
    block = summary_message(summary, budget.summary_role)
    current = flatten(plan.current, wire=True)
    assembly = assemble(
        system=plan.system,
        summary=block,
        retained=flatten(retained, wire=True),
        current=current,
        tools=tools,
        counter=counter,
    )
    elisions: list[dict[str, Any]] = []
    if assembly.tokens > budget.target_tokens and not retained and plan.needs_compression:
        current, elisions = elide_current_turn(current, assembly.tokens - budget.target_tokens, counter)
        if elisions:
            assembly = assemble(
                system=plan.system, summary=block, retained=[], current=current, tools=tools, counter=counter
            )
    return Request(assembly=assembly, elisions=elisions, overflow=assembly.tokens > budget.context_window)
