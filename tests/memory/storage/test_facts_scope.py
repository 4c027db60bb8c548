"""Key facts across the owner's chats (docs/memory.md §11 "Owner-wide", F-54): a request loads its chat's facts and
the owner's personal facts of other chats in one query, where the newest change of a personal slot wins; chat-specific
slots stay with their chat; another owner's facts never appear; ``MEMORY_FACTS_SCOPE=chat`` keeps each chat's own."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.test.utils import CaptureQueriesContext

from chatapp.chats.memory import ChatConversations, chat_session_scope_key, memory_config, memory_engine, memory_key_of
from chatapp.conversation import leases
from chatapp.conversation.turn import Turn
from chatapp.models import ChatSession, Message
from memory.context.builder import ContextBuilder
from memory.context.request import ContextRequest, MemoryContext
from memory.facts.values import FactCandidate
from memory.facts.values import KeyFact as Fact
from memory.models import KeyFact
from memory.storage.facts import (
    _OWNER_FACTS_SQL,
    _PERSONAL_KEYS,
    OrmFactStore,
    key_fact_list_active,
    key_fact_list_for_owner,
    key_facts_apply,
    key_facts_store_rule,
)
from memory.summary.store import InMemorySummaryStore
from tests.chatapp.conftest import chat_session_make, offline_engine, visitor_make  # noqa: F401  (a fixture)
from tests.memory.conftest import make_engine

pytestmark = pytest.mark.django_db

OWNER = "user:1"
STRANGER = "user:2"
T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
_message_ids = itertools.count(1000)


def day(n: int) -> datetime:
    return T0 + timedelta(days=n)


def said(memory_key: str, key: str, value: str, *, on: int, scope: str = OWNER, kind: str = "address") -> int:
    """``value`` of slot ``key`` stated in chat ``memory_key`` on day ``on``, as LLM extraction stores it; returns the
    message id."""
    message_id = next(_message_ids)
    candidate = FactCandidate(
        kind=kind,  # type: ignore[arg-type]  # a FactKind literal
        key=key,
        value=value,
        text=f"the user's {key.replace('_', ' ')} is {value}",
        source_message_id=message_id,
        excerpt=f"... {value} ...",
        extractor="llm:test-model",
    )
    assert key_facts_apply(
        memory_key=memory_key, scope_key=scope, candidates=[candidate], valid_from={message_id: day(on)}
    )
    return message_id


def typed(memory_key: str, text: str, *, on: int, scope: str = OWNER, owner_wide: bool = True) -> int:
    """A user message stored in chat ``memory_key`` on day ``on``, its rule facts with it; returns its id."""
    message_id = next(_message_ids)
    message = {"id": message_id, "role": "user", "content": text, "tool_calls": None, "created_at": day(on)}
    key_facts_store_rule(memory_key=memory_key, scope_key=scope, messages=[message], owner_wide=owner_wide)
    return message_id


def loaded(memory_key: str, scope: str = OWNER) -> set[tuple[str, str]]:
    return {(fact.key, fact.value) for fact in key_fact_list_for_owner(memory_key=memory_key, scope_key=scope)}


def context(memory_key: str, *, scope: str = OWNER, facts_scope: str = "owner") -> MemoryContext:
    """A request of chat ``memory_key`` whose every stored message is folded into the summary, built through the
    builder's fact store, as the engine builds it."""
    engine: ContextBuilder = make_engine(store=InMemorySummaryStore())
    engine.facts = OrmFactStore()
    engine.facts_scope = facts_scope  # type: ignore[assignment]  # a FactsScope literal

    async def load_increment(boundary: int | None) -> list[dict[str, Any]]:
        return [{"id": 10**6, "role": "user", "content": "Hello, a different topic today."}]

    request = ContextRequest(
        memory_key=memory_key, system_prompt="You help.", load_increment=load_increment, mode="agent", scope_key=scope
    )
    return async_to_sync(engine.build_context)(request)


def block(ctx: MemoryContext) -> str:
    blocks = [m["content"] for m, s in zip(ctx.messages, ctx.sources, strict=True) if s["kind"] == "facts"]
    return blocks[0] if blocks else ""


