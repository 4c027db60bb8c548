"""Edit a sent message into a new chat (docs/memory.md §8, "Edit into a new chat"): the history before it is copied
with its times, the edited text continues the copy, the copy's memory comes from its own messages (a summary is
reused only when all it folded precedes the fork point), and the original chat is untouched."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from chatapp.chats.memory import memory_engine, memory_key_of, session_scope_key
from chatapp.chats.selectors import reply_version_get
from chatapp.chats.services import message_facts_store
from chatapp.conversation.fork import ForkRefused, chat_session_fork
from chatapp.conversation.runner import chat_turn_run
from chatapp.models import ChatSession, Message, ReplyVersion
from memory.models import KeyFact, MemoryItem, SessionSummary
from tests.chatapp.conftest import Visitor, chat_session_make, message_make

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("offline_engine", "demo_kb")]


def conversation(owner: Visitor) -> tuple[ChatSession, list[Message]]:
    """Three turns a day apart; the first states an address and an order."""
    session = chat_session_make(owner.owner, title="Moving house")
    start = timezone.now() - timedelta(days=3)
    texts = [
        ("user", "My address is 12 Elm Road, Leeds and my order is W1234567."),
        ("assistant", "Noted."),
        ("user", "Please ship the order to my office instead."),
        ("assistant", "Shipping to your office."),
        ("user", "Actually my address is 48 Birch Lane, York."),
        ("assistant", "Updated."),
    ]
    rows: list[Message] = []
    for number, (role, text) in enumerate(texts):
        reply_to = rows[-1] if role == "assistant" else None
        row = message_make(session, role, text, reply_to=reply_to)
        Message.objects.filter(pk=row.pk).update(created=start + timedelta(days=number // 2, minutes=number))
        row.refresh_from_db()
        message_facts_store(message=row)
        rows.append(row)
    return session, rows


def snapshot(session: ChatSession) -> list[tuple]:
    return list(Message.objects.filter(session=session).order_by("id").values_list("id", "content", "created"))


def test_the_copy_continues_with_the_edit_and_reuses_a_summary_that_ends_before_it(alice: Visitor):
    session, rows = conversation(alice)
    key = memory_key_of(session.pk)
    SessionSummary.objects.create(
        memory_key=key, content="The user lives at 12 Elm Road.", summary_type="llm", last_message_id=rows[1].pk
    )
    before, facts_before = snapshot(session), list(KeyFact.objects.filter(memory_key=key).values_list("id", "value"))

    edited = chat_session_fork(
        session=session, message_id=rows[2].pk, text="Please ship it to my home.", client_message_id="edit-1"
    )

    fork = ChatSession.objects.get(pk=edited.session_id)
    assert fork.pk != session.pk and fork.owner_id == session.owner_id and fork.mode == session.mode
    assert fork.forked_from_id == session.pk and fork.forked_at_message_id == rows[2].pk
    assert fork.title == f"Moving house (edited at #{rows[2].pk})"
    copied = list(Message.objects.filter(session=fork).order_by("id"))
    assert [m.content for m in copied] == [rows[0].content, rows[1].content, "Please ship it to my home."]
    assert [m.created for m in copied[:2]] == [rows[0].created, rows[1].created]  # times kept
    assert copied[1].reply_to_id == copied[0].pk and copied[2].pk == edited.pk
    assert Message.objects.filter(pk=edited.pk, turn_lease__isnull=False).exists()  # in flight, to be answered
    # The summary folded only messages before the fork point: reused, its boundary on the copy's id.
    summary = memory_engine().summary(memory_key_of(fork.pk))
    assert summary.content == "The user lives at 12 Elm Road." and summary.last_message_id == copied[1].pk
    # Key facts come from the copy's own messages: the later correction is not the copy's.
    fork_facts = {(f.key, f.value) for f in KeyFact.objects.filter(memory_key=memory_key_of(fork.pk))}
    assert ("order_id", "#W1234567") in fork_facts or any(value.endswith("W1234567") for _, value in fork_facts)
    assert not any("Birch" in value for _, value in fork_facts)
    # The original is untouched.
    assert snapshot(session) == before
    assert list(KeyFact.objects.filter(memory_key=key).values_list("id", "value")) == facts_before
    assert SessionSummary.objects.get(memory_key=key).last_message_id == rows[1].pk


def test_the_copy_and_the_original_never_see_each_others_facts_or_messages(alice: Visitor):
    """Found by a newcomer: an edit that changed the address was the owner's newest statement, so the original chat
    pinned the edited address, and the copy the original's later correction. A copy is a memory scope of its own."""
    session, rows = conversation(alice)
    edited = chat_session_fork(
        session=session, message_id=rows[4].pk, text="Actually my address is 9 Oak Street, Bath.", client_message_id="e"
    )
    fork = ChatSession.objects.get(pk=edited.session_id)
    assert session_scope_key(fork) != session_scope_key(session)
    answers: dict[int, str] = {}
    for chat in (session, fork):
        async_to_sync(memory_engine().run_jobs)(memory_key_of(chat.pk))
        question = message_make(chat, "user", "What is my address?")
        answers[chat.pk] = async_to_sync(chat_turn_run)(session_id=chat.pk, user_message_id=question.pk).content or ""
    assert "48 Birch Lane" in answers[session.pk] and "Oak" not in answers[session.pk]
    assert "9 Oak Street" in answers[fork.pk] and "Birch" not in answers[fork.pk]
    # Recall: the original never finds the copy's messages, nor the copy the original's later ones.
    original_items = MemoryItem.objects.filter(scope_key=session_scope_key(session)).values_list("text", flat=True)
    copy_items = MemoryItem.objects.filter(scope_key=session_scope_key(fork)).values_list("text", flat=True)
    assert not any("Oak" in text for text in original_items)
    assert not any("Birch" in text for text in copy_items) and any("Oak" in text for text in copy_items)


