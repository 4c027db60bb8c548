"""The checker of bench/memory_semantics.py on hand-made replay records (a pass and a fail for
every ``expect`` key), the shipped scenario files' structure, and the filler they are padded with."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest

from bench.memory_semantics import (
    KINDS,
    CheckResult,
    block_facts,
    filler_texts,
    main,
    report_text,
    scenario_check,
    scenario_problems,
    scenarios_load,
    with_filler,
)


def entry(key: str, value: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": 1,
        "kind": "other",
        "key": key,
        "value": value,
        "polarity": "positive",
        "provenance": "user",
        "status": "pinned",
        "note": "",
        **fields,
    }


def record(
    *,
    entries: list[dict[str, Any]] | None = None,
    facts_text: str = "",
    summary: str = "",
    recall: str = "",
    history: tuple[str, ...] = (),
    question: str = "Where do I live?",
) -> dict[str, Any]:
    """A question's replay record with the given blocks (docs/replay.md)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    sources: list[dict[str, Any]] = [{"id": None, "kind": "system"}]
    for kind, text in (("facts", facts_text), ("summary", summary), ("recall", recall)):
        if text:
            messages.append({"role": "system", "content": text})
            sources.append({"id": None, "kind": kind})
    for number, text in enumerate(history, start=10):
        messages.append({"role": "user", "content": text})
        sources.append({"id": number, "kind": "history"})
    messages.append({"role": "user", "content": question})
    sources.append({"id": None, "kind": "current"})
    facts: dict[str, Any] = {"pinned": [], "in_window": [], "over_budget": [], "tokens": 0}
    if entries is not None:
        facts["entries"] = entries
    return {"messages": messages, "sources": sources, "facts": facts, "question": {"text": question}}


def scenario(**expect: Any) -> dict[str, Any]:
    return {"name": "t-01", "kind": "update", "note": "test", "conversations": [], "expect": expect}


def verdicts(results: list[CheckResult]) -> list[tuple[str, bool]]:
    return [(result.check, result.ok) for result in results]


def test_current_passes_on_a_matching_entry_and_fails_without_one():
    ok = record(entries=[entry("phone", "0151 2223 4455")])
    bad = record(entries=[entry("phone", "0176 5550 1234")])
    expect = scenario(current=[{"key": "phone", "value": "0151 2223 4455"}])
    assert verdicts(scenario_check(expect, ok)) == [("current", True)]
    (result,) = scenario_check(expect, bad)
    assert not result.ok and result.reason == "no current fact holds it"


def test_current_key_is_a_substring_and_must_match():
    results = scenario_check(
        scenario(current=[{"key": "email", "value": "0151"}]), record(entries=[entry("phone", "0151")])
    )
    assert not results[0].ok and "same value as phone=0151" in results[0].reason


@pytest.mark.parametrize(
    ("constraint", "entry_fields", "ok"),
    [
        ({"polarity": "negative"}, {"polarity": "negative"}, True),
        ({"polarity": "negative"}, {"polarity": "positive"}, False),
        ({"provenance": "user"}, {"provenance": "user"}, True),
        ({"provenance": "user"}, {"provenance": "mentioned"}, False),
        ({"status": "pinned"}, {"status": "pinned"}, True),
        ({"status": "pinned"}, {"status": "over_budget"}, False),
        ({"status": ["pinned", "in_window"]}, {"status": "in_window"}, True),
    ],
)
def test_current_constraints(constraint, entry_fields, ok):
    expect = scenario(current=[{"value": "jazz", **constraint}])
    assert scenario_check(expect, record(entries=[entry("likes", "jazz", **entry_fields)]))[0].ok is ok


def test_not_current_fails_while_the_value_is_current_and_passes_once_it_is_not():
    expect = scenario(not_current=["penicillin"])
    (still,) = scenario_check(expect, record(entries=[entry("allergy", "penicillin")]))
    assert not still.ok and still.reason == "still current as allergy=penicillin (pinned, positive, user)"
    assert scenario_check(expect, record(entries=[entry("allergy", "shellfish")]))[0].ok


