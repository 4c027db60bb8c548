"""LLM key-fact extraction in the pure core (docs/memory.md §11): the reply is parsed tolerantly
(fences, prose, a bare list) and refused when it holds no facts list (F-29); every item is
validated in code: grounded in a cited user message or tool call (F-30), supersession only within
its slot and never of a fact the user pinned (F-28)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from memory.facts.extraction import (
    EXTRACTION_MARKER,
    ExtractionError,
    ExtractionInput,
    extraction_prompt,
    parse_extraction,
    validate_extraction,
)
from memory.facts.values import KeyFact

ITEM = {"kind": "id", "key": "order_id", "value": "#W2378156", "text": "order", "source": [1], "supersedes": []}


@pytest.mark.parametrize(
    "reply",
    [
        json.dumps({"facts": [ITEM]}),
        "```json\n" + json.dumps({"facts": [ITEM]}) + "\n```",
        "Here are the facts:\n" + json.dumps({"facts": [ITEM]}) + "\nHope this helps.",
        json.dumps([ITEM]),
        json.dumps([ITEM, "not an object", 3]),
    ],
    ids=["plain", "fenced", "prose-around", "bare-list", "bare-list-with-junk"],
)
def test_parse_extraction_reads_the_facts_list_however_it_is_wrapped(reply):
    assert parse_extraction(reply) == [ITEM]


@pytest.mark.parametrize(
    "reply",
    ["", "   ", "I could not find any facts.", "{}", '{"facts": "none"}', '{"facts": [', "```json\n{oops}\n```"],
    ids=["empty", "blank", "prose", "empty-object", "facts-not-a-list", "truncated", "fenced-garbage"],
)
def test_parse_extraction_refuses_a_reply_without_a_facts_list(reply):
    with pytest.raises(ExtractionError):
        parse_extraction(reply)


def test_an_empty_facts_list_is_a_valid_answer():
    assert parse_extraction('{"facts": []}') == []


MESSAGES = [
    {"id": 11, "role": "user", "content": "My order is #W2378156 and I'm allergic to penicillin."},
    {"id": 12, "role": "assistant", "content": "You could try the Blue Plan or order #Z9999999."},
    {
        "id": 13,
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "find", "arguments": '{"user_id": "mia_li_3668"}'}}
        ],
    },
    {"id": 14, "role": "tool", "content": "Found order #Q1234567 for mia_li_3668"},
    {"id": 15, "role": "user", "content": "we moved; the new address is 48 Birch Lane"},
]


def item(value: str, source: list[int], *, kind: str = "other", key: str = "slot", supersedes=()) -> dict:
    return {"kind": kind, "key": key, "value": value, "text": value, "source": source, "supersedes": list(supersedes)}


def fact(fact_id: int, key: str, value: str, **kwargs) -> KeyFact:
    return KeyFact(id=fact_id, kind="address", key=key, value=value, text=value, source_message_id=2, **kwargs)


def test_f30_a_value_must_occur_in_a_cited_user_message_or_tool_call():
    data = ExtractionInput(messages=MESSAGES, facts=[])
    result = validate_extraction(
        [
            item("#W2378156", [1], kind="id", key="order_id"),  # grounded in the user's words
            item("penicillin", [2, 1], kind="preference", key="allergy"),  # the second source grounds it
            item("mia_li_3668", [3], kind="id", key="user_id"),  # tool-call arguments
            item("#W9999999", [1], kind="id", key="order_id"),  # hallucinated: not in message 1
            item("#W2378156", [5], kind="id", key="order_id"),  # real value, wrong source
            item("Blue Plan", [2], kind="preference", key="plan"),  # the assistant's suggestion
            item("#Q1234567", [4], kind="id", key="order_id"),  # only in a tool result
            item("penicillin", [99], kind="preference", key="allergy"),  # no such message
        ],
        data,
        extractor="llm:test",
    )
    assert [(c.key, c.value, c.source_message_id, c.extractor) for c in result.accepted] == [
        ("order_id", "#W2378156", 11, "llm:test"),
        ("allergy", "penicillin", 11, "llm:test"),
        ("user_id", "mia_li_3668", 13, "llm:test"),
    ]
    assert [r["item"]["value"] for r in result.rejected] == [
        "#W9999999",
        "#W2378156",
        "Blue Plan",
        "#Q1234567",
        "penicillin",
    ]
    assert all("does not occur" in r["reason"] for r in result.rejected)


def test_a_value_is_stored_as_spelled_in_the_message_even_when_the_model_changed_its_case():
    data = ExtractionInput(messages=MESSAGES, facts=[])
    (accepted,) = validate_extraction(
        [item("48  birch lane", [5], kind="address", key="address")], data, extractor="llm:m"
    ).accepted
    assert accepted.value == "48 Birch Lane"
    assert "48 Birch Lane" in accepted.excerpt


def test_f28_supersession_stays_within_the_slot_and_never_retires_a_pinned_fact():
    facts = [
        fact(101, "home_address", "12 Elm Road"),
        fact(102, "allergy", "peanuts"),
        fact(103, "home_address", "7 Pinned Way", pinned_by_user=True),
        fact(104, "home_address", "1 Old Street", invalidated_at=None, hidden_by_user=True),
    ]
    data = ExtractionInput(messages=MESSAGES, facts=facts)
    result = validate_extraction(
        [item("48 Birch Lane", [5], kind="address", key="home_address", supersedes=[1, 2, 3, 4, 9])],
        data,
        extractor="llm:m",
    )
    (accepted,) = result.accepted
    assert accepted.supersedes == (101,), "only the active, unpinned fact of the same slot"
    reasons = [r["reason"] for r in result.rejected]
    assert len(reasons) == 4 and all(reason.startswith("supersedes handle") for reason in reasons)


def test_an_unchanged_restatement_of_an_active_fact_is_dropped_silently():
    data = ExtractionInput(messages=MESSAGES, facts=[fact(101, "order_id", "#W2378156")])
    result = validate_extraction([item("#w2378156", [1], kind="id", key="order_id")], data, extractor="llm:m")
    assert (result.accepted, result.rejected) == ([], [])


def test_the_prompt_numbers_the_new_messages_and_gives_the_facts_handles():
    data = ExtractionInput(
        messages=[{**MESSAGES[0], "created_at": "2026-03-04T10:00:00+00:00"}, MESSAGES[2]],
        facts=[fact(101, "home_address", "12 Elm Road")],
    )
    system, material = extraction_prompt(data)
    assert system["role"] == "system" and material["role"] == "user"
    text = material["content"]
    assert "[1] address home_address: 12 Elm Road" in text
    assert EXTRACTION_MARKER in text
    assert "1. (2026-03-04) User: My order is #W2378156" in text
    assert '2. Assistant: find({"user_id": "mia_li_3668"})' in text


def test_f51_an_extracted_credential_is_rejected_and_never_shown_in_a_facts_text_or_excerpt():
    messages = [
        {"id": 21, "role": "user", "content": "My booking is ZFA04Y and my password is Blue-Falcon-88."},
        {
            "id": 22,
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "login", "arguments": '{"password": "hunter2x"}'}}
            ],
        },
    ]
    data = ExtractionInput(messages=messages, facts=[])
    leaked = {**item("ZFA04Y", [1], kind="id", key="reservation_id"), "text": "booking ZFA04Y, password Blue-Falcon-88"}
    result = validate_extraction(
        [leaked, item("Blue-Falcon-88", [1], key="password"), item("hunter2x", [2], key="password")],
        data,
        extractor="llm:test",
    )
    (booking,) = result.accepted
    assert booking.value == "ZFA04Y"
    assert "Blue-Falcon-88" not in booking.text and "[password withheld]" in booking.text
    assert "Blue-Falcon-88" not in booking.excerpt and "ZFA04Y" in booking.excerpt
    assert [(r["item"]["value"], r["reason"]) for r in result.rejected] == [
        ("Blue-Falcon-88", "value is a credential"),
        ("hunter2x", "value is a credential"),
    ]
    prompt = extraction_prompt(data)[-1]["content"]
    assert "ZFA04Y" in prompt and "Blue-Falcon-88" not in prompt and "hunter2x" not in prompt


WITHDRAWING = [
    {"id": 21, "role": "user", "content": "I'm allergic to penicillin. And I love jazz."},
    {"id": 22, "role": "user", "content": "Good news: I'm no longer allergic to penicillin."},
    {"id": 23, "role": "user", "content": "Funny thing, I don't like jazz anymore."},
]


def test_f46_a_retract_is_accepted_only_when_the_cited_message_withdraws():
    allergy = fact(7, "allergy", "penicillin")
    data = ExtractionInput(messages=WITHDRAWING, facts=[allergy])
    retract = {**item("penicillin", [2], kind="preference", key="allergy", supersedes=[1]), "operation": "retract"}
    unsupported = {**retract, "source": [1]}

    result = validate_extraction([retract, unsupported], data, extractor="llm:m")

    (accepted,) = result.accepted
    assert (accepted.operation, accepted.supersedes, accepted.source_message_id) == ("retract", (7,), 22)
    assert [r["reason"] for r in result.rejected] == ["retract: no cited user message withdraws a fact"]


def test_f47_a_value_held_with_the_other_polarity_is_not_dropped_as_a_restatement():
    liked = replace(fact(8, "likes", "jazz"), kind="preference")
    data = ExtractionInput(messages=WITHDRAWING, facts=[liked])
    disliked = {**item("jazz", [3], kind="preference", key="dislikes"), "polarity": "negative"}

    (accepted,) = validate_extraction([disliked], data, extractor="llm:m").accepted

    assert (accepted.key, accepted.value, accepted.polarity) == ("dislikes", "jazz", "negative")
    assert validate_extraction([item("jazz", [1], kind="preference", key="likes")], data, extractor="x").accepted == []


FORWARDED = [
    {
        "id": 31,
        "role": "user",
        "content": "My name is Ana Kovač. My landlord forwarded this to me: ---------- Forwarded message ---------\n"
        "From: Tom Reyes <tom.reyes@lettings.example>\nSubject: Boiler\n\n"
        "Hello, my name is Tom Reyes and I live at 4 Elm Street. Order #W2378156 is yours.",
    }
]


def test_f49_forwarded_text_yields_no_fact_about_the_user_and_its_identifiers_are_only_mentioned():
    data = ExtractionInput(messages=FORWARDED, facts=[])
    items = [
        item("Ana Kovač", [1], kind="name", key="name"),
        item("Tom Reyes", [1], kind="name", key="name"),
        item("4 Elm Street", [1], kind="address", key="home_address"),
        item("#W2378156", [1], kind="id", key="order_id"),
    ]
    result = validate_extraction(items, data, extractor="llm:m")

    assert [(c.value, c.provenance) for c in result.accepted] == [("Ana Kovač", "user"), ("#W2378156", "mentioned")]
    assert [r["item"]["value"] for r in result.rejected] == ["Tom Reyes", "4 Elm Street"]
