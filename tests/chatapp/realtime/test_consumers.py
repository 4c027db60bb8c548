"""The chat WebSocket (the JSON route, ``/ws/chat/<id>/``; the page route is tested in
tests/chatapp/ui/test_page_feed.py) against the real ASGI application (origin check, session,
auth, router), with the offline engine: protocol (docs/protocol.md), streaming in both modes,
idempotent resends, reconnects (docs/memory.md F-27), bounded and validated input, turns
interrupted by a restart, and who may open a socket."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chatapp.conversation import leases
from chatapp.models import ChatSession, Message, ModelCall
from tests.chatapp.conftest import (
    TIMEOUT,
    Visitor,
    chat_session_make,
    is_done,
    lease_make,
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


def content_of(message: Message) -> str:
    """The message's content (``""`` for one without text, such as a tool call)."""
    return message.content or ""


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


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",  # another host
        "http://127.0.0.1:9999",  # another program on the same machine: another port
        "https://127.0.0.1",  # another scheme (and so another port)
        "https://127.0.0.1:8000",  # another scheme on the same port
        "http://localhost:8000",  # an allowed host, but not the one this page was served from
        "null",  # sandboxed frames, file:// pages
        "http://127.0.0.1:8000:1",  # malformed
        None,  # no Origin at all
    ],
)
async def test_foreign_or_missing_origin_is_refused(ws, alice, origin):
    session = await make_session(alice)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie, origin=origin) as communicator:
        connected, code = await communicator.connect(timeout=TIMEOUT)
        assert not connected and code == 1000  # handshake refused: HTTP 403 for the browser


@pytest.mark.parametrize("origin", ["http://127.0.0.1:8000", "HTTP://127.0.0.1:8000", "http://127.0.0.1:8000/"])
async def test_the_page_own_origin_connects(ws, alice, origin):
    session = await make_session(alice)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie, origin=origin) as communicator:
        connected, _ = await communicator.connect(timeout=TIMEOUT)
        assert connected


async def test_a_trusted_origin_connects_through_a_proxy_that_rewrites_host(ws, alice, settings):
    # The proxy serves https://localhost and forwards with Host 127.0.0.1:8000 (the fixture's).
    settings.CSRF_TRUSTED_ORIGINS = ["https://localhost"]
    session = await make_session(alice)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie, origin="https://localhost") as trusted:
        assert (await trusted.connect(timeout=TIMEOUT))[0]
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie, origin="https://localhost:8443") as other:
        assert not (await other.connect(timeout=TIMEOUT))[0]


@pytest.mark.parametrize(
    "path",
    [
        "/ws/chat/abc/",
        "/ws/chat/",
        "/ws/chat/1/extra/",
        "/ws/chat/1/page/extra/",
        "/ws/chat/abc/page/",
        "/ws/other/",
        "/",
        "/ws/chat/" + "9" * 30 + "/",  # a number, but too large for a database key
        "/ws/chat/" + "9" * 5000 + "/",  # too long even to convert
    ],
)
async def test_unknown_paths_are_closed_with_4404(ws, alice, path):
    async with ws(path, cookie=alice.cookie) as communicator:
        await assert_closed_not_found(communicator)


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
    assert contexts[0]["sections"]["tools"] > 0 and contexts[0]["context_window"] == 4096

    stored = await rows(session)
    assert [(m.role, bool(m.tool_calls)) for m in stored] == [
        ("user", False),
        ("assistant", True),
        ("tool", False),
        ("assistant", False),
    ]
    user, call, result, answer = stored
    assert all(m.reply_to_id == user.pk for m in (call, result, answer))
    assert call.tool_calls is not None and call.tool_calls[0]["function"]["name"] == "kb_search"
    assert result.tool_call_id == call.tool_calls[0]["id"] and result.name == "kb_search"
    assert "12 euros per user per month" in content_of(result)
    assert answer.status == Message.Status.COMPLETE and "12 euros" in content_of(answer)
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
    assert "12 euros per user per month" in content_of(answer)
    assert "".join(d["text"] for d in of_type(events, "chat.delta")) == answer.content
    call = await ModelCall.objects.aget(session=session)
    assert call.mode == "quick-answer" and "Team plan price: 12 euros" in call.context["messages"][0]["content"]


async def test_model_failure_ends_turn_with_error_and_keeps_history(ws, alice, settings):
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    earlier = await sync_to_async(message_make)(session, "user", "My order number is 4711.")
    await sync_to_async(message_make)(session, "assistant", "Noted: 4711.", reply_to=earlier)
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
    assert "could not answer" in content_of(stored[3])


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


