"""What the model is shown (docs/memory.md F-38, F-40, I5): whole turns after the summary,
strict alternation, an oversized stored summary shrunk, elision aimed at the window minus the
reply reserve, and in-turn compaction instead of refusals. One test per fault kind, each on its
small input with the right value; the property over generated conversations is in
tests/memory/context/test_properties.py."""

from __future__ import annotations

import copy

import pytest
from asgiref.sync import async_to_sync

from memory.context.budget import MemoryBudget
from memory.context.planner import plan_request
from memory.context.request import ContextRequest
from memory.context.units import back_scan
from memory.summary.archive import RAW_ARCHIVE_MARKER, SUMMARY_TRIMMED, trim_summary
from memory.summary.extractive import ExtractiveSummarizer
from memory.summary.store import InMemorySummaryStore, Summary
from tests.memory.builders import COUNTER, ScriptedSummarizer, Store, asst, tool, user
from tests.memory.conftest import make_engine
from tests.memory.invariants import assert_no_orphans, check_context

SYSTEM = "You are a helpful assistant."


def build(engine, store, key="k", *, mode="agent", system=SYSTEM, strict=False, single_system=False):
    snapshot = store.snapshot()
    context = async_to_sync(engine.build_context)(
        ContextRequest(memory_key=key, system_prompt=system, load_increment=store.load_increment, mode=mode)
    )
    assert store.rows == snapshot, "I6: stored rows changed"
    check_context(
        context,
        stored=store.rows,
        system_prompt=system,
        counter=COUNTER,
        strict_alternation=strict,
        single_system=single_system,
    )
    return context


def roles(context):
    return [message["role"] for message in context.messages]


# --- F-38: a turn is never split between the summary and the window -------------------------

SPLIT_TURN = [
    user("Please look into my booking. " + "details " * 400),
    asst(None, tc=["a"]),
    tool("a", "reservation ABC123 found " * 10),
    asst("Your reservation ABC123 is confirmed."),
    user("Thanks, and the baggage?"),
]


@pytest.mark.parametrize("summary_role", ["system", "user"])
def test_f38_the_window_after_the_summary_starts_with_a_user_message(summary_role):
    store = Store()
    store.add(*SPLIT_TURN)
    budget = MemoryBudget(context_window=640, summary_role=summary_role)
    plan = plan_request(
        system={"role": "system", "content": SYSTEM},
        summary=Summary(),
        increment=store.rows,
        budget=budget,
        counter=COUNTER,
    )
    # The input really exercises the fault: the plain back-scan keeps the answer of a question
    # it summarizes, i.e. [system, summary, asst(tool_calls), tool, assistant, user].
    _, old_cut = back_scan(plan.history, plan.retain_budget)
    assert [unit.members[0]["role"] for unit in old_cut] == ["assistant", "assistant"]
    engine = make_engine(
        640,
        ScriptedSummarizer(default="User asked about booking ABC123."),
        summary_role=summary_role,
        store=InMemorySummaryStore(),
    )
    context = build(engine, store, single_system=summary_role == "user")
    # The whole first turn went into the summary; the window starts with the follow-up question.
    assert roles(context) == ["system", summary_role, "user"]
    assert context.summary.last_message_id == 4
    assert context.messages[-1] == user("Thanks, and the baggage?")


def test_f38_a_boundary_stored_inside_a_turn_is_moved_to_the_next_turn_start():
    store = Store()
    store.add(*SPLIT_TURN)
    port = InMemorySummaryStore()
    engine = make_engine(8192, ScriptedSummarizer(default="User asked about booking ABC123."), store=port)
    # As an older version stored it: the question summarized, its answer not.
    port.summaries["k"] = Summary(
        content="User asked about a booking.", summary_type="llm", last_message_id=1, compressed_count=1, version=1
    )
    context = build(engine, store)
    assert roles(context) == ["system", "system", "user"]
    assert context.summary.last_message_id == 4 and context.events[0].kind == "compression"
    again = build(engine, store)
    assert again.events == [], "once snapped, a request under the trigger compresses nothing"


# --- F-38: strict alternation -----------------------------------------------------------------


