"""The offline engine's answers to key-fact extraction requests (docs/memory.md §11): deterministic
JSON with the rule facts and simple English and Chinese patterns for digit-free facts, values
verbatim, supersession of single-valued slots; and extraction requests count as summarizer
requests (``OFFLINE_FAIL_SUMMARY``, ``OFFLINE_SUMMARY_DELAY_SECONDS``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chatapp.llm.clients import LLMError, summary_endpoint
from chatapp.llm.offline.facts import extraction_reply, is_extraction_request
from chatapp.llm.summarizer import OpenAISummarizer
from memory.api import KeyFact, SummaryRequest
from memory.facts.extraction import (
    EXTRACTION_SCHEMA,
    EXTRACTION_SCHEMA_NAME,
    ExtractionInput,
    extraction_prompt,
    parse_extraction,
    validate_extraction,
)

pytestmark = pytest.mark.usefixtures("offline_engine")


def extract(*texts: str | dict[str, Any], facts: list[KeyFact] | None = None) -> list[dict[str, Any]]:
    """The offline engine's facts for user messages ``texts`` (dicts are taken as messages)."""
    messages = [
        {"id": 100 + n, "role": "user", "content": text} if isinstance(text, str) else {"id": 100 + n, **text}
        for n, text in enumerate(texts)
    ]
    return json.loads(extraction_reply(extraction_prompt(ExtractionInput(messages=messages, facts=facts or []))))[
        "facts"
    ]


def found(*texts: str | dict[str, Any], facts: list[KeyFact] | None = None) -> set[tuple[str, str, str]]:
    return {(item["kind"], item["key"], item["value"]) for item in extract(*texts, facts=facts)}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("My name is Mia Li and I need help.", ("name", "name", "Mia Li")),
        ("Hi, I'm Mia Li, calling about a refund.", ("name", "name", "Mia Li")),
        ("I live in Denver, Colorado.", ("address", "home_address", "Denver")),
        ("We have moved to Lyon.", ("address", "home_address", "Lyon")),
        ("My new address is 48 Birch Lane.", ("address", "address", "48 Birch Lane")),
        ("I'm allergic to penicillin and it is serious.", ("preference", "allergy", "penicillin")),
        ("my dog is called Biscuit!", ("name", "pet_name", "Biscuit")),
        ("My cat's name is Tom.", ("name", "pet_name", "Tom")),
        ("I love green tea.", ("preference", "likes", "green tea")),
        ("I prefer window seats", ("preference", "preference", "window seats")),
        ("I really don't like cilantro.", ("preference", "dislikes", "cilantro")),
        ("我叫李明，我住在上海。", ("name", "name", "李明")),
        ("我叫李明，我住在上海。", ("address", "home_address", "上海")),
        ("我对花生过敏", ("preference", "allergy", "花生")),
        ("我对花生过敏，也对芒果过敏。", ("preference", "allergy", "芒果")),
        ("他说：“我叫王强，住在北京。” 我叫李娜，住在上海。", ("address", "home_address", "上海")),
        ("我很喜欢吃辣，越辣越好。", ("preference", "likes", "吃辣")),
        ("我现在不喜欢吃辣了。", ("preference", "dislikes", "吃辣")),
        ("我的狗叫旺财。", ("name", "pet_name", "旺财")),
    ],
)
def test_digit_free_patterns_copy_the_value_verbatim(text, expected):
    assert expected in found(text)


@pytest.mark.parametrize(
    "text",
    [
        "I'm looking for my order.",
        "I'd like to cancel it.",
        "I'm sorry, I like it.",
        "My dog is sick.",
        "I love to travel",
        "The courier can call me on 0176 5550 1234.",
    ],
)
def test_requests_and_pronouns_are_not_taken_for_names_or_preferences(text):
    assert not {item for item in found(text) if item[1] in ("name", "pet_name", "likes")}