async def test_stop_also_stops_the_turns_queued_behind_the_running_one(ws, alice, settings):
    # Found by a newcomer: three sends in a row, then Stop, and the two queued turns still ran.
    settings.OFFLINE_DELAY_SECONDS = 3.0
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        for number in range(3):
            await communicator.send_json_to(send(f"q{number}", "How large can a file be?"))
        await receive_until(communicator, lambda e: e["type"] == "memory.context")
        await communicator.send_json_to({"type": "chat.stop"})
        dones: list[dict] = []
        while len(dones) < 3:
            dones += of_type(await receive_until(communicator, is_done, timeout=5.0), "chat.done")

    assert [done["status"] for done in dones] == ["stopped"] * 3
    replies = [m for m in await rows(session) if m.role == Message.Role.ASSISTANT]
    assert [m.status for m in replies] == [Message.Status.STOPPED] * 3
    # Only the running turn had called the model; the queued ones never did.
    assert await ModelCall.objects.filter(session=session).acount() == 1


# --- resends and reconnects (docs/memory.md F-27) -------------------------------------------


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

        # The same id with another text is no resend: refused at once, nothing stored or replayed (before, the new
        # text was silently dropped and the old message's replies replayed as if they answered it).
        await communicator.send_json_to(send("r1", "A different question entirely?"))
        refused = await communicator.receive_json_from(timeout=TIMEOUT)
        assert await communicator.receive_nothing(timeout=0.3)

    assert refused["type"] == "error" and refused["code"] == "id_reused"
    assert refused["client_message_id"] == "r1" and "another message" in refused["message"]
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
    for message in created:  # their turns are running on other workers
        await sync_to_async(lease_make)(message)
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
        # A lone surrogate has no UTF-8 form: it could be neither stored nor echoed.
        ('{"type": "chat.send", "client_message_id": "m1", "text": "hello \\ud800 world"}', "bad_field"),
        ('{"type": "chat.send", "client_message_id": "m1", "text": "hi", "HEADERS": {"x": ["\\udfff"]}}', "bad_field"),
        ('{"type": "chat.stop", "\\udc00": 1}', "bad_field"),
        # Integers past Python's conversion limit (4,300 digits) are a decoding error, not a crash.
        ('{"type": "chat.sync", "after_message_id": ' + "9" * 5000 + "}", "bad_json"),
        ('{"type": "chat.send", "client_message_id": "m1", "text": "hi", "n": ' + "9" * 5000 + "}", "bad_json"),
        ('{"type": "chat.sync", "after_message_id": ' + "9" * 30 + "}", "bad_field"),
        ('{"type": "chat.sync", "after_message_id": 9223372036854775808}', "bad_field"),
        ('{"type": "chat.sync", "after_message_id": 1e400}', "bad_field"),
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


async def test_a_message_of_the_maximum_length_in_escaped_emoji_is_accepted(ws, alice):
    # json.dumps escapes each emoji as a 12-character surrogate pair ("\ud83d\ude00").
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    text = "\U0001f600" * 8000
    frame = json.dumps(send("e1", text))
    assert len(frame) > 8000 * 12
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_to(text_data=frame)
        events = await receive_until(communicator, is_done)
        # One emoji more is refused for its length, not as a malformed frame.
        await communicator.send_to(text_data=json.dumps(send("e2", text + "\U0001f600")))
        assert (await communicator.receive_json_from(timeout=TIMEOUT))["code"] == "too_long"

    assert events[0]["type"] == "chat.ack" and events[0]["client_message_id"] == "e1"
    user = (await rows(session))[0]
    assert user.content == text


# --- bursts: one session's turns run one at a time, and only a few may wait -----------------


async def test_a_burst_of_sends_stores_only_the_allowed_turns_and_answers_each(ws, alice, settings):
    settings.OFFLINE_DELAY_SECONDS = 0.3
    settings.CHAT_MAX_PENDING_TURNS = 3
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        for i in range(10):
            await communicator.send_json_to(send(f"b{i}", "What is the Team plan price per user?"))
        events: list[dict[str, Any]] = []
        while len(of_type(events, "chat.done")) < 3:
            events += await receive_until(communicator, is_done)
        assert await communicator.receive_nothing(timeout=0.3)

    acks = of_type(events, "chat.ack")
    busy = of_type(events, "error")
    assert [a["client_message_id"] for a in acks] == ["b0", "b1", "b2"]
    assert [(e["code"], e["client_message_id"]) for e in busy] == [("busy", f"b{i}") for i in range(3, 10)]
    assert "3 messages waiting for a reply" in busy[0]["message"]
    stored = await rows(session)
    assert [m.client_message_id for m in stored if m.role == "user"] == ["b0", "b1", "b2"]
    finals = [m for m in stored if m.role == "assistant"]
    assert [m.reply_to_id for m in finals] == [a["message_id"] for a in acks]
    assert all(m.status == Message.Status.COMPLETE and "12 euros" in content_of(m) for m in finals)
    # One after another: each turn starts only after the previous one is done.
    order = [(e["type"], e["turn_id"]) for e in events if e["type"] in ("chat.turn", "chat.done")]
    assert order == [(kind, a["message_id"]) for a in acks for kind in ("chat.turn", "chat.done")]