def test_a_not_current_pass_is_vacuous_when_no_earlier_request_held_the_value():
    expect = scenario(not_current=["Leeds"])
    last = record(entries=[])
    (vacuous,) = scenario_check(expect, last, [record(entries=[entry("phone", "0151")])])
    assert vacuous.ok and vacuous.vacuous and vacuous.reason == "not current; never current earlier either"
    (real,) = scenario_check(expect, last, [record(entries=[entry("home_address", "Leeds")])])
    assert real.ok and not real.vacuous


def test_not_current_with_a_provenance_allows_a_mentioned_fact():
    expect = scenario(not_current=[{"value": "Tom Reyes", "provenance": "user"}])
    assert scenario_check(expect, record(entries=[entry("sender", "Tom Reyes", provenance="mentioned")]))[0].ok
    assert not scenario_check(expect, record(entries=[entry("name", "Tom Reyes")]))[0].ok


def test_absent_looks_only_at_memory_written_blocks():
    expect = scenario(absent=["Tr0ub4dor&3"])
    verbatim = record(history=("my password is Tr0ub4dor&3",), summary="The user could not log in.")
    assert scenario_check(expect, verbatim)[0].ok
    (leak,) = scenario_check(expect, record(summary="User: my password is Tr0ub4dor&3"))
    assert not leak.ok and leak.reason == "found in the summary block"
    assert not scenario_check(expect, record(recall="Ana: pw Tr0ub4dor&3"))[0].ok
    assert not scenario_check(expect, record(facts_text="[Key facts]\n- password: Tr0ub4dor&3 (msg 3)"))[0].ok


def test_recalled_needs_the_text_in_the_recall_block():
    expect = scenario(recalled=["giant schnauzers"])
    assert scenario_check(expect, record(recall="Ana: two Giant Schnauzers live with us"))[0].ok
    (missing,) = scenario_check(expect, record(history=("two giant schnauzers",)))
    assert not missing.ok and missing.reason == "no recall block"
    assert scenario_check(expect, record(recall="Ana: a cat"))[0].reason == "not in the recall block"


def test_wire_contains_searches_every_message():
    expect = scenario(wire_contains=["2026-12-02"])
    assert scenario_check(expect, record(history=("[2026-12-02] hello",)))[0].ok
    assert not scenario_check(expect, record(history=("hello",)))[0].ok


def test_provenance_of_every_fact_holding_the_value():
    expect = scenario(provenance={"#W2378156": "user"})
    assert scenario_check(expect, record(entries=[entry("order_id", "#W2378156")]))[0].ok
    mixed = record(entries=[entry("order_id", "#W2378156"), entry("id", "#W2378156", provenance="mentioned")])
    (wrong,) = scenario_check(expect, mixed)
    assert not wrong.ok and "id=#W2378156" in wrong.reason
    assert scenario_check(expect, record(entries=[]))[0].reason == "no current fact holds it"


def test_without_entries_the_block_text_is_read():
    block = (
        "[Key facts of this conversation, verbatim]\n- phone: 0176 5550 1234; 0151 2223 4455\n"
        "- allergy: penicillin (msg 1)\n- phone: 0151 (msg 9, current; replaces 0176)"
    )
    assert block_facts([("facts", block)]) == [
        ("phone", "0176 5550 1234"),
        ("phone", "0151 2223 4455"),
        ("allergy", "penicillin"),
        ("phone", "0151"),
    ]
    results = scenario_check(
        scenario(current=[{"key": "phone", "value": "0151 2223 4455"}], not_current=["penicillin"]),
        record(facts_text=block),
    )
    assert verdicts(results) == [("current", True), ("not_current", False)]
    assert "read from the block text" in results[1].reason


def test_without_entries_polarity_comes_from_the_slot_name_and_provenance_cannot_be_checked():
    block = "[Key facts of this conversation, verbatim]\n- likes: jazz (msg 1)\n- dislikes: tea (msg 2)"
    results = scenario_check(
        scenario(
            current=[{"value": "jazz", "polarity": "negative"}, {"value": "tea", "polarity": "negative"}],
            not_current=[{"value": "jazz", "polarity": "positive"}, {"value": "x", "status": "over_budget"}],
            provenance={"jazz": "user"},
        ),
        record(facts_text=block),
    )
    assert [(result.ok, result.reason) for result in results] == [
        (
            False,
            "not current; same value as likes=jazz (pinned, positive) (read from the block text: the record has no facts.entries; polarity from the slot name)",
        ),
        (
            True,
            "current as dislikes=tea (pinned, negative) (read from the block text: the record has no facts.entries; polarity from the slot name)",
        ),
        (
            False,
            "still current as likes=jazz (pinned, positive) (read from the block text: the record has no facts.entries; polarity from the slot name)",
        ),
        (False, "needs facts.entries (status); the record has none"),
        (False, "needs facts.entries (provenance); the record has none"),
    ]


