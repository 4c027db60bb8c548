"""Rule extraction of a user's message and where its values came from (docs/memory.md §11, F-49, F-50): values in
quoted, forwarded or pasted text are only mentioned and neither correct nor withdraw; a burst of one-shaped values
keeps its first few."""

from __future__ import annotations

from memory.facts.rules import BURST_KEPT, message_rule_facts, tool_call_facts


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
