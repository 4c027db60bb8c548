"""Pure planning of one model request (docs/memory.md §3): what to keep, summarize and elide; :mod:`memory.engine`
wraps it with storage and summarizers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from memory.context.assembly import Assembly, assemble, elide_current_turn, flatten, steps_note
from memory.context.budget import MemoryBudget, Mode
from memory.context.timeline import has_other_days, mark_days, mark_lead, marker_reserve
from memory.context.units import Unit, back_scan, count_turns, group_units, snap_to_turn_start, split_current_turn
from memory.facts.block import FactsBlock, facts_block
from memory.facts.values import KeyFact
from memory.messages import Message
from memory.recall.values import RecallInput, RecallResult
from memory.summary.archive import summary_block
from memory.summary.store import Summary
from memory.tokens.counter import REPLY_PRIMING_TOKENS, TokenCounter

# Back-scans while the key-facts block grows with the boundary (docs/memory.md §11); it only grows, so few are made.
FACTS_PLAN_ROUNDS = 4


def summary_message(summary: Summary, role: str) -> Message | None:
    """The summary block of ``summary`` as sent with ``role`` (None while it has no text)."""
    if not summary.content.strip():
        return None
    return summary_block(
        content=summary.content, summary_type=summary.summary_type, compressed_count=summary.compressed_count, role=role
    )


@dataclass(kw_only=True)
class Plan:
    """The decision for one request: ``tokens_before`` (old summary and whole increment), the back-scan's split into
    ``to_summarize`` and ``retained`` (``retain_budget`` tokens), the ``current`` turn and ``notes`` saying why."""

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
    facts: FactsBlock = field(default_factory=FactsBlock)
    facts_input: Sequence[KeyFact] = ()
    recall: RecallResult = field(default_factory=RecallResult)
    recall_input: RecallInput | None = None

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
    in_flight_yields: bool = True,
    force: bool = False,
    facts: Sequence[KeyFact] = (),
    recall: RecallResult | None = None,
    now: datetime | None = None,
    imagined_tokens: int = 0,
) -> Plan:
    """Decide what a request keeps verbatim and what is folded into the summary (docs/memory.md §3): the retained window
    gets ``target - system - facts - recall - current turn - summary reserve - tools`` tokens (none at 0 or less, F-18);
    a memory job's imagined next message (``imagined_tokens`` of the current turn) may use the room between target and
    trigger instead, so that what is stored sits at the target (§10);
    the cut moves to a turn start (F-38); nothing from ``summarize_below`` on is folded (F-26) unless that overflows the
    window and ``in_flight_yields`` (a memory job passes False: I2, I5). Folding pins more key facts, so the back-scan
    is redone with the larger block (§11); recalled items all precede the boundary (I4). With ``now``, history carries
    day markers (F-52) and a marker's tokens are held back for the window's first turn."""

    def block_for(boundary: int | None) -> FactsBlock:
        return facts_block(
            facts,
            boundary=boundary,
            max_tokens=budget.facts_budget_tokens,
            pinned_max_tokens=budget.facts_pinned_tokens,
            counter=counter,
            role=budget.summary_role,
        )

    history, current = split_current_turn(increment)
    single_system = budget.summary_role == "user"
    history_units = group_units(history, counter, single_system=single_system)
    mark_days(history_units, now, counter)
    mark_lead(history_units, now, counter)
    current_units = group_units(current, counter, allow_trailing_calls=True, single_system=single_system)
    block = block_for(summary.last_message_id)
    recalled = recall if recall is not None else RecallResult()
    before = assemble(
        system=system,
        facts=block,
        recall=recalled,
        summary=summary_message(summary, budget.summary_role),
        retained=flatten(history_units, wire=True),
        current=flatten(current_units, wire=True),
        tools=tools,
        counter=counter,
    )
    fixed = (
        (counter.count_message(system) if system else 0)
        + block.tokens
        + recalled.tokens
        + sum(unit.tokens for unit in current_units)
        + counter.count_tools(tools)
        + REPLY_PRIMING_TOKENS
    )
    retain_budget = budget.target_tokens - fixed - budget.summary_reserve_tokens
    retain_budget += min(imagined_tokens, budget.trigger_tokens - budget.target_tokens)
    if has_other_days(history_units, now):
        retain_budget -= marker_reserve(counter)
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
        facts=block,
        facts_input=facts,
        recall=recalled,
    )
    split_only = False
    if not plan.needs_compression and summary.content.strip() and history_units and not history_units[0].starts_turn:
        # A boundary stored inside a turn: fold the rest of it so the window starts with a user message (F-38).
        plan.needs_compression = split_only = True
        plan.retain_budget = sum(unit.tokens for unit in history_units)
        plan.notes.append("the stored boundary splits a turn: its remaining messages are summarized")
    if not plan.needs_compression:
        return plan
    split_notes: list[str] = []
    for _ in range(FACTS_PLAN_ROUNDS):
        split_notes = _split(
            plan,
            history_units,
            summary=summary,
            summarize_below=summarize_below,
            in_flight_yields=in_flight_yields,
            fixed=fixed,
            budget=budget,
        )
        boundary = max([summary.last_message_id or 0, *(m.get("id") or 0 for m in plan.summarized_messages)])
        grown = block_for(boundary or None)
        growth = grown.tokens - plan.facts.tokens
        plan.facts = grown
        if growth <= 0 or not plan.to_summarize:
            break
        # Folding more messages pinned more facts: reserve their tokens and scan again.
        fixed += growth
        plan.retain_budget = max(0, plan.retain_budget - growth) if not force else 0
    plan.notes.extend(split_notes)
    if split_only and not plan.to_summarize:
        # Only a turn still in flight could have been moved: leave it, quietly, under the trigger.
        plan.needs_compression = False
        plan.retained = history_units
        plan.notes.clear()
        return plan
    mark_lead(plan.retained, now, counter)
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


def _split(
    plan: Plan,
    history_units: list[Unit],
    *,
    summary: Summary,
    summarize_below: int | None,
    in_flight_yields: bool,
    fixed: int,
    budget: MemoryBudget,
) -> list[str]:
    """One back-scan of :func:`plan_request` for ``plan.retain_budget`` (``fixed``: tokens of all but history and
    summary), honouring a turn in flight and turn starts (F-26, F-38). Returns the notes saying why."""
    notes: list[str] = []
    plan.to_summarize, plan.retained = back_scan(history_units, plan.retain_budget)
    # The in-flight pin also bounds the snap to a turn start below, unless it had to yield.
    pinned_from = summarize_below
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
            # The pin yields to the window: a dead turn that still looks in flight must not block compression for good.
            if (
                not in_flight_yields
                or fixed + budget.summary_reserve_tokens + sum(unit.tokens for unit in pinned_units)
                <= budget.window_tokens
            ):
                plan.retained = pinned_units
                plan.to_summarize = plan.to_summarize[:pinned]
                notes.append(f"messages from id {summarize_below} on belong to a turn in flight: kept verbatim")
            else:
                pinned_from = None
                notes.append(
                    f"messages from id {summarize_below} on belong to a turn in flight, but keeping them verbatim "
                    "would overflow the context window: summarized"
                )
    if plan.retained and not plan.retained[0].starts_turn and (plan.to_summarize or summary.content.strip()):
        moved = len(plan.retained)
        plan.to_summarize, plan.retained = snap_to_turn_start(plan.to_summarize, plan.retained, pinned_from=pinned_from)
        if len(plan.retained) < moved:
            notes.append(
                f"the cut was moved forward by {moved - len(plan.retained)} unit(s) to the start of a turn: the "
                "retained window after the summary starts with a user message (docs/memory.md F-38)"
            )
    return notes


@dataclass(frozen=True, kw_only=True)
class StepsNote:
    """Older steps of the current turn folded into a "steps so far" note, in the model-facing copy only (docs/memory.md
    I5); ``summary_type`` ``llm`` or ``raw``; ``attempts`` as JSON, empty from the cache or the raw archive."""

    units: list[Unit]
    content: str
    summary_type: str
    attempts: list[dict[str, Any]] = field(default_factory=list)

    @property
    def members(self) -> list[Message]:
        """The persisted messages the note stands for."""
        return flatten(self.units, wire=False)


@dataclass(kw_only=True)
class Request:
    """The final request and what was done to make it fit: ``overflow`` True must not be sent; ``fold_wanted``: elision
    alone would cut into the newest step, and older steps could be folded instead (I5)."""

    assembly: Assembly
    elisions: list[dict[str, Any]]
    overflow: bool
    fold_wanted: bool = False
    steps: StepsNote | None = None
    facts: FactsBlock = field(default_factory=FactsBlock)


def foldable_steps(plan: Plan) -> list[Unit]:
    """The units in-turn compaction may fold: those between the user's question and the newest step, or none."""
    units = plan.current
    if len(units) < 3 or not units[0].starts_turn:
        return []
    return units[1:-1]