def test_f38_strict_alternation_merges_the_summary_as_user_with_the_next_user_message():
    store = Store()
    for i in range(12):
        store.add(user(f"Question {i}: " + "lorem " * 40), asst(f"Answer {i}: " + "ipsum " * 40))
    store.add(user("final question"))
    loose = make_engine(summary_role="user", primary=ScriptedSummarizer(default="facts"), store=InMemorySummaryStore())
    plain = build(loose, store, single_system=True)
    assert roles(plain)[:3] == ["system", "user", "user"], "without the option the fault is there"
    strict = make_engine(
        summary_role="user",
        strict_alternation=True,
        primary=ScriptedSummarizer(default="facts"),
        store=InMemorySummaryStore(),
    )
    context = build(strict, store, strict=True, single_system=True)
    assert roles(context)[:3] == ["system", "user", "assistant"]
    merged = context.messages[1]["content"]
    assert merged.startswith("[Memory Summary - ") and "\nfacts\n\nQuestion " in merged
    assert context.sources[1]["kind"] == "summary" and context.sources[1]["merged"][0]["kind"] == "history"
    assert context.tokens == COUNTER.count_request(context.messages)
    assert sum(context.sections.values()) + 3 == context.tokens


def test_f38_two_tabs_user_user_assistant_assistant_are_merged_in_the_copy_only():
    store = Store()
    rows = store.add(user("first tab: what is my seat?"), user("second tab: and my meal?"))
    rows += store.add(asst("Your seat is 14C."), asst("Your meal is vegetarian."), user("thanks"))
    engine = make_engine(strict_alternation=True, store=InMemorySummaryStore())
    context = build(engine, store, strict=True)
    assert context.messages == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "first tab: what is my seat?\n\nsecond tab: and my meal?"},
        {"role": "assistant", "content": "Your seat is 14C.\n\nYour meal is vegetarian."},
        {"role": "user", "content": "thanks"},
    ]
    assert context.sources[1] == {"id": 1, "kind": "history", "merged": [{"id": 2, "kind": "history"}]}
    assert context.sources[2] == {"id": 3, "kind": "history", "merged": [{"id": 4, "kind": "history"}]}
    assert [row["content"] for row in store.rows[:2]] == ["first tab: what is my seat?", "second tab: and my meal?"]


def test_f38_a_merged_part_still_counts_in_its_own_section():
    store = Store()
    store.add(user("My account is ACC-7731."))  # a message whose reply failed: two user messages in a row
    (current,) = store.add(user("What is my account id? " + "please " * 30))
    engine = make_engine(strict_alternation=True, store=InMemorySummaryStore())
    context = build(engine, store, strict=True)
    assert context.sources[1]["merged"] == [{"id": current["id"], "kind": "current"}]
    # Merged into the history message before it, the question still counts as the current turn.
    assert context.sections["current"] >= COUNTER.count_text(current["content"]) > 0
    assert sum(context.sections.values()) + 3 == context.tokens == COUNTER.count_request(context.messages)


def test_f38_strict_alternation_keeps_tool_calls_paired():
    store = Store()
    store.add(user("check my booking"), asst("Let me look."), asst(None, tc=["a", "b"]), tool("b", "B"), tool("a", "A"))
    store.add(asst("Done."), asst("Anything else?"), user("no"))
    engine = make_engine(strict_alternation=True, store=InMemorySummaryStore())
    context = build(engine, store, strict=True)
    assert roles(context) == ["system", "user", "assistant", "tool", "tool", "assistant", "user"]
    call = context.messages[2]
    assert call["content"] == "Let me look." and [c["id"] for c in call["tool_calls"]] == ["a", "b"]
    assert_no_orphans(context.messages)
    assert context.messages[5]["content"] == "Done.\n\nAnything else?"


# --- F-40: a stored summary over the current cap ------------------------------------------------


def oversized_summary() -> Summary:
    lines = [f"- User: fact {i}: booking REF{i:04d} for passenger number {i}" for i in range(150)]
    return Summary(content="\n".join(lines), summary_type="llm", last_message_id=2, compressed_count=2, version=1)