async def test_many_accepted_sends_lose_no_event(ws, alice, settings):
    settings.CHAT_MAX_PENDING_TURNS = 20
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        for i in range(15):
            await communicator.send_json_to(send(f"m{i}", f"Question {i}: where are the data centres?"))
        events: list[dict[str, Any]] = []
        while len(of_type(events, "chat.done")) < 15:
            events += await receive_until(communicator, is_done)

    finals = [m for m in await rows(session) if m.role == "assistant"]
    assert len(finals) == 15 and all(m.status == Message.Status.COMPLETE for m in finals)
    assert [e["message_id"] for e in of_type(events, "chat.done")] == [m.pk for m in finals]
    assert len(of_type(events, "chat.message")) == 30  # every stored row announced


# --- turns interrupted by a restart ----------------------------------------------------------


async def test_a_turn_interrupted_by_a_restart_is_closed_when_a_tab_reconnects(ws, alice, settings):
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    dead = await sync_to_async(message_make)(session, "user", "How large can a file be?")
    # Its worker stopped: the lease was last renewed longer ago than the lease period.
    await sync_to_async(lease_make)(dead, age_seconds=settings.CHAT_TURN_LEASE_SECONDS + 1)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await communicator.send_json_to({"type": "chat.sync", "after_message_id": dead.pk})
        history = await communicator.receive_json_from(timeout=TIMEOUT)
        assert await communicator.receive_nothing(timeout=0.2)
        # The chat goes on: the next message is answered.
        await communicator.send_json_to(send("next", "How large can a file be?"))
        events = await receive_until(communicator, is_done)

    closed = await Message.objects.aget(reply_to=dead)
    assert closed.status == Message.Status.ERROR and content_of(closed).startswith("[Interrupted: the server stopped")
    assert history["pending"] == [] and [m["id"] for m in history["messages"]] == [closed.pk]
    assert events[-1]["status"] == "complete"
    assert await Message.objects.filter(reply_to=dead).acount() == 1


async def test_the_tab_that_notices_an_interrupted_turn_tells_every_tab(ws, alice, settings):
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    turn = await sync_to_async(message_make)(session, "user", "How large can a file be?")
    await sync_to_async(lease_make)(turn)  # alive when the tabs connect
    path = f"/ws/chat/{session.pk}/"
    async with ws(path, cookie=alice.cookie) as first, ws(path, cookie=alice.cookie) as second:
        await first.connect(timeout=TIMEOUT)
        await second.connect(timeout=TIMEOUT)
        await first.send_json_to({"type": "chat.sync", "after_message_id": turn.pk})
        assert (await first.receive_json_from(timeout=TIMEOUT))["pending"] == [turn.pk]
        # Its worker dies; the lease runs out.
        await sync_to_async(lease_make)(turn, age_seconds=settings.CHAT_TURN_LEASE_SECONDS + 1)
        await first.send_json_to({"type": "chat.sync", "after_message_id": turn.pk})
        history = await first.receive_json_from(timeout=TIMEOUT)
        watched = await receive_until(second, is_done)

    closed = await Message.objects.aget(reply_to=turn)
    assert history["pending"] == [] and [m["id"] for m in history["messages"]] == [closed.pk]
    assert [e["type"] for e in watched] == ["chat.message", "chat.done"]
    assert watched[1] == {"type": "chat.done", "turn_id": turn.pk, "status": "error", "message_id": closed.pk}