def current(ctx: MemoryContext) -> set[tuple[str, str]]:
    return {(entry["key"], entry["value"]) for entry in ctx.facts["entries"]}


# --- the F-54 inputs --------------------------------------------------------------------------


def test_f54_an_address_changed_in_another_chat_is_the_current_one_in_the_first_and_in_a_new_chat():
    said("chat-a", "home_address", "12 Rue Verte", on=0)
    said("chat-b", "address", "48 Harbour Road", on=10)
    before = KeyFact.objects.get(memory_key="chat-a")

    for chat in ("chat-a", "chat-c"):
        assert loaded(chat) == {("address", "48 Harbour Road")}
        ctx = context(chat)
        assert current(ctx) == {("address", "48 Harbour Road")}
        assert "12 Rue Verte" not in block(ctx).replace("replaces 12 Rue Verte", "")
        assert "- address: 48 Harbour Road (msg " in block(ctx) and "from another chat" in block(ctx)
        (note,) = [entry["note"] for entry in ctx.facts["entries"]]
        assert note.endswith("from another chat")
    # Chat A's row is still stored, untouched; chat A's own list still has it.
    after = KeyFact.objects.get(memory_key="chat-a")
    assert (after.value, after.invalidated_at, after.updated_at) == ("12 Rue Verte", None, before.updated_at)
    assert [fact.value for fact in key_fact_list_active(memory_key="chat-a")] == ["12 Rue Verte"]


def test_f54_the_block_says_which_value_replaced_this_chats_own():
    said("chat-a", "home_address", "12 Rue Verte", on=0)
    said("chat-b", "address", "48 Harbour Road", on=10)

    assert "- address: 48 Harbour Road (msg" in block(context("chat-a"))
    assert "from another chat, current; replaces 12 Rue Verte)" in block(context("chat-a"))


def test_f54_a_retraction_in_another_chat_ends_the_fact_there_and_keeps_this_chats_row():
    said("chat-a", "allergy", "shellfish", on=0, kind="preference")
    said("chat-a", "name", "Carmen Ruiz", on=0, kind="name")
    withdrawal = typed("chat-b", "Update from the allergist: I'm no longer allergic to shellfish.", on=10)

    for chat in ("chat-a", "chat-b", "chat-c"):
        assert loaded(chat) == {("name", "Carmen Ruiz")}
    # Chat A's row is untouched; chat B keeps a retracted record of the withdrawal, made by its message.
    kept = KeyFact.objects.get(memory_key="chat-a", key="allergy")
    assert (kept.invalidated_at, kept.changed_by_message_id) == (None, None)
    record = KeyFact.objects.get(memory_key="chat-b")
    assert (record.key, record.value, record.as_fact().status) == ("allergy", "shellfish", "retracted")
    assert (record.source_message_id, record.changed_by_message_id, record.operation) == (
        withdrawal,
        withdrawal,
        "retract",
    )
    assert "no longer allergic to shellfish" in record.excerpt


def test_f54_a_rule_fact_updated_in_another_chat_is_current_everywhere():
    typed("chat-a", "You can text me on 07700 900555 about the repair.", on=0)
    typed("chat-b", "New phone, new number: it's 07700 900888 from today.", on=10)

    for chat in ("chat-a", "chat-b", "chat-c"):
        assert {v for k, v in loaded(chat) if k == "phone"} == {"07700 900888"}


def test_f54_a_value_stated_again_after_the_change_elsewhere_is_current_again():
    said("chat-a", "allergy", "shellfish", on=0, kind="preference")
    typed("chat-b", "I'm no longer allergic to shellfish.", on=5)
    said("chat-a", "allergy", "peanuts", on=6, kind="preference")
    said("chat-c", "allergy", "shellfish", on=8, kind="preference")

    assert loaded("chat-a") == {("allergy", "shellfish"), ("allergy", "peanuts")}
    assert loaded("chat-d") == {("allergy", "shellfish"), ("allergy", "peanuts")}


