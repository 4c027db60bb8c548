"""Key facts in the database (docs/memory.md §11): the ``KeyFact`` rows, the services that write
them (rule extraction at store time, validated extractions with supersession, the owner's pin,
hide and edit) and the chat app's hooks that store a message's facts and hand a request its
active facts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.test.utils import CaptureQueriesContext

from chatapp.chats import services as chat_services
from chatapp.chats.memory import ChatConversations, memory_engine, memory_key_of
from chatapp.conversation import leases
from chatapp.conversation.turn import Turn
from chatapp.models import Message
from memory.facts.values import FactCandidate
from memory.models import KeyFact
from memory.storage.facts import (
    KeyFactNotFound,
    key_fact_edit,
    key_fact_hide,
    key_fact_list,
    key_fact_list_active,
    key_fact_pin,
    key_facts_apply,
    key_facts_store_rule,
)
from memory.storage.summaries import session_memory_delete
from tests.chatapp.conftest import (  # the fixtures are used by name
    chat_session_make,
    db_connections_closed,  # noqa: F401
    offline_engine,  # noqa: F401
    visitor_make,
)

pytestmark = pytest.mark.django_db

SCOPE = "user:1"
AT = datetime(2026, 11, 30, 9, 15, tzinfo=UTC)
TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


def user(message_id: int, content: str, at: datetime = AT) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "content": content, "tool_calls": None, "created_at": at}


def statements(captured: CaptureQueriesContext) -> list[str]:
    """The captured SQL, transaction control (BEGIN, SAVEPOINT ...) left out."""
    return [q["sql"] for q in captured.captured_queries if not q["sql"].upper().startswith(TRANSACTION_CONTROL)]


def stored(memory_key: str, *, key: str, value: str, **fields: Any) -> KeyFact:
    defaults: dict[str, Any] = {"kind": "address", "text": f"{key} {value}", "source_message_id": 3}
    return KeyFact.objects.create(
        memory_key=memory_key, scope_key=SCOPE, key=key, value=value, **{**defaults, **fields}
    )


def candidate(key: str, value: str, *, source: int = 20, supersedes: tuple[int, ...] = (), kind: str = "address"):
    return FactCandidate(
        kind=kind,  # type: ignore[arg-type]  # a FactKind literal
        key=key,
        value=value,
        text=f"the user's {key.replace('_', ' ')} is {value}",
        source_message_id=source,
        excerpt=f"... {value} ...",
        extractor="llm:test-model",
        supersedes=supersedes,
    )


# --- rule extraction at store time -----------------------------------------------------------


def test_rule_store_creates_facts_with_their_provenance(memory_key):
    created = key_facts_store_rule(
        memory_key=memory_key,
        scope_key=SCOPE,
        messages=[user(7, "My order number is #W2378156 and my email is mia.li@example.com")],
    )

    assert [(f.kind, f.key, f.value) for f in created] == [
        ("id", "order_id", "#W2378156"),
        ("email", "email", "mia.li@example.com"),
    ]
    for fact in created:
        assert fact.id is not None
        assert fact.source_message_id == 7
        assert fact.last_seen_message_id == 7
        assert fact.valid_from == AT
        assert fact.extractor == "rule"
        assert fact.value in fact.excerpt
        assert fact.active and fact.replaces == ""
    assert set(KeyFact.objects.filter(memory_key=memory_key).values_list("scope_key", flat=True)) == {SCOPE}
    assert key_fact_list_active(memory_key=memory_key) == created


def test_rule_store_reads_tool_call_arguments_but_not_assistant_text(memory_key):
    call = {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "#W2378156"}'}}
    messages = [
        {"id": 8, "role": "assistant", "content": "Your order #W9999999 maybe?", "tool_calls": None, "created_at": AT},
        {"id": 9, "role": "assistant", "content": None, "tool_calls": [call], "created_at": AT},
        {"id": 10, "role": "tool", "content": "order #W1111111 found", "tool_calls": None, "created_at": AT},
    ]

    created = key_facts_store_rule(memory_key=memory_key, scope_key=SCOPE, messages=messages)

    assert [(f.key, f.value, f.source_message_id) for f in created] == [("order_id", "#W2378156", 9)]


def test_an_exact_restatement_only_moves_last_seen(memory_key):
    (first,) = key_facts_store_rule(memory_key=memory_key, scope_key=SCOPE, messages=[user(7, "order #W2378156")])

    # Restated in another clause (its slot would read "identifier"): the same value, no new row.
    again = key_facts_store_rule(memory_key=memory_key, scope_key=SCOPE, messages=[user(12, "Again: #W2378156 please")])

    assert again == []
    row = KeyFact.objects.get(memory_key=memory_key)
    assert (row.pk, row.key, row.source_message_id, row.last_seen_message_id) == (first.id, "order_id", 7, 12)
    # An older message never moves it back.
    key_facts_store_rule(memory_key=memory_key, scope_key=SCOPE, messages=[user(9, "#W2378156")])
    assert KeyFact.objects.get(memory_key=memory_key).last_seen_message_id == 12


def test_values_are_restated_per_chat(memory_key):
    key_facts_store_rule(memory_key=memory_key, scope_key=SCOPE, messages=[user(7, "order #W2378156")])
    other = key_facts_store_rule(memory_key="other-chat", scope_key=SCOPE, messages=[user(8, "order #W2378156")])

    assert [f.value for f in other] == ["#W2378156"]
    assert KeyFact.objects.filter(value="#W2378156").count() == 2


def test_a_value_repeated_within_one_batch_is_stored_once(memory_key):
    created = key_facts_store_rule(
        memory_key=memory_key,
        scope_key=SCOPE,
        messages=[user(7, "order #W2378156"), user(8, "yes #W2378156")],
    )

    assert [(f.value, f.source_message_id, f.last_seen_message_id) for f in created] == [("#W2378156", 7, 8)]


def test_a_message_without_candidates_makes_no_query(memory_key, django_assert_num_queries):
    with django_assert_num_queries(0):
        created = key_facts_store_rule(
            memory_key=memory_key, scope_key=SCOPE, messages=[user(7, "What is the largest file on paid plans?")]
        )
    assert created == []


def test_a_store_with_candidates_makes_at_most_three_statements(memory_key):
    key_facts_store_rule(memory_key=memory_key, scope_key=SCOPE, messages=[user(7, "order #W2378156")])
    with CaptureQueriesContext(connections[DEFAULT_DB_ALIAS]) as captured:
        key_facts_store_rule(
            memory_key=memory_key, scope_key=SCOPE, messages=[user(8, "order #W2378156, email mia.li@example.com")]
        )

    sqls = statements(captured)
    # One read of the active facts with those values, one insert, one update of last_seen.
    assert len(sqls) == 3, sqls
    assert [sql.split()[0].upper() for sql in sqls] == ["SELECT", "INSERT", "UPDATE"]


def test_one_active_row_per_chat_slot_and_value():
    stored("chat-a", key="shipping_address", value="12 Elm Road")
    stored("chat-a", key="shipping_address", value="12 Elm Road", invalidated_at=AT)  # a retired one may repeat it
    stored("chat-b", key="shipping_address", value="12 Elm Road")
    stored("chat-a", key="billing_address", value="12 Elm Road")

    with pytest.raises(IntegrityError), transaction.atomic():
        stored("chat-a", key="shipping_address", value="12 Elm Road")


def test_a_store_that_loses_a_race_for_a_value_treats_it_as_a_restatement(memory_key, monkeypatch):
    # Another writer commits the same value after this store read the active values (simulated:
    # the first read misses the row), so the insert violates the constraint and the store reads again.
    racer = stored(memory_key, key="order_id", value="#W2378156", kind="id", source_message_id=5)
    real_filter = KeyFact.objects.filter
    reads: list[dict[str, Any]] = []

    def first_read_misses_it(*args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs)
        return KeyFact.objects.none() if len(reads) == 1 else real_filter(*args, **kwargs)

    monkeypatch.setattr(KeyFact.objects, "filter", first_read_misses_it)

    created = key_facts_store_rule(
        memory_key=memory_key, scope_key=SCOPE, messages=[user(7, "order #W2378156, email mia.li@example.com")]
    )

    assert len(reads) >= 2  # read again after the lost race
    assert [f.value for f in created] == ["mia.li@example.com"]
    rows = real_filter(memory_key=memory_key, value="#W2378156")
    assert [(row.pk, row.last_seen_message_id) for row in rows] == [(racer.pk, 7)]


# --- validated extractions and supersession (F-28) -------------------------------------------


def test_apply_stores_candidates_and_supersedes_within_the_slot(memory_key):
    old = stored(memory_key, key="shipping_address", value="12 Elm Road")
    order = stored(memory_key, key="order_id", value="#W2378156", kind="id")

    (new,) = key_facts_apply(
        memory_key=memory_key,
        scope_key=SCOPE,
        candidates=[candidate("shipping_address", "48 Birch Lane", supersedes=(old.pk,))],
        valid_from={20: AT},
    )

    assert (new.value, new.extractor, new.valid_from, new.replaces) == (
        "48 Birch Lane",
        "llm:test-model",
        AT,
        "12 Elm Road",
    )
    old.refresh_from_db()
    assert old.invalidated_at is not None and old.superseded_by_id == new.id  # kept, retired
    order.refresh_from_db()
    assert order.invalidated_at is None and order.superseded_by_id is None  # an unrelated slot is untouched
    active = key_fact_list_active(memory_key=memory_key)
    assert {f.value: f.replaces for f in active} == {"#W2378156": "", "48 Birch Lane": "12 Elm Road"}
    everything = {f.id: f for f in key_fact_list(memory_key=memory_key)}
    assert everything[old.pk].superseded_by == new.id and not everything[old.pk].active


def test_apply_never_supersedes_another_slot_a_pinned_fact_or_another_chats_fact(memory_key):
    billing = stored(memory_key, key="billing_address", value="1 Oak Street")
    pinned = stored(memory_key, key="shipping_address", value="12 Elm Road", pinned_by_user=True)
    elsewhere = stored("another-chat", key="shipping_address", value="7 Pine Road")

    (new,) = key_facts_apply(
        memory_key=memory_key,
        scope_key=SCOPE,
        candidates=[
            candidate("shipping_address", "48 Birch Lane", supersedes=(billing.pk, pinned.pk, elsewhere.pk, 10**12))
        ],
        valid_from={},
    )

    assert new.replaces == "" and new.valid_from is None
    for row in (billing, pinned, elsewhere):
        row.refresh_from_db()
        assert row.invalidated_at is None and row.superseded_by_id is None
    assert {f.value for f in key_fact_list_active(memory_key=memory_key)} == {
        "1 Oak Street",
        "12 Elm Road",
        "48 Birch Lane",
    }


def test_apply_skips_a_slot_and_value_already_active(memory_key):
    stored(memory_key, key="shipping_address", value="12 Elm Road")

    created = key_facts_apply(
        memory_key=memory_key,
        scope_key=SCOPE,
        candidates=[
            candidate("shipping_address", "12 Elm Road"),
            candidate("allergy", "penicillin", kind="preference"),
        ],
        valid_from={20: AT},
    )

    assert [f.value for f in created] == ["penicillin"]
    assert KeyFact.objects.filter(memory_key=memory_key).count() == 2


def test_apply_writes_nothing_once_the_chat_is_gone(memory_key):
    created = key_facts_apply(
        memory_key=memory_key,
        scope_key=SCOPE,
        candidates=[candidate("allergy", "penicillin")],
        valid_from={},
        alive=lambda key: False,
    )

    assert created == []
    assert not KeyFact.objects.filter(memory_key=memory_key).exists()


def test_listing_facts_with_what_they_replaced_is_one_query(memory_key, django_assert_num_queries):
    for slot in ("shipping_address", "billing_address", "phone"):
        old = stored(memory_key, key=slot, value=f"old {slot}")
        key_facts_apply(
            memory_key=memory_key,
            scope_key=SCOPE,
            candidates=[candidate(slot, f"new {slot}", supersedes=(old.pk,))],
            valid_from={},
        )

    with django_assert_num_queries(1):
        active = key_fact_list_active(memory_key=memory_key)
    with django_assert_num_queries(1):
        everything = key_fact_list(memory_key=memory_key)

    assert {f.value: f.replaces for f in active} == {
        f"new {s}": f"old {s}" for s in ("shipping_address", "billing_address", "phone")
    }
    assert len(everything) == 6


# --- the owner's controls ---------------------------------------------------------------------


def test_pin_and_hide_set_the_owners_choices(memory_key):
    fact = stored(memory_key, key="shipping_address", value="12 Elm Road")

    assert key_fact_pin(memory_key=memory_key, fact_id=fact.pk, pinned=True).pinned_by_user
    hidden = key_fact_hide(memory_key=memory_key, fact_id=fact.pk, hidden=True)
    assert hidden.hidden_by_user and not hidden.active
    assert key_fact_list_active(memory_key=memory_key) == []
    assert [f.id for f in key_fact_list(memory_key=memory_key)] == [fact.pk]

    restored = key_fact_hide(memory_key=memory_key, fact_id=fact.pk, hidden=False)
    assert restored.active and restored.pinned_by_user
    assert not key_fact_pin(memory_key=memory_key, fact_id=fact.pk, pinned=False).pinned_by_user
    assert [f.id for f in key_fact_list_active(memory_key=memory_key)] == [fact.pk]


def test_edit_creates_a_user_fact_superseding_the_edited_one(memory_key):
    old = stored(
        memory_key, key="shipping_address", value="12 Elm Road", text="ships to 12 Elm Road", pinned_by_user=True
    )

    new = key_fact_edit(memory_key=memory_key, fact_id=old.pk, value="  48   Birch Lane ")

    assert new.id != old.pk
    assert (new.kind, new.key, new.value, new.extractor) == ("address", "shipping_address", "48 Birch Lane", "user")
    assert (new.source_message_id, new.text, new.replaces) == (3, "ships to 48 Birch Lane", "12 Elm Road")
    assert new.pinned_by_user and new.active and new.valid_from is not None
    old.refresh_from_db()
    assert old.invalidated_at is not None and old.superseded_by_id == new.id  # even though pinned: the user's own edit
    assert [f.id for f in key_fact_list_active(memory_key=memory_key)] == [new.id]
    with pytest.raises(ValueError, match="superseded"):
        key_fact_edit(memory_key=memory_key, fact_id=old.pk, value="1 Oak Street")


def test_a_late_extraction_never_revives_a_value_the_user_corrected(memory_key):
    # Found by a newcomer: the rule stored ACC-7731 from message 3, the user corrected it to
    # ACC-8888, and the batched LLM extraction of message 3 ran afterwards.
    old = stored(memory_key, key="user_id", value="ACC-7731", kind="id")
    key_fact_edit(memory_key=memory_key, fact_id=old.pk, value="ACC-8888")

    late = key_facts_apply(
        memory_key=memory_key,
        scope_key=SCOPE,
        candidates=[candidate("user_id", "ACC-7731", source=3, kind="id")],
        valid_from={3: AT},
    )
    assert late == []
    assert [f.value for f in key_fact_list_active(memory_key=memory_key)] == ["ACC-8888"]

    # Stated again in a newer message, the old value is a fact again.
    (again,) = key_facts_apply(
        memory_key=memory_key,
        scope_key=SCOPE,
        candidates=[candidate("user_id", "ACC-7731", source=30, kind="id")],
        valid_from={30: AT},
    )
    assert again.value == "ACC-7731" and again.source_message_id == 30


def test_an_edit_to_the_same_value_changes_nothing(memory_key):
    fact = stored(memory_key, key="shipping_address", value="12 Elm Road")

    assert key_fact_edit(memory_key=memory_key, fact_id=fact.pk, value="12 Elm Road").id == fact.pk
    assert KeyFact.objects.filter(memory_key=memory_key).count() == 1


@pytest.mark.parametrize("value", ["", "   ", "x" * 201])
def test_an_edit_needs_a_value_of_at_most_200_characters(memory_key, value):
    fact = stored(memory_key, key="shipping_address", value="12 Elm Road")

    with pytest.raises(ValueError, match="value"):
        key_fact_edit(memory_key=memory_key, fact_id=fact.pk, value=value)
    assert KeyFact.objects.filter(memory_key=memory_key).count() == 1


def test_the_controls_find_no_fact_of_another_chat_nor_an_unknown_id(memory_key):
    elsewhere = stored("another-chat", key="shipping_address", value="7 Pine Road")

    for fact_id in (elsewhere.pk, elsewhere.pk + 1000, 0, 2**64):
        with pytest.raises(KeyFactNotFound):
            key_fact_pin(memory_key=memory_key, fact_id=fact_id, pinned=True)
        with pytest.raises(KeyFactNotFound):
            key_fact_hide(memory_key=memory_key, fact_id=fact_id, hidden=True)
        with pytest.raises(KeyFactNotFound):
            key_fact_edit(memory_key=memory_key, fact_id=fact_id, value="1 Oak Street")
    elsewhere.refresh_from_db()
    assert (elsewhere.pinned_by_user, elsewhere.hidden_by_user, elsewhere.invalidated_at) == (False, False, None)


# --- deletion ---------------------------------------------------------------------------------


def test_deleting_a_chats_memory_deletes_its_facts_superseded_ones_included(memory_key):
    old = stored(memory_key, key="shipping_address", value="12 Elm Road")
    key_fact_edit(memory_key=memory_key, fact_id=old.pk, value="48 Birch Lane")
    kept = stored("another-chat", key="shipping_address", value="7 Pine Road")

    session_memory_delete(memory_key=memory_key)

    assert not KeyFact.objects.filter(memory_key=memory_key).exists()
    assert list(KeyFact.objects.values_list("pk", flat=True)) == [kept.pk]


def test_deleting_a_chat_deletes_its_facts():
    owner = visitor_make().owner
    session = chat_session_make(owner)
    leases.user_message_submit(session=session, client_message_id="m1", text="My order is #W2378156")
    memory_key = memory_key_of(session.pk)
    assert KeyFact.objects.filter(memory_key=memory_key).exists()

    chat_services.chat_session_delete(session=session)

    assert not KeyFact.objects.filter(memory_key=memory_key).exists()


# --- the chat app's hooks ---------------------------------------------------------------------


@pytest.mark.parametrize("anonymous", [False, True], ids=["user", "anonymous"])
def test_a_user_message_stored_through_the_chat_path_stores_its_facts(anonymous):
    owner = visitor_make(anonymous=anonymous).owner
    session = chat_session_make(owner)

    message, created = leases.user_message_submit(
        session=session, client_message_id="m1", text="Where is my order #W2378156? Card ending in 4421."
    )

    assert created
    rows = KeyFact.objects.filter(memory_key=memory_key_of(session.pk))
    assert [(row.key, row.value) for row in rows] == [("order_id", "#W2378156"), ("payment_card", "4421")]
    scope = f"user:{owner.user_id}" if not anonymous else f"anon:{owner.session_key}"
    for row in rows:
        assert (row.source_message_id, row.valid_from, row.extractor, row.scope_key) == (
            message.pk,
            message.created,
            "rule",
            scope,
        )
    # A resend of the same message stores nothing more.
    assert leases.user_message_submit(session=session, client_message_id="m1", text=message.content or "")[1] is False
    assert rows.count() == 2


def test_a_user_message_without_identifiers_makes_no_fact_query():
    session = chat_session_make(visitor_make().owner, title="named")
    leases.user_message_submit(session=session, client_message_id="m0", text="Hello")

    with CaptureQueriesContext(connections[DEFAULT_DB_ALIAS]) as plain:
        leases.user_message_submit(
            session=session, client_message_id="m1", text="What is the largest file on paid plans?"
        )
    with CaptureQueriesContext(connections[DEFAULT_DB_ALIAS]) as with_facts:
        leases.user_message_submit(session=session, client_message_id="m2", text="My order is #W2378156")

    assert not [sql for sql in statements(plain) if KeyFact._meta.db_table in sql]
    fact_sqls = [sql for sql in statements(with_facts) if KeyFact._meta.db_table in sql]
    assert len(fact_sqls) == 2  # the read of the active values and the insert
    assert len(statements(with_facts)) == len(statements(plain)) + 2


def test_an_assistant_tool_call_stores_its_arguments_facts_but_an_app_note_does_not():
    session = chat_session_make(visitor_make().owner)
    question, _ = leases.user_message_submit(session=session, client_message_id="m1", text="Find my order please")
    call = {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "#W2378156"}'}}

    reply = chat_services.reply_message_store(
        session_id=session.pk, reply_to_id=question.pk, role="assistant", content=None, tool_calls=[call]
    )
    chat_services.reply_message_store(
        session_id=session.pk,
        reply_to_id=question.pk,
        role="assistant",
        content=None,
        tool_calls=[{**call, "function": {"name": "get_order", "arguments": '{"order_id": "#W5555555"}'}}],
        origin=Message.Origin.APP,
    )

    rows = KeyFact.objects.filter(memory_key=memory_key_of(session.pk))
    assert [(row.key, row.value, row.source_message_id, row.scope_key) for row in rows] == [
        ("order_id", "#W2378156", reply.pk, f"user:{session.owner_id}")
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("offline_engine", "db_connections_closed")
async def test_every_request_the_chat_app_builds_loads_the_active_facts(settings):
    settings.MEMORY_COMPRESSION = "background"  # so that the memory job plans a request
    session = await sync_to_async(chat_session_make)(await sync_to_async(lambda: visitor_make().owner)())
    message, _ = await sync_to_async(leases.user_message_submit)(
        session=session, client_message_id="m1", text="My order is #W2378156"
    )
    memory_key = memory_key_of(session.pk)
    expected = await sync_to_async(key_fact_list_active)(memory_key=memory_key)
    assert [f.value for f in expected] == ["#W2378156"]

    engine = memory_engine()
    turn = Turn(
        session_id=session.pk, user_message_id=message.pk, mode="agent", engine=engine, question="", scope_key="x"
    )
    ctx = await engine.context(await turn.context_request(system_prompt="You help."))
    assert ctx.facts["in_window"] == [fact.id for fact in expected]

    planned = await ChatConversations().next_request(memory_key)
    assert planned is not None
    ctx = await engine.context(planned.request)
    assert ctx.facts["in_window"] == [fact.id for fact in expected]


def test_the_active_list_written_in_sql_matches_the_orm_query_field_for_field(memory_key):
    """key_fact_list_active reads in hand-written SQL (it runs on every request); it returns the
    same facts, fields and ``replaces`` as the ORM query it replaced, on either database."""
    from memory.storage.facts import _facts_with_replaces

    first = stored(memory_key, key="shipping_address", value="12 Elm Road", valid_from=AT)
    second = stored(memory_key, key="shipping_address", value="3 Ash Way")
    current = stored(memory_key, key="shipping_address", value="48 Birch Lane", pinned_by_user=True)
    KeyFact.objects.filter(pk__in=[first.pk, second.pk]).update(invalidated_at=AT, superseded_by=current)
    stored(memory_key, key="email", value="ada@example.com", kind="email", hidden_by_user=True)
    stored(memory_key, key="order_id", value="#W2378156", kind="id", last_seen_message_id=9)
    stored("another-chat", key="order_id", value="#W1")

    rows = KeyFact.objects.filter(memory_key=memory_key, invalidated_at__isnull=True, hidden_by_user=False)
    expected = [row.as_fact() for row in _facts_with_replaces(rows)]
    active = key_fact_list_active(memory_key=memory_key)
    assert active == expected
    assert [(f.value, f.replaces) for f in active] == [("48 Birch Lane", "3 Ash Way"), ("#W2378156", "")]
    assert key_fact_list_active(memory_key="no-such-chat") == []