def steps_note_room(
    *,
    plan: Plan,
    summary: Summary,
    budget: MemoryBudget,
    counter: TokenCounter,
    tools: list[dict[str, Any]] | None,
    facts: FactsBlock | None = None,
) -> int:
    """Tokens a "steps so far" note's text may take so the request fits ``budget.request_limit_tokens``; may be 0 or
    less (the engine then asks for a minimal note and elision does the rest)."""
    block = summary_message(summary, budget.summary_role)
    kept = [*plan.current[0].wire, *plan.current[-1].wire] if plan.current else []
    fixed = (
        (counter.count_message(plan.system) if plan.system else 0)
        + (plan.facts if facts is None else facts).tokens
        + plan.recall.tokens
        + (counter.count_message(block) if block else 0)
        + sum(counter.count_message(message) for message in kept)
        + counter.count_tools(tools)
        + REPLY_PRIMING_TOKENS
    )
    header = counter.count_message(steps_note(content="", summary_type="raw", count=10**6))
    return budget.request_limit_tokens - fixed - header


def folded_facts(plan: Plan, summary: Summary, *, budget: MemoryBudget, counter: TokenCounter) -> FactsBlock:
    """The key-facts block once :func:`foldable_steps` are folded: their facts are pinned as if summarized (§11); the
    note is sized after it, as a verbatim identifier is worth more than its paraphrase."""
    covered = {m["id"] for unit in foldable_steps(plan) for m in unit.members if m.get("id") is not None}
    return facts_block(
        plan.facts_input,
        boundary=summary.last_message_id,
        max_tokens=budget.facts_budget_tokens,
        pinned_max_tokens=budget.facts_pinned_tokens,
        counter=counter,
        role=budget.summary_role,
        covered=covered,
    )