def test_f54_a_chat_specific_slot_does_not_cross_chats():
    typed("chat-a", "I'm chasing order #W6601245 and booking ZFA04Y, they are late.", on=0)
    said("chat-a", "name", "Jo Lindqvist", on=0, kind="name")

    assert loaded("chat-c") == {("name", "Jo Lindqvist")}
    assert {"order_id", "reservation_id"} <= {key for key, _ in loaded("chat-a")}
    assert "#W6601245" not in block(context("chat-c"))


def test_f54_the_owner_wide_load_is_one_query_over_the_indexes(django_assert_num_queries):
    for n in range(5):
        said(f"chat-{n}", "email", f"me{n}@example.com", on=n, kind="email")
        typed(f"chat-{n}", f"My order #W{2378150 + n} is late.", on=n)

    with django_assert_num_queries(1):
        facts = key_fact_list_for_owner(memory_key="chat-0", scope_key=OWNER)
    assert len(facts) == 6  # five emails, this chat's order
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN QUERY PLAN {_OWNER_FACTS_SQL}", ["chat-0", OWNER, *_PERSONAL_KEYS])
            plan = " ".join(str(row[-1]) for row in cursor.fetchall())
        assert "MULTI-INDEX OR" in plan and "SCAN f" not in plan


# --- owners and strangers ---------------------------------------------------------------------


@pytest.mark.parametrize("facts_scope", ["owner", "chat"])
def test_f54_another_owners_facts_never_appear_whatever_the_setting(facts_scope):
    owner_wide = facts_scope == "owner"
    said("chat-a", "home_address", "12 Rue Verte", on=0)
    said("chat-a", "allergy", "shellfish", on=0, kind="preference")
    # A stranger, later, with the same slots and values, a change of them and a withdrawal.
    said("stranger-1", "address", "1 Stranger Street", on=5, scope=STRANGER)
    said("stranger-1", "name", "Sam Stranger", on=5, scope=STRANGER, kind="name")
    typed("stranger-1", "I'm no longer allergic to shellfish.", on=6, scope=STRANGER, owner_wide=owner_wide)
    typed("stranger-1", "Write to sam@stranger.example about order #W5555555.", on=6, scope=STRANGER)

    for chat in ("chat-a", "chat-c"):
        ctx = context(chat, facts_scope=facts_scope)
        text = " ".join([block(ctx), *(entry["value"] for entry in ctx.facts["entries"])])
        for value in ("1 Stranger Street", "Sam Stranger", "sam@stranger.example", "#W5555555"):
            assert value not in text
    expected = {("home_address", "12 Rue Verte"), ("allergy", "shellfish")}
    assert current(context("chat-a", facts_scope=facts_scope)) == expected
    assert current(context("chat-c", facts_scope=facts_scope)) == (expected if owner_wide else set())
    # Nor does the owner's reach the stranger's chats.
    stranger = context("stranger-2", scope=STRANGER, facts_scope=facts_scope)
    assert current(stranger) == (
        {("address", "1 Stranger Street"), ("name", "Sam Stranger"), ("email", "sam@stranger.example")}
        if owner_wide
        else set()
    )
    assert not KeyFact.objects.filter(scope_key=STRANGER, value="12 Rue Verte").exists()
    assert not KeyFact.objects.filter(scope_key=OWNER).exclude(memory_key__startswith="chat-").exists()


# --- the setting and the chat app's requests -------------------------------------------------


def owner_chats(n: int) -> tuple[str, list[ChatSession]]:
    owner = visitor_make().owner
    sessions = [chat_session_make(owner) for _ in range(n)]
    return chat_session_scope_key(owner_id=owner.user_id, owner_session_key=owner.session_key or ""), sessions


def submit(session: ChatSession, text: str) -> Message:
    message, _ = leases.user_message_submit(session=session, client_message_id=f"m{next(_message_ids)}", text=text)
    return message


def turn_context(session: ChatSession, message: Message) -> MemoryContext:
    engine = memory_engine(run_sync=sync_to_async)
    scope_key = chat_session_scope_key(owner_id=session.owner_id, owner_session_key=session.owner_session_key)
    turn = Turn(
        session_id=session.pk, user_message_id=message.pk, mode="agent", engine=engine, question="", scope_key=scope_key
    )

    async def build() -> MemoryContext:
        request = await turn.context_request(system_prompt="You help.")
        assert request.scope_key == scope_key
        return await engine.context(request)

    return async_to_sync(build)()