async def test_a_live_turn_stays_pending_past_its_lease_period_while_it_waits_and_runs(ws, alice, settings):
    settings.CHAT_TURN_LEASE_SECONDS = 0.6  # heartbeats every 0.2 s
    settings.OFFLINE_DELAY_SECONDS = 1.0
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    path = f"/ws/chat/{session.pk}/"
    async with ws(path, cookie=alice.cookie) as sender, ws(path, cookie=alice.cookie) as watcher:
        await sender.connect(timeout=TIMEOUT)
        await watcher.connect(timeout=TIMEOUT)
        await sender.send_json_to(send("l1", "How large can a file be?"))
        await sender.send_json_to(send("l2", "Where are the data centres?"))
        await asyncio.sleep(1.0)  # longer than a lease: the first runs, the second waits its turn
        await watcher.send_json_to({"type": "chat.sync", "after_message_id": 0})
        history = await receive_until(watcher, lambda e: e["type"] == "chat.history")
        events: list[dict[str, Any]] = []
        while len(of_type(events, "chat.done")) < 2:
            events += await receive_until(sender, is_done)

    users = [m for m in await rows(session) if m.role == "user"]
    assert history[-1]["pending"] == [m.pk for m in users]
    finals = [m for m in await rows(session) if m.role == "assistant"]
    assert [(m.reply_to_id, m.status) for m in finals] == [(m.pk, Message.Status.COMPLETE) for m in users]


