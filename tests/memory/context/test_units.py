"""Pure core: grouping, repair, back-scan, raw archive, elision; one test per fault kind of
docs/memory.md that lives in the core, with its exact small input."""

from __future__ import annotations

from memory.context.assembly import elide_current_turn, flatten
from memory.context.units import back_scan, group_units, split_current_turn, split_system_prompt
from memory.messages import to_wire
from memory.summary.archive import RAW_ARCHIVE_MARKER, raw_archive_line, raw_archive_merge
from tests.memory.builders import COUNTER, asst, system, tool, user


def wire_of(messages):
    return flatten(group_units(messages, COUNTER, allow_trailing_calls=True), wire=True)


def test_f01_orphan_result_never_starts_the_window():
    history = [user("q"), asst(tc=["a"]), tool("a"), user("q2"), asst("answer")]
    units = group_units(history, COUNTER)
    group = units[1]
    assert [m["role"] for m in group.members] == ["assistant", "tool"]
    # a budget that would cut right after asst(tc=[a]) if messages were counted one by one
    budget = units[2].tokens + units[3].tokens + units[1].tokens - 1
    summarize, kept = back_scan(units, budget)
    kept_messages = flatten(kept, wire=True)
    assert kept_messages[0]["role"] != "tool"
    assert group in summarize and group not in kept


def test_f02_dangling_call_list_returned_unchanged_under_budget():
    messages = [user("q"), asst(tc=["a", "b"]), tool("a"), tool("b")]
    assert wire_of(messages) == messages


def test_f03_parallel_batch_stays_on_one_side():
    history = [user("q"), asst(tc=["1", "2"]), tool("1", "x" * 5000), tool("2", "y" * 200), asst("done"), user("next")]
    units = group_units(history, COUNTER)
    batch = units[1]
    assert [m.get("tool_call_id") for m in batch.members] == [None, "1", "2"]
    for budget in range(0, sum(u.tokens for u in units) + 1, 97):
        summarize, kept = back_scan(units, budget)
        assert (batch in summarize) != (batch in kept)


def test_f04_long_batch_moves_with_its_caller():
    ids = [f"t{i}" for i in range(1, 11)]
    history = [user("q"), asst(tc=ids), *[tool(i) for i in ids], asst("answer")]
    units = group_units(history, COUNTER)
    assert len(units) == 3 and len(units[1].members) == 11
    last_six_budget = sum(COUNTER.count_message(m) for m in history[-6:])
    summarize, kept = back_scan(units, last_six_budget)
    assert units[1] in summarize and flatten(kept, wire=True) == [history[-1]]


def test_f05_every_result_id_is_checked():
    messages = [asst(tc=["y"]), tool("x"), tool("y"), user("next")]
    out = wire_of(messages)
    assert [m.get("tool_call_id") for m in out if m["role"] == "tool"] == ["y"]
    units = group_units(messages, COUNTER)
    assert any("'x'" in note for note in units[0].repairs)


def test_f06_pairing_by_id_inserts_nothing():
    call = asst(tc=["read", "grep"])
    messages = [user("q"), call, tool("grep"), tool("read")]
    assert wire_of(messages) == messages


def test_dangling_call_in_history_is_closed_in_the_wire_copy_only():
    call = asst("checking", tc=["a", "b"])
    messages = [user("q"), call, tool("a"), user("next")]
    out = wire_of(messages)
    assert [c["id"] for c in out[1]["tool_calls"]] == ["a"]
    assert [c["id"] for c in call["tool_calls"]] == ["a", "b"], "the stored dict must not change (I6)"


def test_trailing_calls_still_executing_are_left_alone():
    messages = [user("q"), asst(tc=["a"])]
    assert wire_of(messages) == messages
    assert flatten(group_units(messages, COUNTER), wire=True) == [user("q")]


def test_f08_the_newest_user_message_is_the_current_turn():
    history, current = split_current_turn([user("Hello"), asst("Bye"), user("and now?")])
    assert current == [user("and now?")] and history == [user("Hello"), asst("Bye")]