def test_a_regenerated_reply_keeps_its_earlier_versions_in_the_copy(alice: Visitor):
    session, rows = conversation(alice)
    ReplyVersion.objects.create(turn=rows[0], number=1, messages=[{"id": 1, "role": "assistant", "content": "Old."}])
    Message.objects.filter(pk=rows[1].pk).update(version=2)
    edited = chat_session_fork(session=session, message_id=rows[2].pk, text="Ship it home.", client_message_id="e5")
    copied_turn = Message.objects.filter(session_id=edited.session_id).order_by("id").first()
    assert copied_turn is not None
    version, total = reply_version_get(session_id=edited.session_id, turn_id=copied_turn.pk, number=1)
    assert total == 2 and version.final_reply == {"id": 1, "role": "assistant", "content": "Old."}


def test_a_summary_that_folded_the_edited_message_or_later_is_not_reused(alice: Visitor):
    session, rows = conversation(alice)
    SessionSummary.objects.create(
        memory_key=memory_key_of(session.pk),
        content="Ships to the office.",
        summary_type="llm",
        last_message_id=rows[3].pk,
    )
    edited = chat_session_fork(session=session, message_id=rows[2].pk, text="Ship it home.", client_message_id="edit-2")
    assert memory_engine().summary(memory_key_of(edited.session_id)).last_message_id is None


def test_the_copys_recall_index_holds_its_own_messages_only(alice: Visitor):
    session, rows = conversation(alice)
    async_to_sync(memory_engine().run_jobs)(memory_key_of(session.pk))
    edited = chat_session_fork(session=session, message_id=rows[2].pk, text="Ship it home.", client_message_id="edit-3")
    fork_key = memory_key_of(edited.session_id)
    async_to_sync(memory_engine().run_jobs)(fork_key)
    texts = list(MemoryItem.objects.filter(memory_key=fork_key).values_list("text", flat=True))
    assert rows[0].content in texts and "Ship it home." in texts
    assert not any("office" in text or "Birch" in text for text in texts)


def test_only_the_owners_own_user_messages_can_be_edited(alice: Visitor, bob: Visitor):
    session, rows = conversation(alice)
    with pytest.raises(ForkRefused):
        chat_session_fork(session=session, message_id=rows[1].pk, text="x", client_message_id="edit-4")
    url = f"/s/{session.pk}/messages/{rows[2].pk}/fork/"
    assert bob.client.post(url, {"text": "Mine now."}).status_code == 404
    owner = alice.client
    assert owner.post(f"/s/{session.pk}/messages/{rows[1].pk}/fork/", {"text": "Not a question."}).status_code == 404
    refused = owner.post(url, {"text": "   "})
    assert refused.status_code == 422 and "Write the edited message" in refused.content.decode()
    assert ChatSession.objects.filter(forked_from=session).count() == 0


def test_a_copys_title_names_the_edit_once_and_follows_an_edited_first_message(alice: Visitor):
    """A newcomer saw "… (edited at #71) (edited at #79) (edited at #87)" for copies of copies, and a copy of an
    edited first message titled with the text it no longer holds."""
    session, rows = conversation(alice)
    copy = chat_session_fork(session=session, message_id=rows[2].pk, text="Ship it home.", client_message_id="t1")
    copied_user = Message.objects.filter(session_id=copy.session_id, role="user").order_by("id")[1]
    again = chat_session_fork(
        session=ChatSession.objects.get(pk=copy.session_id),
        message_id=copied_user.pk,
        text="Ship it to Leeds.",
        client_message_id="t2",
    )
    assert ChatSession.objects.get(pk=again.session_id).title == f"Moving house (edited at #{copied_user.pk})"
    first = chat_session_fork(
        session=session, message_id=rows[0].pk, text="I need help with invoices.", client_message_id="t3"
    )
    assert ChatSession.objects.get(pk=first.session_id).title == f"I need help with invoices. (edited at #{rows[0].pk})"