def test_rule_facts_of_user_lines_and_tool_calls_but_nothing_from_assistant_prose_or_tool_results():
    items = found(
        "Order #W2378156 please, my email is mia@example.com",
        {"role": "assistant", "content": "Maybe order #Z9999999 instead? I love this one."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "get_user", "arguments": '{"user_id": "mia_li_3668"}'},
                }
            ],
        },
        {"role": "tool", "content": "user mia_li_3668 has order #Q1234567"},
    )
    assert items == {
        ("id", "order_id", "#W2378156"),
        ("email", "email", "mia@example.com"),
        ("id", "user_id", "mia_li_3668"),
    }


def test_a_new_value_supersedes_the_existing_fact_of_a_single_valued_slot_only():
    existing = [
        KeyFact(id=7, kind="address", key="home_address", value="12 Elm Road", text="", source_message_id=1),
        KeyFact(id=8, kind="preference", key="allergy", value="peanuts", text="", source_message_id=1),
        KeyFact(id=9, kind="id", key="order_id", value="#W1111111", text="", source_message_id=1),
    ]
    items = extract(
        "we moved; the new address is 48 Birch Lane. I'm allergic to penicillin. Order #W2222222.", facts=existing
    )
    by_value = {item["value"]: item for item in items}
    assert by_value["48 Birch Lane"]["key"] == "home_address", "an address takes the existing address's slot"
    assert by_value["48 Birch Lane"]["supersedes"] == [1]
    assert by_value["penicillin"]["supersedes"] == [] and by_value["#W2222222"]["supersedes"] == []
    assert by_value["48 Birch Lane"]["source"] == [1]


def test_a_line_that_corrects_a_value_supersedes_the_others_of_its_slot_whatever_the_slot():
    # A newcomer's case: both account ids stayed active and were pinned side by side.
    existing = [
        KeyFact(id=7, kind="id", key="user_id", value="ACC-7731", text="", source_message_id=1),
        KeyFact(id=9, kind="id", key="order_id", value="#W1111111", text="", source_message_id=1),
    ]
    items = extract("Actually my account is ACC-9902 now, the old one was closed.", facts=existing)
    assert [(item["key"], item["value"], item["supersedes"]) for item in items] == [("user_id", "ACC-9902", [1])]
    # Without a correction an identifier accumulates; two values of one correcting line both stay.
    assert [item["supersedes"] for item in extract("My account is ACC-9902.", facts=existing)] == [[]]
    items = extract("My order is #W2222222.", "No, instead my orders are #W3333333 and #W4444444.", facts=existing)
    assert [(item["value"], item["supersedes"]) for item in items] == [("#W3333333", [2]), ("#W4444444", [2])]


def test_f46_a_withdrawing_sentence_retracts_the_existing_fact_it_names_and_validation_accepts_it():
    existing = [
        KeyFact(id=7, kind="preference", key="allergy", value="penicillin", text="", source_message_id=1),
        KeyFact(id=8, kind="preference", key="allergy", value="shellfish", text="", source_message_id=1),
    ]
    messages = [{"id": 40, "role": "user", "content": "I'm no longer allergic to penicillin. Shellfish still is."}]
    data = ExtractionInput(messages=messages, facts=existing)
    items = parse_extraction(extraction_reply(extraction_prompt(data)))

    assert [(i["operation"], i["value"], i["supersedes"]) for i in items] == [("retract", "penicillin", [1])]
    (accepted,) = validate_extraction(items, data, extractor="llm:offline").accepted
    assert (accepted.operation, accepted.supersedes) == ("retract", (7,))


def test_f47_a_preference_turned_around_is_a_new_value_of_the_other_polarity_not_a_retraction():
    existing = [KeyFact(id=7, kind="preference", key="likes", value="jazz", text="", source_message_id=1)]
    items = extract("Funny thing, I don't like jazz anymore.", facts=existing)
    assert [(i["operation"], i["key"], i["value"], i["polarity"]) for i in items] == [
        ("add", "dislikes", "jazz", "negative")
    ]


def test_existing_facts_are_not_repeated_and_only_the_newest_value_of_a_slot_is_reported():
    existing = [KeyFact(id=7, kind="preference", key="allergy", value="penicillin", text="", source_message_id=1)]
    assert found("I'm allergic to penicillin.", facts=existing) == set()
    items = extract("My name is Mia.", "Sorry, my name is Maya actually.")
    assert [(item["value"], item["source"]) for item in items] == [("Maya", [2])]