@pytest.mark.parametrize("healthy", [True, False])
def test_f40_an_oversized_stored_summary_is_shrunk_on_the_next_compression(healthy):
    store = Store()
    store.add(user("old question"), asst("old answer"), user("Which booking was first?"), asst("REF0000."))
    store.add(user("And the next one?"))
    primary = ExtractiveSummarizer(COUNTER) if healthy else ScriptedSummarizer(default=RuntimeError("HTTP 500"))
    port = InMemorySummaryStore()
    engine = make_engine(2048, primary, attempts=1, store=port)
    port.summaries["k"] = oversized_summary()
    assert COUNTER.count_text(oversized_summary().content) > 10 * engine.summary_cap
    context = build(engine, store)
    kinds = [event.kind for event in context.events]
    assert kinds[0] == "compression", kinds
    stored = port.summaries["k"]
    assert COUNTER.count_text(stored.content) <= engine.summary_cap
    assert stored.content.startswith("- User: fact 0: booking REF0000"), "the earliest facts stay (I7)"
    assert stored.last_message_id == 2 and stored.compressed_count == 2 and stored.version == 2
    assert context.events[0].degraded is (not healthy)
    if not healthy:
        assert stored.content.endswith(SUMMARY_TRIMMED)
    again = build(engine, store)
    assert again.events == [], "no request is left stuck with no_progress"


def test_trim_summary_bounds_an_archive_and_keeps_its_count():
    archive = (
        "Facts.\n\n" + RAW_ARCHIVE_MARKER + "\n" + "\n".join(f"- User: message {i} " + "w" * 300 for i in range(40))
    )
    trimmed = trim_summary(archive, 120, COUNTER)
    assert COUNTER.count_text(trimmed) <= 120 and "earlier archived messages omitted]" in trimmed
    assert trim_summary("short", 120, COUNTER) == "short"


# --- I5: elision aims at the window minus the reply reserve -----------------------------------


def test_elision_cuts_only_what_is_needed_oldest_first_and_keeps_the_newest_result_whole():
    store = Store()
    first = store.add(user("compare both documents"), asst(None, tc=["a"]), tool("a", "alpha " * 1500))[2]
    newest = store.add(asst(None, tc=["b"]), tool("b", "beta " * 300))[1]
    engine = make_engine(2048, store=InMemorySummaryStore())
    context = build(engine, store)
    limit = 2048 - 2048 // 8  # the window minus the default reply reserve (an eighth)
    # Before: cut down to the target of 614 tokens, the newest result included.
    assert limit - 10 <= context.tokens <= limit
    assert [record["id"] for record in context.elisions] == [first["id"]]
    assert context.messages[-1]["content"] == newest["content"], "the newest result stays whole"
    assert not context.overflow
    assert engine.budget.request_limit_tokens == limit == 1792


def test_a_turn_under_the_request_limit_is_not_elided_even_over_the_target():
    store = Store()
    store.add(user("summarize this"), asst(None, tc=["a"]), tool("a", "gamma " * 900))
    engine = make_engine(2048, store=InMemorySummaryStore())
    context = build(engine, store)
    assert context.tokens > engine.budget.target_tokens and context.elisions == []
    assert context.messages[-1]["content"] == "gamma " * 900


# --- I5: in-turn compaction instead of refusals -------------------------------------------------

LONG_SYSTEM = "Airline policy. " + "Follow every rule of the policy carefully. " * 180


def agent_turn(store, steps: int):
    store.add(user("Please downgrade all my business flights; my user id is omar_davis_3817."))
    for i in range(steps):
        store.add(
            asst(None, tc=[f"c{i}"], tool="get_reservation_details"),
            tool(f"c{i}", f'{{"reservation_id": "R{i:05d}", "cabin": "business", "price": {100 + i}}} ' * 3),
        )


