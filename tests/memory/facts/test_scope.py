"""Owner-wide key facts in the pure core (docs/memory.md §11 "Owner-wide", F-54): personal slots are shared by the
owner's chats and the newest change of a slot wins; everything else stays with its chat; changes within one chat
stay as stored; the block says which facts come from another chat."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from memory.facts.block import facts_block
from memory.facts.scope import PERSONAL_SLOTS, SINGLE_VALUED_SLOTS, owner_view
from memory.facts.values import KeyFact
from tests.memory.builders import COUNTER

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
_ids = itertools.count(1)


def fact(key: str, value: str, *, day: int, chat: str = "", kind: str = "address", **fields: Any) -> KeyFact:
    """A fact stated on day ``day`` in ``chat`` (empty: the requesting chat)."""
    fact_id = next(_ids)
    values: dict[str, Any] = {
        "text": f"{key} {value}",
        "source_message_id": fact_id,
        "valid_from": T0 + timedelta(days=day),
        **fields,
    }
    return KeyFact(id=fact_id, kind=kind, key=key, value=value, chat=chat, **values)


def ended(old: KeyFact, *, day: int, by: KeyFact | None = None) -> KeyFact:
    """``old`` withdrawn (no ``by``) or replaced by ``by`` on day ``day``."""
    return KeyFact(
        **{
            **old.__dict__,
            "invalidated_at": T0 + timedelta(days=day),
            "superseded_by": by.id if by is not None else None,
            "changed_by_message_id": by.source_message_id if by is not None else 999,
        }
    )


def shown(facts: list[KeyFact]) -> set[tuple[str, str, str]]:
    return {(f.key, f.value, f.chat) for f in facts}


def test_the_personal_slots_are_data_and_name_the_slots_the_extractors_produce():
    assert {"email", "phone", "zip_code"} <= set(PERSONAL_SLOTS)  # rule extraction's
    assert {"name", "home_address", "address", "shipping_address", "allergy", "likes", "dislikes", "pet_name"} <= set(
        PERSONAL_SLOTS
    )
    assert not {"order_id", "reservation_id", "ticket_id", "amount", "date", "identifier"} & set(PERSONAL_SLOTS)
    assert set(PERSONAL_SLOTS.values()) >= SINGLE_VALUED_SLOTS


def test_f54_an_address_changed_in_another_chat_replaces_this_chats_older_one():
    old = fact("home_address", "12 Rue Verte", day=0)
    new = fact("address", "48 Harbour Road", day=10, chat="b")

    view = owner_view([old, new])

    assert shown(view) == {("address", "48 Harbour Road", "b")}
    assert view[0].replaces == "12 Rue Verte"  # the block says which value is current
    # A new chat with no fact of its own sees the same.
    assert shown(owner_view([KeyFact(**{**old.__dict__, "chat": "a"}), new])) == {("address", "48 Harbour Road", "b")}


def test_f54_a_change_older_than_this_chats_value_changes_nothing():
    older = fact("address", "48 Harbour Road", day=0, chat="b")
    mine = fact("home_address", "12 Rue Verte", day=10)

    assert shown(owner_view([mine, older])) == {("home_address", "12 Rue Verte", "")}


def test_f54_a_value_withdrawn_in_another_chat_is_no_longer_current():
    allergy = fact("allergy", "shellfish", day=0, kind="preference")
    other = fact("allergy", "penicillin", day=0, kind="preference")
    withdrawn_there = ended(
        fact("allergy", "shellfish", day=10, chat="b", kind="preference", operation="retract"), day=10
    )

    assert shown(owner_view([allergy, other, withdrawn_there])) == {("allergy", "penicillin", "")}


def test_f54_a_withdrawal_before_this_chat_stated_the_value_again_changes_nothing():
    withdrawn_there = ended(fact("allergy", "shellfish", day=0, chat="b", kind="preference"), day=1)
    again = fact("allergy", "shellfish", day=5, kind="preference")

    assert shown(owner_view([again, withdrawn_there])) == {("allergy", "shellfish", "")}


def test_f54_an_update_replaces_the_newest_earlier_value_of_a_slot_holding_several():
    mobile = fact("phone", "07700 900555", day=0, kind="phone")
    office = fact("phone", "020 7946 0958", day=1, kind="phone", chat="c")
    update = fact("phone", "07700 900888", day=10, kind="phone", chat="b", operation="supersede")
    plain = fact("email", "new@example.com", day=10, kind="email", chat="b")
    email = fact("email", "old@example.com", day=0, kind="email")

    view = owner_view([mobile, office, update, plain, email])

    # The office number was the newest before the update; a new email adds to the slot.
    assert shown(view) == {
        ("phone", "07700 900555", ""),
        ("phone", "07700 900888", "b"),
        ("email", "old@example.com", ""),
        ("email", "new@example.com", "b"),
    }


def test_f54_a_preference_turned_around_in_another_chat_ends_the_old_polarity():
    likes = fact("likes", "horror films", day=0, kind="preference")
    dislikes = fact("dislikes", "horror films", day=10, kind="preference", chat="b", polarity="negative")

    view = owner_view([likes, dislikes])

    assert [(f.key, f.polarity, f.chat) for f in view] == [("dislikes", "negative", "b")]


def test_f54_chat_specific_and_merely_mentioned_facts_stay_with_their_chat():
    order = fact("order_id", "#W6601245", day=0, kind="id", chat="a")
    mentioned = fact("name", "Tom Reyes", day=5, kind="name", chat="a", provenance="mentioned")
    mine = fact("name", "Jo Lindqvist", day=0, kind="name")
    own_order = fact("order_id", "#W1111111", day=0, kind="id")

    assert shown(owner_view([order, mentioned, mine, own_order])) == {
        ("name", "Jo Lindqvist", ""),
        ("order_id", "#W1111111", ""),
    }


def test_f54_changes_within_one_chat_stay_as_stored():
    # Two addresses this chat holds (as its extraction decided) are not replayed against each other.
    first = fact("home_address", "1 Lake Road", day=0)
    second = fact("home_address", "2 Hill Road", day=1)
    # Nor is another chat's value ended by that chat's own later statement of a multi-valued slot.
    email = fact("email", "a@example.com", day=0, kind="email", chat="b")
    later = fact("email", "b@example.com", day=1, kind="email", chat="b", operation="supersede")

    assert shown(owner_view([first, second, email, later])) == {
        ("home_address", "1 Lake Road", ""),
        ("home_address", "2 Hill Road", ""),
        ("email", "a@example.com", "b"),
        ("email", "b@example.com", "b"),
    }


def test_f54_a_value_held_in_several_chats_is_shown_once():
    mine = fact("allergy", "latex", day=0, kind="preference")
    theirs = fact("allergy", "Latex", day=5, kind="preference", chat="b")
    twice = [
        fact("pet_name", "Mabel", day=1, kind="name", chat="b"),
        fact("pet_name", "Mabel", day=3, kind="name", chat="c"),
    ]

    view = owner_view([mine, theirs, *twice])

    assert shown(view) == {("allergy", "latex", ""), ("pet_name", "Mabel", "c")}


def test_f54_a_value_pinned_in_this_chat_keeps_its_slot():
    pinned = fact("name", "Dana Whitfield", day=0, kind="name", pinned_by_user=True)
    newer = fact("name", "Dana Okoye", day=10, kind="name", chat="b")

    assert shown(owner_view([pinned, newer])) == {("name", "Dana Whitfield", "")}
    # Elsewhere the newer value wins.
    assert shown(owner_view([KeyFact(**{**pinned.__dict__, "chat": "a"}), newer])) == {("name", "Dana Okoye", "b")}


def test_f54_hidden_facts_neither_show_nor_change_anything():
    mine = fact("name", "Ana", day=0, kind="name")
    hidden = fact("name", "Anna", day=5, kind="name", chat="b", hidden_by_user=True)

    assert shown(owner_view([mine, hidden])) == {("name", "Ana", "")}


def test_f54_another_chats_facts_are_in_the_block_and_say_where_they_come_from():
    mine = fact("order_id", "#W2378156", day=0, kind="id", source_message_id=40)
    theirs = fact("phone", "07700 900888", day=1, kind="phone", chat="b")

    block = facts_block(owner_view([mine, theirs]), boundary=None, max_tokens=400, counter=COUNTER)

    # This chat's fact is still in the window; the other chat's is not, so it is pinned.
    assert [f.id for f in block.in_window] == [mine.id]
    assert [f.id for f in block.pinned] == [theirs.id]
    assert block.message is not None
    assert f"- phone: 07700 900888 (msg {theirs.source_message_id}, from another chat)" in block.message["content"]
    assert block.as_dict()["entries"][0]["note"] == "from another chat"
