"""Rule extraction of key facts (docs/memory.md §11): credentials are never facts nor in an excerpt while ordinary
identifiers are kept (F-51); values in quoted, forwarded or pasted text are only mentioned and neither correct nor
withdraw, and a burst of one-shaped values keeps its first few (F-49, F-50); relative dates are stored resolved (F-52)."""

from __future__ import annotations

import json
from datetime import datetime
from zoneinfo import ZoneInfo

from memory.facts.rules import BURST_KEPT, message_rule_facts, rule_facts, tool_call_facts


def test_f51_a_credential_is_never_a_rule_fact_nor_in_an_excerpt_but_the_order_number_is_kept():
    text = "Order #W2378156 please; the API key is sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t and my PIN is 4821."
    facts = rule_facts(text, message_id=1)
    assert [(fact.key, fact.value) for fact in facts] == [("order_id", "#W2378156")]
    (order,) = facts
    assert "sk-proj" not in order.excerpt and "[api key withheld]" in order.excerpt


def test_f51_a_credential_passed_to_a_tool_is_never_a_fact():
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {
                "name": "pay",
                "arguments": json.dumps(
                    {"reservation_id": "ZFA04Y", "card_number": "4111 1111 1111 1111", "password": "Tr0ub4dor&3"}
                ),
            },
        }
    ]
    facts = tool_call_facts(calls, message_id=3)
    assert [(fact.key, fact.value) for fact in facts] == [("reservation_id", "ZFA04Y")]
    assert message_rule_facts({"id": 4, "role": "user", "content": "my one-time code is 482913"}) == []


def said(text: str) -> list[tuple[str, str, str]]:
    return [
        (c.value, c.provenance, c.operation) for c in message_rule_facts({"id": 4, "role": "user", "content": text})
    ]


def test_f49_values_in_forwarded_or_quoted_text_are_only_mentioned():
    text = (
        "My email is hedda.n@mailbox.example. My colleague forwarded this:\n"
        "-----Original Message-----\nFrom: Tom Reyes\nSubject: Budget\n\n"
        "Sorry, typo: reply to my new email tom.reyes@budget.example please."
    )
    assert said(text) == [
        ("hedda.n@mailbox.example", "user", "add"),
        ("tom.reyes@budget.example", "mentioned", "add"),
    ]


def test_f50_a_burst_of_one_shaped_values_keeps_only_its_first_ones():
    log = "\n".join(f"2026-11-24 09:0{n}:00 ERROR request id=A-4821{n} failed" for n in range(8))
    found = said(f"My order #W2378156 failed at checkout. Their log:\n{log}\nAny idea?")

    assert found[0] == ("#W2378156", "user", "add")
    ids = [value for value, _, _ in found if value.startswith("A-")]
    assert ids == ["A-48210", "A-48211"][:BURST_KEPT]
    assert all(provenance == "mentioned" for value, provenance, _ in found[1:])


def test_tool_call_arguments_are_their_own_provenance():
    calls = [{"function": {"name": "find", "arguments": '{"order_id": "#W2378156"}'}}]
    assert [c.provenance for c in tool_call_facts(calls, message_id=3)] == ["tool_args"]


def test_f49_a_mentioned_values_text_never_says_the_user_gave_it():
    text = (
        "My order is #W2378156. My colleague forwarded this:\n"
        "-----Original Message-----\nFrom: Jonathan Meyer\n\nMy customer number is CUST-99812."
    )
    texts = {c.value: c.text for c in message_rule_facts({"id": 4, "role": "user", "content": text})}
    assert texts == {"#W2378156": "user gave order id #W2378156", "CUST-99812": "mentioned identifier CUST-99812"}


def test_f52_a_relative_date_is_stored_resolved_against_the_message_time_with_its_words():
    said = datetime(2026, 11, 22, 10, 0, tzinfo=ZoneInfo("Europe/Berlin"))  # a Sunday
    message = {"id": 7, "role": "user", "content": "Dentist tomorrow at 3pm, order #W2378156.", "created_at": said}

    facts = message_rule_facts(message)

    assert [(fact.key, fact.value) for fact in facts] == [("date", "2026-11-23 15:00"), ("order_id", "#W2378156")]
    assert "“tomorrow at 3pm”" in facts[0].text and "2026-11-22" in facts[0].text
    # The same words in Chinese, and the time as ISO text (a replay record's or an export's).
    chinese = {"id": 8, "role": "user", "content": "我下周五要交房租。", "created_at": said.isoformat()}
    assert [fact.value for fact in message_rule_facts(chinese)] == ["2026-11-27"]


def test_f52_without_a_zoned_message_time_a_relative_date_is_not_guessed():
    naive = {"id": 7, "role": "user", "content": "Dentist tomorrow at 3pm.", "created_at": datetime(2026, 11, 22, 10)}
    assert [(fact.key, fact.value) for fact in message_rule_facts(naive)] == [("time", "3pm")]
    assert [fact.value for fact in rule_facts("Dentist tomorrow at 3pm.", message_id=1)] == ["3pm"]
