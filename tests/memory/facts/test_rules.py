"""Rule extraction of key facts: credentials are never facts, nor shown in a fact's excerpt, while
ordinary identifiers are kept (docs/memory.md §11, F-51)."""

from __future__ import annotations

import json

from memory.facts.rules import message_rule_facts, rule_facts, tool_call_facts


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