def test_f09_only_the_first_system_message_is_the_system_prompt():
    notice = system("maintenance notice")
    prompt, rest = split_system_prompt([system("prompt"), user("a"), notice, user("b")])
    assert prompt == system("prompt") and notice in rest
    prompt, rest = split_system_prompt([user("a"), notice])
    assert prompt is None and rest == [user("a"), notice]


def test_f18_zero_or_negative_budget_keeps_nothing():
    units = group_units([user("a"), asst("b")], COUNTER)
    for budget in (0, -1, -10_000):
        summarize, kept = back_scan(units, budget)
        assert kept == [] and summarize == units


def test_f25_tool_call_message_with_null_content_renders():
    line = raw_archive_line(asst(None, tc=["a"], tool="calc"))
    assert line.startswith("- Assistant [tools: calc]:")


def test_a_raw_archive_line_names_a_named_speaker():
    assert raw_archive_line({"role": "user", "content": "I paint.", "name": "Mel"}) == "- User (Mel): I paint."
    assert raw_archive_line({"role": "assistant", "content": "Nice!", "name": "Jo"}) == "- Assistant (Jo): Nice!"


def test_raw_archive_line_shapes_and_500_character_cut():
    assert raw_archive_line(user("hi")) == "- User: hi"
    assert raw_archive_line(asst("ok")) == "- Assistant: ok"
    assert raw_archive_line(tool("a", "found", name="kb_search")) == "- Tool[kb_search]: found"
    long_line = raw_archive_line(user("z" * 2000))
    assert len(long_line) == len("- User: ") + 500


def test_raw_archive_merge_keeps_old_summary_and_one_flat_section():
    text = raw_archive_merge("User id is ada_1815.", [user("first")], max_tokens=500, counter=COUNTER)
    assert text.startswith("User id is ada_1815.") and RAW_ARCHIVE_MARKER in text
    again = raw_archive_merge(text, [user("second")], max_tokens=500, counter=COUNTER)
    assert again.count(RAW_ARCHIVE_MARKER) == 1
    assert again.endswith("- User: first\n- User: second")


def test_raw_archive_stays_bounded_across_many_degraded_merges():
    text = ""
    for i in range(200):
        text = raw_archive_merge(text, [user(f"message number {i} " + "w" * 300)], max_tokens=300, counter=COUNTER)
        assert COUNTER.count_text(text) <= 300
    assert "earlier archived messages omitted]" in text and "message number 199" in text
    omitted = int(text.split("- [", 1)[1].split(" ", 1)[0])
    assert omitted + text.count("- User:") == 200


def test_f07_elision_touches_tool_results_never_the_question():
    question = user("what does the retrieval say?")
    big = {**tool("search", "word " * 20_000), "id": 3}
    current = [question, asst(tc=["search"]), big]
    before = sum(COUNTER.count_message(m) for m in current)
    out, records = elide_current_turn(current, before - 1000, COUNTER)
    assert out[0] == question and "tokens elided to fit the context window" in out[2]["content"]
    assert big["content"] == "word " * 20_000
    assert records[0]["id"] == 3 and records[0]["tokens_after"] < records[0]["tokens_before"]
    assert sum(COUNTER.count_message(m) for m in out) <= 1000 + 50


def test_to_wire_strips_internal_keys():
    assert to_wire({"id": 4, "token_count": 9, "role": "user", "content": "x"}) == {"role": "user", "content": "x"}
    assert to_wire({**asst(tc=["a"]), "id": 5})["content"] is None


def test_raw_archive_always_records_what_it_folded_even_when_the_old_summary_fills_the_cap():
    old_summary = " ".join(f"fact{i}" for i in range(400))
    assert COUNTER.count_text(old_summary) > 150
    text = raw_archive_merge(old_summary, [user("teal is my favourite colour")] * 22, max_tokens=150, counter=COUNTER)
    assert COUNTER.count_text(text) <= 150
    assert text.startswith("fact0 fact1") and text.endswith("- [22 earlier archived messages omitted]")
    again = raw_archive_merge(text, [user("more")] * 22, max_tokens=150, counter=COUNTER)
    assert again.endswith("- [44 earlier archived messages omitted]") and again.count(RAW_ARCHIVE_MARKER) == 1
