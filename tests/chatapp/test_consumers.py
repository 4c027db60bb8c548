"""The chat WebSocket against the real ASGI application (origin check, session, auth, router),
with the offline engine: protocol, streaming in both modes, idempotent resends, reconnects
(FAULTS F-27), bounded and validated input, and who may open a socket."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chatapp.models import ChatSession, Message, ModelCall
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

KB_QUESTION = "search the knowledge base for Team plan price"


async def make_session(owner: Visitor, mode: str = ChatSession.Mode.AGENT) -> ChatSession:
    return await sync_to_async(chat_session_make)(owner.owner, mode=mode)


async def rows(session: ChatSession) -> list[Message]:
    return [m async for m in Message.objects.filter(session=session).order_by("id")]


def send(client_message_id: str, text: str) -> dict[str, Any]:
    return {"type": "chat.send", "client_message_id": client_message_id, "text": text}


async def assert_closed_not_found(communicator: Any) -> None:
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    assert connected  # accepted first, so that the browser can see the 4404 code
    assert await communicator.receive_output(timeout=TIMEOUT) == {"type": "websocket.close", "code": 4404}


# --- who may open a socket ------------------------------------------------------------------


@pytest.mark.parametrize("owner_kind", ["user", "anonymous"])
async def test_owner_connects_and_gets_silence_until_asking(ws, alice, anon, owner_kind):
    owner = alice if owner_kind == "user" else anon
    session = await make_session(owner)
    async with ws(f"/ws/chat/{session.pk}/", cookie=owner.cookie) as communicator:
        connected, _ = await communicator.connect(timeout=TIMEOUT)
        assert connected
        assert await communicator.receive_nothing(timeout=0.2)


@pytest.mark.parametrize(
    "stranger",
    ["other_user", "other_anonymous", "no_cookie", "forged_cookie"],
)
@pytest.mark.parametrize("owner_kind", ["user", "anonymous"])
async def test_strangers_are_closed_with_4404(ws, alice, bob, anon, anon2, owner_kind, stranger):
    owner = alice if owner_kind == "user" else anon
    session = await make_session(owner)
    cookie = {
        "other_user": bob.cookie if owner_kind == "user" else alice.cookie,
        "other_anonymous": anon2.cookie,
        "no_cookie": None,
        "forged_cookie": "sessionid=" + "x" * 32,
    }[stranger]
    async with ws(f"/ws/chat/{session.pk}/", cookie=cookie) as communicator:
        await assert_closed_not_found(communicator)


async def test_unknown_session_is_closed_with_4404(ws, alice):
    async with ws("/ws/chat/999999/", cookie=alice.cookie) as communicator:
        await assert_closed_not_found(communicator)


@pytest.mark.parametrize("origin", ["http://evil.example", None])
async def test_foreign_or_missing_origin_is_refused(ws, alice, origin):
    session = await make_session(alice)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie, origin=origin) as communicator:
        connected, _ = await communicator.connect(timeout=TIMEOUT)
        assert not connected


# --- streaming turns ------------------------------------------------------------------------


async def test_agent_turn_streams_tool_calls_results_and_answer(ws, alice):
    session = await make_session(alice)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to(send("m1", KB_QUESTION))
        events = await receive_until(communicator, is_done)
        assert await communicator.receive_nothing(timeout=0.2)

    ack, user_event = events[0], events[1]
    assert ack == {
        "type": "chat.ack",
        "client_message_id": "m1",
        "message_id": ack["message_id"],
        "duplicate": False,
        "pending": True,
    }
    assert user_event["type"] == "chat.message" and user_event["message"]["client_message_id"] == "m1"
    turn_id = ack["message_id"]
    assert events[2] == {"type": "chat.turn", "turn_id": turn_id, "status": "started", "mode": "agent"}
    contexts = of_type(events, "memory.context")
    assert [c["step"] for c in contexts] == [1, 2]
    assert contexts[0]["sections"]["tools"] > 0 and contexts[0]["context_window"] == 2048

    stored = await rows(session)
    assert [(m.role, bool(m.tool_calls)) for m in stored] == [
        ("user", False),
        ("assistant", True),
        ("tool", False),
        ("assistant", False),
    ]
    user, call, result, answer = stored
    assert all(m.reply_to_id == user.pk for m in (call, result, answer))
    assert call.tool_calls[0]["function"]["name"] == "kb_search"
    assert result.tool_call_id == call.tool_calls[0]["id"] and result.name == "kb_search"
    assert "12 euros per user per month" in result.content
    assert answer.status == Message.Status.COMPLETE and "12 euros" in answer.content
    assert all(m.token_count > 0 for m in stored)
    # The streamed text is exactly the stored answer, and every stored row was announced.
    assert "".join(d["text"] for d in of_type(events, "chat.delta") if d["step"] == 2) == answer.content
    assert [e["message"]["id"] for e in of_type(events, "chat.message")] == [m.pk for m in stored]
    assert events[-1] == {"type": "chat.done", "turn_id": turn_id, "status": "complete", "message_id": answer.pk}

    calls = [c async for c in ModelCall.objects.filter(session=session).order_by("id")]
    assert [c.step for c in calls] == [1, 2]
    assert [c.pk for c in calls] == [ctx["model_call_id"] for ctx in contexts]
    # What the model saw at step 2 ends with the tool group of this turn.
    assert [m["role"] for m in calls[1].context["messages"]][-3:] == ["user", "assistant", "tool"]
    assert calls[1].estimated_tokens == contexts[1]["tokens"] and calls[1].prompt_tokens is not None


async def test_quick_answer_retrieves_then_answers_once(ws, anon):
    session = await make_session(anon, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/", cookie=anon.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to(send("q1", "What is the Team plan price per user?"))
        events = await receive_until(communicator, is_done)
        assert await communicator.receive_nothing(timeout=0.2)

    retrieval = of_type(events, "chat.retrieval")[0]
    assert retrieval["passages"][0]["title"] == "Kestrel Sync plans and pricing"
    assert [c["step"] for c in of_type(events, "memory.context")] == [1]
    stored = await rows(session)
    assert [m.role for m in stored] == ["user", "assistant"]
    answer = stored[1]
    assert "12 euros per user per month" in answer.content
    assert "".join(d["text"] for d in of_type(events, "chat.delta")) == answer.content
    call = await ModelCall.objects.aget(session=session)
    assert call.mode == "quick-answer" and "Team plan price: 12 euros" in call.context["messages"][0]["content"]


async def test_model_failure_ends_turn_with_error_and_keeps_history(ws, alice, settings):
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    await sync_to_async(message_make)(session, "user", "My order number is 4711.")
    await sync_to_async(message_make)(session, "assistant", "Noted: 4711.")
    settings.OFFLINE_FAIL_CHAT = True
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to(send("f1", "What is my order number?"))
        events = await receive_until(communicator, is_done)

    error = of_type(events, "error")[0]
    assert error["code"] == "llm_server" and "offline engine" in error["message"].lower()
    assert events[-1]["status"] == "error"
    stored = await rows(session)
    assert [m.content for m in stored[:3]] == ["My order number is 4711.", "Noted: 4711.", "What is my order number?"]
    assert stored[3].role == "assistant" and stored[3].status == Message.Status.ERROR
    assert "could not answer" in stored[3].content


async def test_stop_ends_a_slow_reply_as_stopped(ws, alice, settings):
    settings.OFFLINE_DELAY_SECONDS = 3.0
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to(send("s1", "How large can a file be?"))
        await receive_until(communicator, lambda e: e["type"] == "memory.context")
        await communicator.send_json_to({"type": "chat.stop"})
        events = await receive_until(communicator, is_done, timeout=2.0)

    assert events[-1]["status"] == "stopped"
    answer = (await rows(session))[-1]
    assert answer.status == Message.Status.STOPPED and answer.content == "[stopped by the user]"


# --- resends and reconnects (FAULTS F-27) --------------------------------------------------


async def test_resend_of_a_finished_message_stores_nothing_and_replays_the_reply(ws, alice):
    session = await make_session(alice)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to(send("r1", KB_QUESTION))
        await receive_until(communicator, is_done)
        before = [m.pk for m in await rows(session)]

        await communicator.send_json_to(send("r1", KB_QUESTION))
        replay = await receive_until(communicator, is_done)
        assert await communicator.receive_nothing(timeout=0.3)

    assert [m.pk for m in await rows(session)] == before
    assert replay[0] == {
        "type": "chat.ack",
        "client_message_id": "r1",
        "message_id": before[0],
        "duplicate": True,
        "pending": False,
    }
    assert [e["message"]["id"] for e in of_type(replay, "chat.message")] == before
    assert replay[-1]["message_id"] == before[-1] and replay[-1]["status"] == "complete"
    assert not of_type(replay, "chat.turn")


async def test_resend_while_the_reply_is_in_flight_lets_it_finish_once(ws, alice, settings):
    settings.OFFLINE_DELAY_SECONDS = 0.3
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to(send("p1", "How long is version history kept on the Team plan?"))
        await communicator.send_json_to(send("p1", "How long is version history kept on the Team plan?"))
        events = await receive_until(communicator, is_done)
        assert await communicator.receive_nothing(timeout=0.5)

    acks = of_type(events, "chat.ack")
    assert [(a["duplicate"], a["pending"]) for a in acks] == [(False, True), (True, True)]
    assert len(of_type(events, "chat.turn")) == 1 and len(of_type(events, "chat.done")) == 1
    assert [m.role for m in await rows(session)] == ["user", "assistant"]


async def test_reconnect_mid_reply_gets_the_complete_reply(ws, alice, settings):
    settings.OFFLINE_DELAY_SECONDS = 0.5
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    path = f"/ws/chat/{session.pk}/"
    async with ws(path, cookie=alice.cookie) as first:
        await first.connect(timeout=TIMEOUT)
        await first.send_json_to(send("c1", "How many failed sign-in attempts lock an account?"))
        events = await receive_until(first, lambda e: e["type"] == "memory.context")
        last_seen = of_type(events, "chat.message")[-1]["message"]["id"]
    # The first tab is gone while the model is still answering; a new one connects and syncs.
    async with ws(path, cookie=alice.cookie) as second:
        await second.connect(timeout=TIMEOUT)
        await second.send_json_to({"type": "chat.sync", "after_message_id": last_seen})
        history = await second.receive_json_from(timeout=TIMEOUT)
        assert history == {"type": "chat.history", "messages": [], "more": False, "pending": [last_seen]}
        events = await receive_until(second, is_done)
        final = of_type(events, "chat.message")[-1]["message"]
        # A resend of the same message after reconnecting stores nothing new.
        await second.send_json_to(send("c1", "How many failed sign-in attempts lock an account?"))
        replay = await receive_until(second, is_done)

    stored = await rows(session)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert final["id"] == stored[1].pk and final["content"] == stored[1].content
    assert "10 failed sign-in attempts" in stored[1].content
    assert of_type(replay, "chat.ack")[0]["duplicate"] is True


async def test_sync_after_reconnect_returns_missed_messages_and_pages(ws, alice, settings):
    session = await make_session(alice)
    created = [await sync_to_async(message_make)(session, "user", f"note {i}") for i in range(3)]
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to({"type": "chat.sync", "after_message_id": created[0].pk})
        history = await communicator.receive_json_from(timeout=TIMEOUT)
        assert [m["id"] for m in history["messages"]] == [m.pk for m in created[1:]]
        assert history["more"] is False
        assert history["pending"] == [m.pk for m in created]  # no replies yet
        await communicator.send_json_to({"type": "chat.sync", "after_message_id": 0})
        everything = await communicator.receive_json_from(timeout=TIMEOUT)
        assert [m["id"] for m in everything["messages"]] == [m.pk for m in created]


# --- validated, bounded input ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{not json", "bad_json"),
        ("[1, 2]", "bad_event"),
        ('"chat.send"', "bad_event"),
        ("{}", "bad_event"),
        ('{"type": 7}', "bad_event"),
        ('{"type": "chat.delete"}', "bad_event"),
        ('{"type": "chat.send", "text": "hi"}', "bad_field"),
        ('{"type": "chat.send", "client_message_id": "", "text": "hi"}', "bad_field"),
        ('{"type": "chat.send", "client_message_id": "a b<script>", "text": "hi"}', "bad_field"),
        ('{"type": "chat.send", "client_message_id": "' + "x" * 65 + '", "text": "hi"}', "bad_field"),
        ('{"type": "chat.send", "client_message_id": "m1"}', "bad_field"),
        ('{"type": "chat.send", "client_message_id": "m1", "text": "   "}', "bad_field"),
        ('{"type": "chat.send", "client_message_id": "m1", "text": ["hi"]}', "bad_field"),
        ('{"type": "chat.send", "client_message_id": "m1", "text": "a\\u0000b"}', "bad_field"),
        ('{"type": "chat.sync"}', "bad_field"),
        ('{"type": "chat.sync", "after_message_id": -1}', "bad_field"),
        ('{"type": "chat.sync", "after_message_id": "3"}', "bad_field"),
        ('{"type": "chat.sync", "after_message_id": true}', "bad_field"),
    ],
)
async def test_malformed_events_get_a_clear_error_and_store_nothing(ws, alice, frame, code):
    session = await make_session(alice)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_to(text_data=frame)
        error = await communicator.receive_json_from(timeout=TIMEOUT)
        assert error["type"] == "error" and error["code"] == code and error["message"]
        assert await communicator.receive_nothing(timeout=0.2)
        # The socket stays usable.
        await communicator.send_json_to({"type": "chat.sync", "after_message_id": 0})
        assert (await communicator.receive_json_from(timeout=TIMEOUT))["type"] == "chat.history"
    assert await rows(session) == []


async def test_binary_frames_are_refused(ws, alice):
    session = await make_session(alice)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_to(bytes_data=b'{"type": "chat.stop"}')
        assert (await communicator.receive_json_from(timeout=TIMEOUT))["code"] == "bad_frame"


async def test_oversized_messages_are_refused_and_not_stored(ws, alice, settings):
    settings.CHAT_MAX_MESSAGE_CHARS = 50
    session = await make_session(alice)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to(send("big", "x" * 51))
        error = await communicator.receive_json_from(timeout=TIMEOUT)
        assert error == {
            "type": "error",
            "code": "too_long",
            "message": "The message is 51 characters long; the limit is 50.",
            "client_message_id": "big",
        }
        # A frame far over any message's size is refused before it is even parsed.
        await communicator.send_to(text_data=json.dumps(send("huge", "y" * 10_000)))
        assert (await communicator.receive_json_from(timeout=TIMEOUT))["code"] == "bad_frame"
        assert await communicator.receive_nothing(timeout=0.2)
    assert await rows(session) == []


async def test_events_reach_every_tab_of_the_session(ws, alice):
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    path = f"/ws/chat/{session.pk}/"
    async with ws(path, cookie=alice.cookie) as sender, ws(path, cookie=alice.cookie) as watcher:
        await sender.connect(timeout=TIMEOUT)
        await watcher.connect(timeout=TIMEOUT)
        await sender.send_json_to(send("t1", "Where are the data centres?"))
        sent = await receive_until(sender, is_done)
        watched = await asyncio.wait_for(receive_until(watcher, is_done), timeout=TIMEOUT)
    # The watcher sees the same session events, without the sender's private ack.
    assert [e["type"] for e in watched] == [e["type"] for e in sent if e["type"] != "chat.ack"]