async def test_a_resend_of_an_interrupted_message_gets_the_closed_turn(ws, alice, settings):
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    path = f"/ws/chat/{session.pk}/"
    async with ws(path, cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        stored, _ = await sync_to_async(leases.user_message_submit)(
            session=session, client_message_id="r1", text="How large can a file be?"
        )
        # The worker that was to answer it died before it started; its lease runs out.
        await sync_to_async(lease_make)(stored, age_seconds=settings.CHAT_TURN_LEASE_SECONDS + 1)
        await communicator.send_json_to(send("r1", "How large can a file be?"))
        replay = await receive_until(communicator, is_done)

    closed = await Message.objects.aget(reply_to=stored)
    (ack,) = of_type(replay, "chat.ack")
    assert (ack["duplicate"], ack["pending"]) == (True, False)
    assert replay[-1] == {"type": "chat.done", "turn_id": stored.pk, "status": "error", "message_id": closed.pk}
    assert await Message.objects.filter(session=session).acount() == 2


@pytest.mark.parametrize("path_suffix", ["", "?ui=html"])
async def test_an_open_tab_learns_that_a_turn_was_interrupted_when_its_lease_runs_out(ws, alice, settings, path_suffix):
    # A restart killed the worker of a turn whose lease is still fresh when the tab reconnects:
    # nobody sends anything, yet the tab gets the interrupted reply once the lease runs out.
    settings.CHAT_TURN_LEASE_SECONDS = 0.5
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    turn = await sync_to_async(message_make)(session, "user", "How large can a file be?")
    await sync_to_async(lease_make)(turn)
    async with ws(f"/ws/chat/{session.pk}/{path_suffix}", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        received: list[str] = []
        while not any("chat.done" in frame or "Enter sends" in frame for frame in received[1:]):
            received.append(await communicator.receive_from(timeout=TIMEOUT))

    closed = await Message.objects.aget(reply_to=turn)
    assert closed.status == Message.Status.ERROR and content_of(closed).startswith("[Interrupted")
    if path_suffix:
        snapshot, *frames = received
        assert f'id="stream-{turn.pk}"' in snapshot  # "Thinking…" on connect
        assert any(f"delete:#stream-{turn.pk}" in frame for frame in frames)
        assert any("[Interrupted" in frame for frame in frames)
    else:
        events = [json.loads(frame) for frame in received]
        assert [e["type"] for e in events] == ["chat.message", "chat.done"]
        assert events[1] == {"type": "chat.done", "turn_id": turn.pk, "status": "error", "message_id": closed.pk}


async def test_the_interrupted_turn_sweep_runs_once_on_connect_and_once_per_new_turn(ws, alice, monkeypatch):
    sweeps: list[int] = []
    sweep, opening_sweep = leases.turns_interrupted_close, leases.turns_interrupted_close_first_in_flight

    def counted(*, session_id: int, **options: Any) -> list[Message]:
        sweeps.append(session_id)
        return sweep(session_id=session_id, **options)

    def counted_opening(*, session_id: int, **options: Any) -> int | None:
        sweeps.append(session_id)  # a turn opening sweeps here (calling the other only to close some)
        return opening_sweep(session_id=session_id, **options)

    monkeypatch.setattr(leases, "turns_interrupted_close", counted)
    monkeypatch.setattr(leases, "turns_interrupted_close_first_in_flight", counted_opening)
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        assert len(sweeps) == 1  # on connect
        await communicator.send_json_to(send("o1", "How large can a file be?"))
        await receive_until(communicator, is_done)
        assert len(sweeps) == 2  # the turn closes the interrupted turns before it starts; the socket does not
        await communicator.send_json_to({"type": "chat.sync", "after_message_id": 0})
        await receive_until(communicator, lambda e: e["type"] == "chat.history")
        await communicator.send_json_to(send("o1", "How large can a file be?"))  # a finished turn's resend
        await receive_until(communicator, is_done)
    assert sweeps == [session.pk, session.pk]  # no lease ran out: nothing else swept


async def test_stop_closes_a_turn_no_worker_runs_any_more(ws, alice, settings):
    session = await make_session(alice, mode=ChatSession.Mode.QUICK_ANSWER)
    turn = await sync_to_async(message_make)(session, "user", "How large can a file be?")
    await sync_to_async(lease_make)(turn)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        await sync_to_async(lease_make)(turn, age_seconds=settings.CHAT_TURN_LEASE_SECONDS + 1)
        await communicator.send_json_to({"type": "chat.stop"})
        events = await receive_until(communicator, is_done)

    closed = await Message.objects.aget(reply_to=turn)
    assert events[-1] == {"type": "chat.done", "turn_id": turn.pk, "status": "error", "message_id": closed.pk}


async def test_a_live_socket_renews_its_group_and_a_channel_that_stopped_renewing_expires(ws, alice, settings):
    """Group membership expires after ``CHANNEL_GROUP_EXPIRY`` (a worker that died stays in no group for long); a
    connected socket joins again every third of it, so it keeps receiving its chat's events."""
    from channels.layers import get_channel_layer

    from chatapp.realtime.broadcast import RELAY_TYPE, session_group_name

    layer = get_channel_layer()
    settings.CHANNEL_GROUP_EXPIRY = 0.6
    default_expiry, layer.group_expiry = layer.group_expiry, 1
    try:
        session = await make_session(alice)
        group = session_group_name(session.pk)
        dead = await layer.new_channel()
        await layer.group_add(group, dead)  # a socket of a worker that died: it never joins again
        async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
            connected, _ = await communicator.connect(timeout=TIMEOUT)
            assert connected
            await asyncio.sleep(2.5)  # past the expiry, with renewals every 0.2 s
            await layer.group_send(group, {"type": RELAY_TYPE, "event": {"type": "probe.event"}})
            assert await communicator.receive_json_from(timeout=TIMEOUT) == {"type": "probe.event"}
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(layer.receive(dead), timeout=0.5)
    finally:
        layer.group_expiry = default_expiry


# --- rate limits ------------------------------------------------------------------------------------------------


async def test_sends_over_the_owners_rate_limit_are_refused_and_a_resend_is_still_answered(ws, alice, rate_limits):
    rate_limits(send_owner="2/60")
    session = await make_session(alice)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as communicator:
        await communicator.connect(timeout=TIMEOUT)
        for number in (1, 2):
            await communicator.send_json_to(send(f"m{number}", f"Question number {number}?"))
            await receive_until(communicator, is_done)
        await communicator.send_json_to(send("m3", "One question too many?"))
        refused = await communicator.receive_json_from(timeout=TIMEOUT)
        await communicator.send_json_to(send("m1", "Question number 1?"))  # a resend: answered from the store
        replay = await receive_until(communicator, is_done)

    assert refused["type"] == "error" and refused["code"] == "rate_limited" and refused["client_message_id"] == "m3"
    assert 0 < refused["retry_after"] <= 60 and "at most 2 per 60 s" in refused["message"]
    assert replay[0]["type"] == "chat.ack" and replay[0]["duplicate"] is True
    assert [content_of(m) for m in await rows(session) if m.role == "user"] == [
        "Question number 1?",
        "Question number 2?",
    ]


async def test_sends_over_the_address_rate_limit_are_refused_for_every_owner_at_that_address(
    ws, alice, bob, rate_limits
):
    rate_limits(send_address="1/60")
    sessions = [await make_session(alice), await make_session(bob)]
    answers = []
    for owner, session, address in ((alice, sessions[0], "203.0.113.7"), (bob, sessions[1], "203.0.113.7")):
        async with ws(f"/ws/chat/{session.pk}/", cookie=owner.cookie) as communicator:
            communicator.scope["client"] = (address, 50000)  # before the application reads its scope
            await communicator.connect(timeout=TIMEOUT)
            await communicator.send_json_to(send("a1", "Hello from the office?"))
            answers.append(await communicator.receive_json_from(timeout=TIMEOUT))
            if answers[-1]["type"] == "chat.ack":
                await receive_until(communicator, is_done)

    assert answers[0]["type"] == "chat.ack"
    assert answers[1]["code"] == "rate_limited" and "from this address" in answers[1]["message"]
    assert [await Message.objects.filter(session=s).acount() for s in sessions][1] == 0