def test_older_steps_of_the_current_turn_are_folded_instead_of_refused():
    # A 1,400-token system prompt and an agent turn of 14 tool calls at a 2,048 window: before,
    # the request stayed over the window after elision and was refused (overflow).
    assert 1400 < COUNTER.count_text(LONG_SYSTEM) < 1500
    store = Store()
    agent_turn(store, 14)
    summarizer = ScriptedSummarizer(default="Looked up R00000 to R00012: all business.")
    engine = make_engine(2048, summarizer, store=InMemorySummaryStore())
    context = build(engine, store, system=LONG_SYSTEM)
    assert not context.overflow and context.tokens <= engine.budget.request_limit_tokens
    note = next(source for source in context.sources if "folded" in source)
    assert note["folded"] == list(range(2, 28)), "every older step, whole groups, never the question"
    assert context.messages[1]["content"] == store.rows[0]["content"]
    assert context.messages[2]["content"].startswith("[Steps so far in this turn - 26 earlier messages folded")
    assert "Looked up R00000 to R00012" in context.messages[2]["content"]
    # The newest step is sent whole: its call and its result, paired.
    assert context.messages[-2]["tool_calls"][0]["id"] == "c13" and context.messages[-1]["tool_call_id"] == "c13"
    assert context.messages[-1]["content"] == store.rows[-1]["content"]
    overflow = next(event for event in context.events if event.kind == "overflow")
    assert any("folded 26 earlier message(s)" in n for n in overflow.notes) and overflow.attempts[0]["ok"]
    # The next model call of the same turn folds only the step added since (incremental).
    store.add(asst(None, tc=["c14"], tool="get_reservation_details"), tool("c14", '{"reservation_id": "R00014"}'))
    build(engine, store, system=LONG_SYSTEM)
    last = summarizer.requests[-1]
    assert [m["id"] for m in last.messages] == [28, 29]
    assert last.previous_summary == "Looked up R00000 to R00012: all business."


def test_in_turn_folding_uses_the_raw_archive_when_the_summarizer_fails():
    store = Store()
    agent_turn(store, 14)
    engine = make_engine(
        2048, ScriptedSummarizer(default=RuntimeError("down")), attempts=1, store=InMemorySummaryStore()
    )
    context = build(engine, store, system=LONG_SYSTEM)
    assert not context.overflow
    note = context.messages[2]["content"]
    assert note.startswith("[Steps so far in this turn - 26 earlier messages archived")
    assert "get_reservation_details" in note


def test_refused_only_when_system_question_and_newest_step_alone_do_not_fit():
    store = Store()
    agent_turn(store, 3)
    engine = make_engine(2048, store=InMemorySummaryStore())
    huge_system = "Policy. " + "rule " * 2100
    context = build(engine, store, system=huge_system)
    assert context.overflow


def test_folding_never_splits_a_parallel_group():
    store = Store()
    store.add(user("check everything"))
    for i in range(6):
        ids = [f"p{i}a", f"p{i}b", f"p{i}c"]
        store.add(asst(None, tc=ids), *[tool(call, "x " * 60) for call in reversed(ids)])
    engine = make_engine(2048, ScriptedSummarizer(default="checked"), store=InMemorySummaryStore())
    context = build(engine, store, system=LONG_SYSTEM)
    assert not context.overflow
    assert_no_orphans(context.messages)
    assert [m.get("tool_call_id") for m in context.messages[-3:]] == ["p5c", "p5b", "p5a"]
    assert copy.deepcopy(context.messages[-4]["tool_calls"]) == store.rows[-4]["tool_calls"]


def test_the_reply_reserve_is_an_eighth_of_the_window_by_default_and_validated():
    assert MemoryBudget(context_window=2048).request_limit_tokens == 1792
    assert MemoryBudget(context_window=128_000).reply_reserve == 4096
    assert MemoryBudget(context_window=2048, reply_reserve_tokens=0).request_limit_tokens == 2048
    with pytest.raises(ValueError, match="reply_reserve_tokens"):
        MemoryBudget(context_window=2048, reply_reserve_tokens=2048)


@pytest.mark.parametrize(
    "summarizer", [ExtractiveSummarizer(COUNTER), ScriptedSummarizer(default=RuntimeError("down"))]
)
def test_f51_a_steps_so_far_note_withholds_the_credentials_of_the_folded_steps(summarizer):
    store = Store()
    store.add(user("Please check my reservations; my user id is omar_davis_3817."))
    for i in range(14):
        store.add(
            asst(None, tc=[f"c{i}"], tool="get_reservation_details"),
            tool(f"c{i}", f'{{"reservation_id": "R{i:05d}", "api_key": "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs{i:02d}"}} ' * 3),
        )
    engine = make_engine(2048, summarizer, attempts=1, store=InMemorySummaryStore())
    context = build(engine, store, system=LONG_SYSTEM)
    (note,) = [m["content"] for m, s in zip(context.messages, context.sources, strict=True) if "folded" in s]
    assert "reservation_id" in note and "[api key withheld]" in note and "sk-proj" not in note
    assert "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs13" in context.messages[-1]["content"], "the newest step stays as stored"