def test_every_offline_fact_passes_code_side_validation():
    messages = [
        {"id": 1, "role": "user", "content": "我叫李明，我住在上海。My dog is called Biscuit; order #W2378156, $40."},
        {"id": 2, "role": "user", "content": "I'm allergic to penicillin, I live at 12 Elm Road."},
    ]
    data = ExtractionInput(messages=messages, facts=[])
    items = parse_extraction(extraction_reply(extraction_prompt(data)))
    result = validate_extraction(items, data, extractor="llm:offline-engine")
    assert result.rejected == []
    assert {(c.key, c.value) for c in result.accepted} == {
        ("order_id", "#W2378156"),
        ("amount", "$40"),
        ("name", "李明"),
        ("pet_name", "Biscuit"),
        ("allergy", "penicillin"),
        ("home_address", "12 Elm Road"),  # the newest value of the slot in the request
    }


def test_an_extraction_prompt_is_recognised():
    prompt = extraction_prompt(ExtractionInput(messages=[{"id": 1, "role": "user", "content": "hi"}], facts=[]))
    assert is_extraction_request(prompt)
    assert not is_extraction_request([{"role": "user", "content": "What is <new_messages>?"}][:0])
    assert not is_extraction_request([{"role": "user", "content": "hello"}])


def extraction_request() -> SummaryRequest:
    data = ExtractionInput(messages=[{"id": 1, "role": "user", "content": "I'm allergic to penicillin."}], facts=[])
    return SummaryRequest(
        previous_summary="",
        messages=data.messages,
        prompt=extraction_prompt(data),
        max_tokens=800,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": EXTRACTION_SCHEMA_NAME, "schema": EXTRACTION_SCHEMA, "strict": True},
        },
    )


async def test_the_offline_endpoint_answers_an_extraction_with_json():
    reply = await OpenAISummarizer(endpoint=summary_endpoint()).summarize(extraction_request())
    assert parse_extraction(reply.text)[0]["value"] == "penicillin"


async def test_offline_fail_summary_makes_extraction_fail_too(settings):
    settings.OFFLINE_FAIL_SUMMARY = True
    with pytest.raises(LLMError) as caught:
        await OpenAISummarizer(endpoint=summary_endpoint()).summarize(extraction_request())
    assert caught.value.kind == "server" and "OFFLINE_FAIL_SUMMARY" in str(caught.value)


async def test_the_summary_delay_applies_to_extraction(settings):
    settings.OFFLINE_SUMMARY_DELAY_SECONDS = 5.0
    settings.LLM_SUMMARY_TIMEOUT = 0.2
    with pytest.raises(LLMError) as caught:
        await OpenAISummarizer(endpoint=summary_endpoint()).summarize(extraction_request())
    assert caught.value.kind == "timeout"


def test_f49_what_the_offline_engine_reads_in_forwarded_text_is_no_fact_about_the_user():
    text = (
        "My name is Ana Kovač. My landlord forwarded this to me: ---------- Forwarded message ---------\n"
        "From: Tom Reyes <tom.reyes@lettings.example>\nSubject: Boiler\n\n"
        "Hello, my name is Tom Reyes and I live at 4 Elm Street."
    )
    data = ExtractionInput(messages=[{"id": 50, "role": "user", "content": text}], facts=[])
    accepted = validate_extraction(parse_extraction(extraction_reply(extraction_prompt(data))), data, extractor="x")
    assert {(c.key, c.value, c.provenance) for c in accepted.accepted} == {
        ("name", "Ana Kovač", "user"),
        ("email", "tom.reyes@lettings.example", "mentioned"),
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('My name is Ines Duarte. The note says "My name is Paula, feed the cat".', {"Ines Duarte"}),
        ('My cousin said "I live in Oslo and I love skiing". I live in Lyon myself.', {"Lyon"}),
        ("I love hiking. On Sat, 14 Nov 2026 at 18:02, Ben <ben@x.example> wrote: > I love opera.", {"hiking"}),
    ],
)
def test_f49_the_offline_engine_reads_no_fact_of_the_user_in_what_they_quote(text, expected):
    assert {value for _, _, value in found(text) if "@" not in value and not value[0].isdigit()} == expected