def phones(ctx: MemoryContext) -> set[str]:
    return {entry["value"] for entry in ctx.facts["entries"] if entry["key"] == "phone"}


@pytest.mark.usefixtures("offline_engine")
def test_f54_the_chat_apps_requests_see_the_owners_personal_facts_by_default(settings):
    settings.MEMORY_COMPRESSION = "sync"
    assert memory_config().facts_scope == "owner"
    scope_key, (a, b, c) = owner_chats(3)
    first = submit(a, "You can text me on 07700 900555 about the repair.")
    submit(b, "New phone, new number: it's 07700 900888 from today. I'm chasing order #W6601245.")
    submit(a, "Forget my old email old@example.com please.")  # a withdrawal naming nothing: no change
    question = submit(c, "Which number should the repair shop text?")

    assert phones(turn_context(a, first)) == {"07700 900888"}
    ctx = turn_context(c, question)
    assert phones(ctx) == {"07700 900888"} and "#W6601245" not in block(ctx)
    planned = async_to_sync(ChatConversations(run_sync=sync_to_async).next_request)(memory_key_of(c.pk))
    assert planned is not None and planned.request.scope_key == scope_key
    assert [fact.value for fact in key_fact_list_active(memory_key=memory_key_of(a.pk))] == ["07700 900555"]


@pytest.mark.usefixtures("offline_engine")
def test_f54_memory_facts_scope_chat_keeps_each_chats_facts_its_own(settings):
    settings.MEMORY_COMPRESSION = "sync"
    settings.MEMORY_FACTS_SCOPE = "chat"
    assert memory_config().facts_scope == "chat"
    _, (a, b, c) = owner_chats(3)
    first = submit(a, "You can text me on 07700 900555 about the repair.")
    submit(b, "New phone, new number: it's 07700 900888 from today.")
    submit(b, "Forget 07700 900555, I no longer use that number.")
    question = submit(c, "Which number should the repair shop text?")

    assert phones(turn_context(a, first)) == {"07700 900555"}
    assert phones(turn_context(c, question)) == set()
    # The withdrawal in chat B wrote nothing about chat A's number.
    assert not KeyFact.objects.filter(memory_key=memory_key_of(b.pk), value="07700 900555").exists()


def test_the_owner_wide_list_reads_the_same_fact_fields_as_the_chat_list():
    """key_fact_list_for_owner reads plain rows (it runs on every request); for a chat with no other chat of its
    owner it returns exactly the facts, fields and ``replaces`` of the chat's own list."""
    said("chat-a", "shipping_address", "12 Elm Road", on=0)
    said("chat-a", "shipping_address", "3 Ash Way", on=1)
    pinned = KeyFact.objects.get(memory_key="chat-a", value="3 Ash Way")
    KeyFact.objects.filter(pk=pinned.pk).update(pinned_by_user=True)
    KeyFact.objects.filter(memory_key="chat-a", value="12 Elm Road").update(invalidated_at=day(1), superseded_by=pinned)
    typed("chat-a", "My order #W2378156 is late, write to ada@example.com.", on=2)
    KeyFact.objects.filter(memory_key="chat-a", value="ada@example.com").update(hidden_by_user=True)
    said("stranger-1", "email", "sam@stranger.example", on=3, scope=STRANGER, kind="email")

    own = key_fact_list_active(memory_key="chat-a")
    assert key_fact_list_for_owner(memory_key="chat-a", scope_key=OWNER) == own
    assert [(f.value, f.replaces, f.pinned_by_user, f.chat) for f in own] == [
        ("3 Ash Way", "12 Elm Road", True, ""),
        ("#W2378156", "", False, ""),
    ]
    assert all(isinstance(fact, Fact) and fact.valid_from is not None and fact.valid_from.tzinfo for fact in own)
    captured = CaptureQueriesContext(connections[DEFAULT_DB_ALIAS])
    with captured:
        assert key_fact_list_for_owner(memory_key="chat-z", scope_key=OWNER) == [
            replace(f, chat="chat-a") for f in own if f.key == "shipping_address"
        ]
    assert len(captured.captured_queries) == 1
