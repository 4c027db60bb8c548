"""Checks of docs/memory.md invariants I1-I6 on one built context; shared by property tests and replays."""

from __future__ import annotations

import itertools
from typing import Any

from memory.context.request import MemoryContext
from memory.tokens.counter import TokenCounter


def assert_no_orphans(messages: list[dict[str, Any]]) -> None:
    """I3: every tool message answers a call of the assistant message it follows; every call is
    answered, except calls of a last assistant message still executing."""
    index = 0
    while index < len(messages):
        message = messages[index]
        assert message["role"] != "tool", f"orphan tool result at {index}: {message}"
        calls = [c["id"] for c in message.get("tool_calls") or ()]
        index += 1
        if not calls:
            continue
        answered = []
        while index < len(messages) and messages[index]["role"] == "tool":
            assert messages[index]["tool_call_id"] in calls, (
                f"tool result {messages[index]['tool_call_id']} not called by its assistant"
            )
            answered.append(messages[index]["tool_call_id"])
            index += 1
        if index == len(messages) and not answered:
            continue
        assert sorted(answered) == sorted(calls), f"calls {calls} answered by {answered}"


def check_context(
    context: MemoryContext,
    *,
    stored: list[dict[str, Any]],
    system_prompt: str,
    counter: TokenCounter,
    tools: list[dict[str, Any]] | None = None,
    dropped_ids: frozenset[int] | set[int] = frozenset(),
    single_system: bool = False,
    strict_alternation: bool = False,
) -> None:
    """Assert I1-I5 and F-38 for ``context`` built over the persisted ``stored`` rows.

    A source with ``merged`` (strict alternation) stands for several stored messages; a source
    with ``folded`` (a "steps so far" note of in-turn compaction) accounts for the current-turn
    messages it replaced in the model-facing copy."""
    messages, sources = context.messages, context.sources
    assert len(messages) == len(sources)
    expanded = [part for source in sources for part in (source, *source.get("merged", []))]
    folded = [i for source in expanded for i in source.get("folded", [])]
    # F-38: the window after the summary block starts with a user message (no split turn)
    holder = next(
        (i for i, s in enumerate(sources) if "summary" in [p["kind"] for p in (s, *s.get("merged", []))]), None
    )
    if holder is not None:
        # The recall block (docs/memory.md §12) sits between the summary and the window.
        parts = [sources[holder], *sources[holder].get("merged", [])]
        after = [p for p in parts[[p["kind"] for p in parts].index("summary") + 1 :] if p["kind"] != "recall"]
        following = holder + 1
        while following < len(messages) and sources[following]["kind"] == "recall" and not after:
            following += 1
        if after:
            assert messages[holder]["role"] == "user" and after[0]["kind"] in ("history", "current")
        elif following < len(messages) and sources[following].get("merged"):
            assert messages[following]["role"] == "user"
        elif following < len(messages):
            assert messages[following]["role"] == "user", (
                f"F-38: the window after the summary starts with {messages[following]}"
            )
    # docs/memory.md §12: the recall block comes after the summary (or the key facts / system
    # prompt when there is none), once
    recall_at = [i for i, s in enumerate(expanded) if s["kind"] == "recall"]
    assert len(recall_at) <= 1
    if recall_at:
        assert all(s["kind"] in ("system", "facts", "summary") for s in expanded[: recall_at[0]])
    # docs/memory.md §11: the key-facts block comes right after the system prompt, once
    facts_at = [i for i, s in enumerate(expanded) if s["kind"] == "facts"]
    assert facts_at in ([], [1]), f"the key-facts block is at {facts_at}"
    if facts_at:
        assert expanded[1]["fact_ids"] and expanded[1]["message_ids"], "a key-facts block without provenance"
    if strict_alternation:
        for first, second in itertools.pairwise(messages):
            assert not (first["role"] == second["role"] and first["role"] in ("user", "assistant")), (
                f"F-38: two {first['role']} messages in a row"
            )
    # I1
    assert messages[0] == {"role": "system", "content": system_prompt}
    assert sources[0]["kind"] == "system" and [s["kind"] for s in sources].count("system") == 1
    if single_system:
        assert [m["role"] for m in messages].count("system") == 1, "F-10: a second system message on the wire"
    # no internal role or key goes on the wire (F-10)
    for message in messages:
        assert message["role"] in {"system", "user", "assistant", "tool"}
        assert set(message) <= {"role", "content", "tool_calls", "tool_call_id", "name"}
    # I2: the current turn is present, its user message verbatim
    last_user = max((row for row in stored if row["role"] == "user"), key=lambda r: r["id"], default=None)
    if last_user is not None:
        position = next(
            i for i, s in enumerate(sources) if last_user["id"] in [p["id"] for p in (s, *s.get("merged", []))]
        )
        part = next(p for p in (sources[position], *sources[position].get("merged", [])) if p["id"] == last_user["id"])
        assert part["kind"] == "current"
        if sources[position].get("merged"):
            assert strict_alternation and messages[position]["role"] == "user"
            assert messages[position]["content"].endswith(last_user["content"])
        else:
            assert messages[position] == {"role": "user", "content": last_user["content"]}
        current_ids = [row["id"] for row in stored if row["id"] >= last_user["id"]]
        assert [s["id"] for s in expanded if s["kind"] == "current" and s["id"] is not None] == [
            i for i in current_ids if i not in dropped_ids and i not in folded
        ]
        assert all(i in current_ids for i in folded), "only messages of the current turn may be folded"
    # I3
    assert_no_orphans(messages)
    # I4: exact coverage, no gap, no overlap
    boundary = context.summary.last_message_id or 0
    present = [s["id"] for s in expanded if s["id"] is not None]
    assert len(present) == len(set(present)), "a message appears twice"
    assert not set(present) & set(folded), "a folded message is also sent verbatim"
    expected = [row["id"] for row in stored if row["id"] > boundary and row["id"] not in dropped_ids]
    assert present == [i for i in expected if i not in folded], (
        f"boundary {boundary}: present {present} != expected {expected}"
    )
    assert set(expected) <= set(present) | set(folded)
    if boundary:
        assert any(s["kind"] == "summary" for s in expanded)
    # the estimate is the one of what is sent
    assert context.tokens == counter.count_request(messages, tools)
    # I5
    if any(event.kind == "compression" for event in context.events):
        assert context.tokens <= context.target_tokens or context.sections["retained"] == 0
    assert context.tokens <= context.trigger_tokens or context.sections["retained"] == 0
    assert context.tokens <= context.context_window or context.overflow