def test_a_record_that_is_not_the_question_fails():
    not_question = {**record(), "question": None}
    del not_question["question"]
    assert verdicts(scenario_check(scenario(absent=["x"]), not_question)) == [("record", False)]


def test_check_mode_reads_a_records_file(tmp_path, capsys):
    name = "withdrawal-01"
    records = tmp_path / "records.jsonl"
    good = record(entries=[entry("allergy", "shellfish")])
    records.write_text(json.dumps({"call": 0}) + "\n" + json.dumps(good) + "\n", encoding="utf-8")
    assert main(["--check", str(records), "--scenario", name]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"semantics_pass=1/1 scenario={name}"
    assert "VACUOUS withdrawal-01 not_current 'penicillin': not current; never current earlier either" in out
    records.write_text(json.dumps(record(entries=[entry("allergy", "penicillin"), entry("allergy", "shellfish")])))
    assert main(["--check", str(records), "--scenario", name]) == 1
    out = capsys.readouterr().out
    assert "FAIL withdrawal-01 not_current 'penicillin': still current as allergy=penicillin" in out


# --- the shipped scenarios --------------------------------------------------------------------


def test_every_kind_has_at_least_ten_well_formed_scenarios():
    scenarios = scenarios_load()
    assert [problem for s in scenarios for problem in scenario_problems(s)] == []
    for kind in KINDS:
        assert sum(s["kind"] == kind for s in scenarios) >= 10, kind
    names = [s["name"] for s in scenarios]
    assert len(names) == len(set(names))


def test_filler_keeps_turns_alternating_and_is_deterministic():
    for s in scenarios_load():
        padded = with_filler(s)
        assert padded == with_filler(s)
        for conversation in padded:
            c = conversation["conversation"]
            speakers = [t["speaker"] for key in c if key.startswith("session_") and key[8:].isdigit() for t in c[key]]
            assert all(a != b for a, b in itertools.pairwise(speakers)), s["name"]


def test_filler_never_contains_a_checked_value():
    bank = filler_texts()
    text = "\n".join(bank["user"] + bank["assistant"]).casefold()
    for s in scenarios_load():
        expect = s["expect"]
        values = [
            i if isinstance(i, str) else i["value"] for k in ("current", "not_current") for i in expect.get(k, [])
        ]
        values += [*expect.get("absent", []), *expect.get("recalled", []), *expect.get("provenance", {})]
        assert [v for v in values if re.search(rf"(?<!\w){re.escape(v.casefold())}(?!\w)", text)] == [], s["name"]


def test_a_filler_place_must_be_an_assistant_turn():
    s = scenarios_load(names=["update-01"])[0]
    assert scenario_problems({**s, "filler_after": ["D1:1"]}) == [
        "update-01: filler_after 'D1:1' is not an assistant turn"
    ]
    assert scenario_problems({**s, "filler_after": ["D9:9"]}) == [
        "update-01: filler_after 'D9:9' names 0 turns, not one"
    ]


def test_report_counts_passes_per_kind_and_vacuous_checks():
    failing = CheckResult("not_current", "'x'", False, "still current as a=x")
    vacuous = CheckResult("not_current", "'y'", True, "not current; never current earlier either", vacuous=True)
    report = report_text(
        [({"name": "update-01", "kind": "update"}, [failing]), ({"name": "update-02", "kind": "update"}, [vacuous])],
        extraction="rule",
        context_window=2048,
    ).splitlines()
    assert report == [
        "FAIL update-01 not_current 'x': still current as a=x",
        "VACUOUS update-02 not_current 'y': not current; never current earlier either",
        "kind_update=1/2",
        "semantics_pass=1/2 kind_update=1/2 vacuous_checks=1 extraction=rule context_window=2048",
    ]
