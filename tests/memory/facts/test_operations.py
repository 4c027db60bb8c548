"""Fact operations in the pure core (docs/memory.md §11, F-46 to F-48): a value's operation comes from its
sentence's cues; a withdrawal names facts by value or slot word; a correction replaces its slot's newest value; a
preference of the other polarity on the same topic turns the old one around."""

from __future__ import annotations

import pytest

from memory.facts.operations import corrected, polarity_of, same_topic, turns_around, withdrawn
from memory.facts.rules import message_rule_facts
from memory.facts.values import FactCandidate, KeyFact


def fact(fact_id: int, key: str, value: str, *, kind: str = "id", excerpt: str = "", source: int = 1, **kw) -> KeyFact:
    return KeyFact(
        id=fact_id, kind=kind, key=key, value=value, text=value, source_message_id=source, excerpt=excerpt, **kw
    )


def operations(text: str) -> list[tuple[str, str, str]]:
    return [(c.key, c.value, c.operation) for c in message_rule_facts({"id": 9, "role": "user", "content": text})]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Sorry, typo: it's 0176 5550 1243, the digits were swapped.", ("phone", "0176 5550 1243", "correct")),
        ("Hold on, I meant #W2378165. The other one is my sister's.", ("identifier", "#W2378165", "correct")),
        ("打错了，是13800138008。", ("phone", "13800138008", "correct")),
        ("Korrektur: die Kundennummer ist KD-55109.", ("identifier", "KD-55109", "correct")),
        ("My email address is now b.devries@kitemail.example.", ("email", "b.devries@kitemail.example", "supersede")),
        ("I no longer use carl.berg@brightwave.example.", ("email", "carl.berg@brightwave.example", "retract")),
        ("My order #W2378156 arrived damaged.", ("order_id", "#W2378156", "add")),
    ],
)
def test_f46_f48_the_rule_path_reads_a_values_operation_from_its_sentence(text, expected):
    assert operations(text) == [expected]


def test_a_doubt_changes_nothing():
    assert operations("Maybe I meant #W2378165, not sure.") == [("identifier", "#W2378165", "add")]


def test_f46_a_withdrawal_names_facts_by_value_or_by_the_words_of_their_slot():
    facts = [
        fact(1, "email", "carl.berg@brightwave.example", kind="email", excerpt="My work email is carl.berg@brightwave.example and my personal one is carlberg@mailbox.example."),
        fact(2, "email", "carlberg@mailbox.example", kind="email", excerpt="My work email is carl.berg@brightwave.example and my personal one is carlberg@mailbox.example."),
        fact(3, "identifier", "GM-48213", excerpt="My gym membership number is GM-48213 and you can text me on 07700 900417."),
        fact(4, "phone", "07700 900417", kind="phone", excerpt="My gym membership number is GM-48213 and you can text me on 07700 900417."),
    ]  # fmt: skip

    assert [f.id for f in withdrawn("Please forget my old work email, that inbox is gone.", facts)] == [1]
    assert [f.id for f in withdrawn("I cancelled the gym, that membership number isn't valid any more.", facts)] == [3]
    assert [f.id for f in withdrawn("I don't use 07700 900417 any more.", facts)] == [4]
    assert withdrawn("My work email is busy today.", facts) == []


def test_a_withdrawal_never_ends_a_fact_the_user_pinned():
    pinned = fact(1, "identifier", "GM-48213", excerpt="my gym number is GM-48213", pinned_by_user=True)
    assert withdrawn("I quit the gym, forget my old gym number.", [pinned]) == []


def test_f48_a_correction_replaces_the_newest_value_of_its_slot_or_of_its_kind_for_a_generic_slot():
    facts = [fact(1, "order_id", "#W1111111", source=1), fact(2, "order_id", "#W2378156", source=3)]
    generic = FactCandidate(kind="id", key="identifier", value="#W2378165", text="", source_message_id=5)
    assert corrected(generic, facts) == facts[1]
    dated = [fact(5, "date", "3 December", kind="date", source=2), fact(6, "time", "11:00", kind="date", source=2)]
    new_day = FactCandidate(kind="date", key="date", value="5 December", text="", source_message_id=7)
    assert corrected(new_day, dated) == dated[0]


def test_f47_a_preference_of_the_other_polarity_on_the_same_topic_turns_the_old_one_around():
    liked = fact(1, "likes", "running along the river", kind="preference")
    disliked = FactCandidate(
        kind="preference", key="dislikes", value="running", text="", source_message_id=5, polarity="negative"
    )
    assert polarity_of("dislikes") == "negative" and polarity_of("likes") == "positive"
    assert turns_around(disliked, liked)
    assert not turns_around(disliked, fact(2, "likes", "runningshoes", kind="preference"))
    assert same_topic("Jazz", "jazz") and not same_topic("tea", "teams")


def test_f46_a_slot_word_every_value_of_the_slot_shares_withdraws_none_of_them():
    said = "I'm allergic to penicillin, and I'm also allergic to shellfish."
    facts = [fact(1, "allergy", "penicillin", excerpt=said), fact(2, "allergy", "shellfish", excerpt=said)]
    assert [f.id for f in withdrawn("I'm no longer allergic to penicillin, the test was clear.", facts)] == [1]
