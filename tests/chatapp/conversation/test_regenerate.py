"""Regenerate the last reply (docs/memory.md §8, "Regenerate"): the reply is kept as an earlier version and leaves
the transcript, memory forgets it (recall items, key facts; never a reply already in the summary), the turn runs
again, and only the chat's last turn can be regenerated."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from chatapp.chats import selectors
from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.conversation.regenerate import RegenerateRefused, reply_regenerate_prepare, reply_version_restore
from chatapp.kb.documents import document_upload
from chatapp.models import ChatSession, Message, ModelCall, ReplyVersion, TurnLease
from memory.models import KeyFact, MemoryItem, SessionSummary
from tests.chatapp.conftest import (
    TIMEOUT,
    Visitor,
    chat_session_make,
    is_done,
    message_make,
    of_type,
    receive_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("offline_engine", "demo_kb")]

QUESTION = "Search the knowledge base for the Osprey migration tool."
OSPREY = "# Osprey migration tool\n\nThe Osprey migration tool copies a whole NAS share to Kestrel Sync overnight."


def regenerate(turn_id: int) -> dict:
    return {"type": "chat.regenerate", "turn_id": turn_id}


async def test_a_regenerated_reply_is_kept_as_a_version_and_memory_sees_only_the_new_one(ws, alice: Visitor):
    """Asked before the document existed, the reply found nothing; regenerated after the upload, it answers. The
    first reply stays readable as version 1, the next request carries only version 2."""
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.AGENT)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as tab:
        await tab.connect(timeout=TIMEOUT)
        await tab.send_json_to({"type": "chat.send", "client_message_id": "q1", "text": QUESTION})
        first = await receive_until(tab, is_done)
        turn_id = first[0]["message_id"]
        old_ids = [e["message"]["id"] for e in of_type(first, "chat.message") if e["message"]["role"] != "user"]
        old_final = of_type(first, "chat.message")[-1]["message"]
        assert "found nothing" in old_final["content"] and old_final["version"] == 1

        await sync_to_async(document_upload)(filename="osprey.md", body=OSPREY)
        await tab.send_json_to(regenerate(turn_id))
        events = await receive_until(tab, is_done)
        await tab.send_json_to({"type": "chat.send", "client_message_id": "q2", "text": "Thanks. Which tool was it?"})
        await receive_until(tab, is_done)

    assert events[0] == {"type": "chat.regenerated", "turn_id": turn_id, "version": 2, "removed": old_ids}
    new = [e["message"] for e in of_type(events, "chat.message")]
    assert new[-1]["reply_to"] == turn_id and "overnight" in new[-1]["content"]
    assert all(message["version"] == 2 for message in new)
    # The old reply left the transcript and is kept whole as version 1.
    assert not await Message.objects.filter(pk__in=old_ids).aexists()
    version = await ReplyVersion.objects.aget(turn_id=turn_id)
    assert version.number == 1 and [m["id"] for m in version.messages] == old_ids
    assert version.final_reply is not None and "found nothing" in version.final_reply["content"]
    # The next request (the follow-up question) holds the new reply and nothing of the old one.
    follow_up = await ModelCall.objects.filter(session=session).alatest("id")
    sent = str(follow_up.context["messages"])
    assert "overnight" in sent and "found nothing" not in sent


def test_only_the_last_turn_with_a_final_reply_and_nothing_in_flight_can_be_regenerated(alice: Visitor):
    session = chat_session_make(alice.owner)
    first = message_make(session, "user", "Hello there.")
    message_make(session, "assistant", "Hi.", reply_to=first)
    second = message_make(session, "user", "My order is W1234567.")

    with pytest.raises(RegenerateRefused, match="last message"):
        reply_regenerate_prepare(session=session, turn_id=first.pk)
    with pytest.raises(RegenerateRefused, match="no reply to regenerate"):
        reply_regenerate_prepare(session=session, turn_id=second.pk)
    with pytest.raises(RegenerateRefused, match="not a question of this chat"):
        reply_regenerate_prepare(session=session, turn_id=first.pk + 100)
    other = chat_session_make(alice.owner)
    with pytest.raises(RegenerateRefused, match="not a question of this chat"):
        reply_regenerate_prepare(session=other, turn_id=second.pk)
    assert not ReplyVersion.objects.exists() and Message.objects.filter(session=session).count() == 3


def test_memory_forgets_the_old_reply_but_never_one_already_in_the_summary(alice: Visitor):
    session = chat_session_make(alice.owner)
    turn = message_make(session, "user", "Remember W7654321 please.")
    reply = message_make(
        session, "assistant", "Noted: your order is W7654321 and the code word is Falcon.", reply_to=turn
    )
    key = memory_key_of(session.pk)
    engine = memory_engine()
    async_to_sync(engine.run_jobs)(key)
    assert MemoryItem.objects.filter(memory_key=key, last_message_id=reply.pk).exists()
    KeyFact.objects.create(
        memory_key=key, scope_key="s", kind="identifier", key="order_id", value="W0", source_message_id=reply.pk
    )

    version = reply_regenerate_prepare(session=session, turn_id=turn.pk)[1]
    assert version == 2
    assert not MemoryItem.objects.filter(memory_key=key, last_message_id__gt=turn.pk).exists()
    assert MemoryItem.objects.filter(memory_key=key, last_message_id=turn.pk).exists()  # the question stays
    forgotten = KeyFact.objects.get(memory_key=key, value="W0")
    assert forgotten.invalidated_at is not None and forgotten.operation == "forget"
    assert KeyFact.objects.filter(memory_key=key, value="W0").count() == 1  # retired, never deleted

    # A reply the summary already holds cannot be taken back out of it: refused, nothing changed.
    again = message_make(session, "assistant", "Second answer.", reply_to=turn, version=2)
    SessionSummary.objects.update_or_create(
        memory_key=key,
        defaults={"content": "The user gave W7654321.", "summary_type": "llm", "last_message_id": again.pk},
    )
    with pytest.raises(RegenerateRefused, match="folded into the memory summary"):
        reply_regenerate_prepare(session=session, turn_id=turn.pk)
    assert Message.objects.filter(pk=again.pk).exists() and ReplyVersion.objects.count() == 1


async def test_a_refused_regenerate_gets_an_error_and_changes_nothing(ws, alice: Visitor):
    session = await sync_to_async(chat_session_make)(alice.owner)
    question = await sync_to_async(message_make)(session, "user", "Hello?")
    await sync_to_async(message_make)(session, "assistant", "Hi.", reply_to=question)
    later = await sync_to_async(message_make)(session, "user", "And now?")
    await sync_to_async(message_make)(session, "assistant", "Still here.", reply_to=later)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as tab:
        await tab.connect(timeout=TIMEOUT)
        await tab.send_json_to(regenerate(question.pk))
        refused = await tab.receive_json_from(timeout=TIMEOUT)
        await tab.send_json_to({"type": "chat.regenerate", "turn_id": "7"})
        malformed = await tab.receive_json_from(timeout=TIMEOUT)
    assert (
        refused["type"] == "error" and refused["code"] == "cannot_regenerate" and "last message" in refused["message"]
    )
    assert malformed["code"] == "bad_field"
    assert await Message.objects.filter(session=session).acount() == 4 and not await ReplyVersion.objects.aexists()


def test_an_earlier_version_brought_back_becomes_the_newest_and_the_only_one_memory_sees(alice: Visitor):
    session = chat_session_make(alice.owner)
    turn = message_make(session, "user", "Which plan fits a team of five?")
    first = message_make(session, "assistant", "The Team plan.", reply_to=turn)
    reply_regenerate_prepare(session=session, turn_id=turn.pk)
    second = message_make(session, "assistant", "The Enterprise plan.", reply_to=turn, version=2)
    TurnLease.objects.filter(user_message=turn).delete()  # the regenerated turn ended with its reply

    restored = reply_version_restore(session=session, turn_id=turn.pk, number=1)

    assert restored.content == "The Team plan." and restored.version == 3 and restored.pk not in (first.pk, second.pk)
    assert list(Message.objects.filter(reply_to=turn).values_list("content", flat=True)) == ["The Team plan."]
    versions = dict(ReplyVersion.objects.filter(turn=turn).values_list("number", "messages"))
    assert sorted(versions) == [1, 2] and versions[2][0]["content"] == "The Enterprise plan."
    context = selectors.message_list_for_context(session_id=session.pk, boundary=None, turn_message_id=turn.pk)
    assert [m["content"] for m in context] == [turn.content, "The Team plan."]
    with pytest.raises(RegenerateRefused, match="has no version 7"):
        reply_version_restore(session=session, turn_id=turn.pk, number=7)