def build_request(
    *,
    plan: Plan,
    summary: Summary,
    retained: list[Unit],
    budget: MemoryBudget,
    counter: TokenCounter,
    tools: list[dict[str, Any]] | None = None,
    steps: StepsNote | None = None,
    facts: FactsBlock | None = None,
) -> Request:
    """Assemble the request (docs/memory.md §3 step 5): over ``budget.request_limit_tokens`` with no history left, a
    compressing request's current turn is elided, oldest first (I5); a ``steps`` note follows the question; ``overflow``
    when over ``budget.window_tokens``."""
    block = summary_message(summary, budget.summary_role)
    facts = plan.facts if facts is None else facts
    note_index: list[int] = []
    if steps is not None and plan.current:
        folded = steps.members
        note = {
            **steps_note(content=steps.content, summary_type=steps.summary_type, count=len(folded)),
            "folded_ids": [message["id"] for message in folded if message.get("id") is not None],
        }
        rest = plan.current[1 + len(steps.units) :]
        current = [*plan.current[0].wire, note, *flatten(rest, wire=True)]
        note_index = [len(plan.current[0].wire)]
    else:
        current = flatten(plan.current, wire=True)

    def build(messages: list[Message]) -> Assembly:
        return assemble(
            system=plan.system,
            facts=facts,
            recall=plan.recall,
            summary=block,
            retained=flatten(retained, wire=True),
            current=messages,
            tools=tools,
            counter=counter,
            strict_alternation=budget.strict_alternation,
        )

    assembly = build(current)
    limit = budget.request_limit_tokens
    elisions: list[dict[str, Any]] = []
    fold_wanted = False
    if assembly.tokens > limit and not retained and plan.needs_compression:
        current, elisions = elide_current_turn(current, assembly.tokens - limit, counter, first=note_index)
        if elisions:
            assembly = build(current)
        newest = {m["id"] for m in plan.current[-1].members if m.get("id") is not None} if plan.current else set()
        cut_newest = any(record["id"] in newest for record in elisions)
        fold_wanted = steps is None and bool(foldable_steps(plan)) and (cut_newest or assembly.tokens > limit)
    return Request(
        assembly=assembly,
        elisions=elisions,
        overflow=assembly.tokens > budget.window_tokens,
        fold_wanted=fold_wanted,
        steps=steps,
        facts=facts,
    )
