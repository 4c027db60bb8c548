"""Fact operations in the database (docs/memory.md §11, F-46 to F-48): a withdrawal retracts, a correction or
update supersedes, a preference of the other polarity turns the old one around; the ended fact stays stored, marked
with the message that changed it, and nothing is ever deleted."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.facts.values import FactCandidate
from memory.models import KeyFact
from memory.storage.facts import key_fact_list, key_fact_list_active, key_facts_apply, key_facts_store_rule

pytestmark = pytest.mark.django_db

SCOPE = "user:1"
AT = datetime(2026, 11, 30, 9, 15, tzinfo=UTC)


def user(message_id: int, content: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "content": content, "tool_calls": None, "created_at": AT}


def store(memory_key: str, *messages: dict[str, Any]) -> None:
    key_facts_store_rule(memory_key=memory_key, scope_key=SCOPE, messages=list(messages))


def current(memory_key: str) -> set[tuple[str, str]]:
    return {(fact.key, fact.value) for fact in key_fact_list_active(memory_key=memory_key)}


def test_f48_a_self_correction_supersedes_the_value_it_corrects(memory_key):
    store(memory_key, user(1, "The courier can call me on 0176 5550 1234."))
    store(memory_key, user(3, "Sorry, typo: it's 0176 5550 1243, the last two digits were swapped."))

    assert current(memory_key) == {("phone", "0176 5550 1243")}
    old, new = key_fact_list(memory_key=memory_key)
    assert (old.status, old.superseded_by, old.changed_by_message_id) == ("superseded", new.id, 3)
    assert (new.operation, new.replaces) == ("correct", "0176 5550 1234")


def test_f48_a_correction_of_a_generic_slot_keeps_the_slot_it_corrects(memory_key):
    store(memory_key, user(1, "My order #W2378156 arrived damaged."))
    store(memory_key, user(3, "Hold on, I meant #W2378165. The other one is my sister's order."))

    assert current(memory_key) == {("order_id", "#W2378165")}


def test_f46_a_withdrawal_retracts_what_it_names_and_keeps_it_stored(memory_key):
    store(memory_key, user(1, "My office phone is 020 7946 0958 and my mobile is 07700 900123."))
    store(memory_key, user(3, "I no longer have the office line, I left that job. The mobile is the only number now."))

    assert current(memory_key) == {("phone", "07700 900123")}
    retracted = KeyFact.objects.get(memory_key=memory_key, value="020 7946 0958")
    assert (retracted.as_fact().status, retracted.changed_by_message_id) == ("retracted", 3)


def candidate(key: str, value: str, source: int, **fields: Any) -> FactCandidate:
    return FactCandidate(
        kind=fields.pop("kind", "preference"),
        key=key,
        value=value,
        text=f"{key} {value}",
        source_message_id=source,
        extractor="llm:test-model",
        **fields,
    )


def apply(memory_key: str, *candidates: FactCandidate) -> None:
    key_facts_apply(memory_key=memory_key, scope_key=SCOPE, candidates=list(candidates), valid_from={})


def test_f46_an_extracted_retract_ends_the_fact_without_a_new_value(memory_key):
    apply(memory_key, candidate("allergy", "penicillin", 1), candidate("allergy", "shellfish", 1))
    penicillin = KeyFact.objects.get(memory_key=memory_key, value="penicillin")

    apply(memory_key, candidate("allergy", "penicillin", 3, operation="retract", supersedes=(penicillin.pk,)))

    assert current(memory_key) == {("allergy", "shellfish")}
    penicillin.refresh_from_db()
    assert (penicillin.as_fact().status, penicillin.changed_by_message_id) == ("retracted", 3)
    assert KeyFact.objects.filter(memory_key=memory_key).count() == 2


def test_f47_a_preference_of_the_other_polarity_supersedes_the_old_one(memory_key):
    apply(memory_key, candidate("likes", "jazz", 1))
    apply(memory_key, candidate("dislikes", "jazz", 3, polarity="negative"))

    (fact,) = key_fact_list_active(memory_key=memory_key)
    assert (fact.key, fact.value, fact.polarity, fact.replaces) == ("dislikes", "jazz", "negative", "jazz")
    old = KeyFact.objects.get(memory_key=memory_key, key="likes")
    assert (old.as_fact().status, old.changed_by_message_id) == ("superseded", 3)


_keys = itertools.count()
_OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["add", "supersede", "correct", "retract"]),
        st.sampled_from(["likes", "dislikes", "allergy"]),
        st.sampled_from(["jazz", "tea", "penicillin"]),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=_OPERATIONS)
def test_retraction_and_supersession_never_delete_a_stored_fact(operations):
    memory_key = f"ops-property-{next(_keys)}"
    seen: dict[int, str] = {}
    for source, (operation, key, value) in enumerate(operations, 1):
        ids = tuple(KeyFact.objects.filter(memory_key=memory_key, key=key).values_list("pk", flat=True))
        polarity = "negative" if key == "dislikes" else "positive"
        apply(memory_key, candidate(key, value, source, operation=operation, supersedes=ids, polarity=polarity))
        rows = dict(KeyFact.objects.filter(memory_key=memory_key).values_list("pk", "value"))
        assert all(rows.get(fact_id) == value for fact_id, value in seen.items())
        seen = rows
        ended = KeyFact.objects.filter(memory_key=memory_key, invalidated_at__isnull=False)
        assert all(row.changed_by_message_id is not None for row in ended)
