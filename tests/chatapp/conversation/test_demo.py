"""The demo walk-through (docs/demo.md, chatapp/conversation/demo.py): every step runs through the
real turn runner and the offline engine; the chat compresses several times, the injected
summarizer outage degrades one compression to the raw archive and the chat recovers, a correction
supersedes a key fact, and the last question recalls a message folded into the summary."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from chatapp.chats.memory import memory_key_of
from chatapp.chats.services import chat_session_delete
from chatapp.conversation.demo import (
    CLIENT_ID_PREFIX,
    DEMO_SCRIPT,
    OUTAGE_STEPS,
    DemoStep,
    demo_run,
    demo_running_sessions,
    demo_start,
    demo_step_seconds,
    demos_wait,
)
from chatapp.llm.offline.faults import OfflineOverrides, offline_overrides_current
from chatapp.models import ChatSession, Message, ModelCall
from memory.models import CompressionEvent, KeyFact
from memory.storage.summaries import session_summary_get
from tests.chatapp.conftest import TIMEOUT, chat_session_make, is_done, receive_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]


@pytest.fixture
def demo_fast(settings) -> None:
    """No thinking time nor pauses; memory jobs start when the demo runs them."""
    settings.DEMO_SECONDS = 0.0
    settings.MEMORY_JOB_DEBOUNCE_MS = 0


def compressions(session: ChatSession) -> list[CompressionEvent]:
    return list(
        CompressionEvent.objects.filter(memory_key=memory_key_of(session.pk), kind="compression").order_by("id")
    )


def step_of(text: str) -> int:
    """The 1-based number of the script step whose message is ``text``."""
    return next(number for number, step in enumerate(DEMO_SCRIPT, 1) if step.text == text)


@pytest.mark.usefixtures("demo_fast")
async def test_the_walk_through_runs_every_step_and_shows_memory_at_work(alice):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.AGENT)
    memory_key = memory_key_of(session.pk)

    outcome = await demo_run(session_id=session.pk)

    # Every step ran through the turn runner: its user message, then a complete final reply.
    assert outcome.status == "complete"
    assert outcome.steps == list(range(1, len(DEMO_SCRIPT) + 1))
    users = [m async for m in Message.objects.filter(session=session, role="user").order_by("id")]
    assert [m.content for m in users] == [step.text for step in DEMO_SCRIPT]
    assert [m.client_message_id for m in users] == [f"{CLIENT_ID_PREFIX}{n}" for n in outcome.steps]
    for user, reply_id in zip(users, outcome.replies, strict=True):
        reply = await Message.objects.aget(pk=reply_id)
        assert reply.reply_to_id == user.pk and reply.status == Message.Status.COMPLETE and reply.content
    # The knowledge-base steps called the search tool (agent mode).
    searches = Message.objects.filter(session=session, role="tool", name="kb_search")
    assert await searches.acount() >= 5

    # Compressions: several successful ones, and the injected outage degraded one to the raw
    # archive after every attempt failed; a later compression recovered with a real summary.
    events = await sync_to_async(compressions)(session)
    ok = [e for e in events if e.result_type == "llm"]
    raw = [e for e in events if e.result_type == "raw"]
    assert len(ok) >= 2 and raw, [(e.pk, e.result_type) for e in events]
    outage = raw[0]
    assert outage.degraded and len(outage.attempts) == 3
    assert all(
        not a["ok"] and "injected summarizer outage (demo walk-through, step" in a["error"] for a in outage.attempts
    )
    outage_steps = {int(a["error"].rsplit("step ", 1)[1].split(")")[0]) for a in outage.attempts}
    assert outage_steps <= OUTAGE_STEPS
    assert any(e.result_type == "llm" and e.pk > outage.pk for e in events)
    assert all(e.result_type == "llm" for e in events if e.pk > raw[-1].pk)
    summary = await sync_to_async(session_summary_get)(memory_key=memory_key)
    assert summary.summary_type == "llm" and summary.last_message_id is not None
    # Only the outage steps' summarizer requests failed.
    assert {e.pk for e in raw} == {e.pk for e in events if any("injected" in a.get("error", "") for a in e.attempts)}

    # Key facts: the early facts are pinned, the correction superseded the old address.
    facts = [f async for f in KeyFact.objects.filter(memory_key=memory_key).order_by("id")]
    active = {(f.key, f.value) for f in facts if f.invalidated_at is None}
    assert {("user_id", "ACC-7731"), ("amount", "240 euros"), ("date", "14 March 2027")} <= active
    assert ("name", "Ada Byron") in active and ("shipping_address", "48 Birch Lane") in active
    assert any(f.key == "preference" and "email" in f.value for f in facts if f.invalidated_at is None)
    old, new = (next(f for f in facts if f.value == value) for value in ("12 Elm Road", "48 Birch Lane"))
    assert old.invalidated_at is not None and old.superseded_by_id == new.pk

    calls = {c.reply_to_id: c async for c in ModelCall.objects.filter(session=session, step=1).order_by("id")}
    by_step = {step_of(u.content or ""): u for u in users}

    # Compression keeps recent turns verbatim: the first request after each compression retains at least two
    # whole earlier turns (docs/memory.md §7; before, every compression kept none at the offline engine's window).
    boundaries = [e.boundary_after for e in events]
    after_each = [next(c for c in calls.values() if c.context["summary"]["last_message_id"] == b) for b in boundaries]
    for call in after_each:
        sources, messages = call.context["sources"], call.context["messages"]
        earlier = [m for m, s in zip(messages, sources, strict=True) if s["kind"] == "history" and m["role"] == "user"]
        assert len(earlier) >= 2, (call.reply_to_id, [s["kind"] for s in sources])

    # "What is my account id?": its source message is folded into the summary, so the id comes
    # from the key-facts block (and the summary), not from a retained message.
    question = by_step[step_of("What is my account id?")]
    context = calls[question.pk].context
    kinds = [source["kind"] for source in context["sources"]]
    blocks = dict(zip(kinds, context["messages"], strict=True))
    assert "ACC-7731" in blocks["facts"]["content"] and context["summary"]["last_message_id"] >= users[0].pk
    retained = [m for m, kind in zip(context["messages"], kinds, strict=True) if kind == "history"]
    assert not any("ACC-7731" in str(m.get("content")) for m in retained)
    answer = await Message.objects.aget(reply_to=question, role="assistant", tool_calls__isnull=True)
    assert "ACC-7731" in (answer.content or "")
    # The corrected address is the one answered (the offline engine reads the key-facts block).
    asked = by_step[step_of("What is my shipping address?")]
    address = await Message.objects.aget(reply_to=asked, role="assistant", tool_calls__isnull=True)
    assert "48 Birch Lane" in (address.content or "")

    # The last question recalls the early message about the laptop, summarized by then.
    said = by_step[step_of("My old laptop is a ThinkPad called Falcon and it keeps the tax folder in sync.")]
    last = calls[users[-1].pk].context
    recalled = [item for item in last["recall"]["items"] if said.pk in item["message_ids"]]
    assert recalled and recalled[0]["text"] == said.content
    assert last["summary"]["last_message_id"] >= said.pk
    assert any(source["kind"] == "recall" and said.pk in source.get("message_ids", []) for source in last["sources"])


def is_turn_started(event: dict) -> bool:
    return event["type"] == "chat.turn" and event["status"] == "started"


async def test_the_stop_button_ends_the_demo(ws, alice, settings):
    settings.DEMO_SECONDS = 400.0  # 12 s of thinking per step: the stop comes first
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.AGENT)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as tab:
        connected, _ = await tab.connect(timeout=TIMEOUT)
        assert connected
        task = demo_start(session_id=session.pk)
        assert task is not None and session.pk in demo_running_sessions()
        await receive_until(tab, is_turn_started)
        await tab.send_json_to({"type": "chat.stop"})
        events = await receive_until(tab, is_done)
        async with asyncio.timeout(10):
            outcome = await task

    assert events[-1]["status"] == "stopped"
    assert outcome.status == "stopped" and outcome.steps == [1]
    reply = await Message.objects.aget(pk=outcome.replies[0])
    assert reply.status == Message.Status.STOPPED
    assert await Message.objects.filter(session=session, role="user").acount() == 1
    assert session.pk not in demo_running_sessions()


async def test_a_second_start_in_the_same_chat_starts_nothing(ws, alice, settings):
    settings.DEMO_SECONDS = 400.0
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.AGENT)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as tab:
        connected, _ = await tab.connect(timeout=TIMEOUT)
        assert connected
        first = demo_start(session_id=session.pk)
        second = demo_start(session_id=session.pk)
        await receive_until(tab, is_turn_started)
        await tab.send_json_to({"type": "chat.stop"})
        async with asyncio.timeout(10):
            await demos_wait()

    assert first is not None and second is None
    assert await Message.objects.filter(session=session, role="user").acount() == 1


async def test_deleting_the_chat_ends_the_demo_and_leaves_nothing(ws, alice, settings):
    settings.DEMO_SECONDS = 400.0
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.AGENT)
    async with ws(f"/ws/chat/{session.pk}/", cookie=alice.cookie) as tab:
        connected, _ = await tab.connect(timeout=TIMEOUT)
        assert connected
        task = demo_start(session_id=session.pk)
        assert task is not None
        await receive_until(tab, is_turn_started)  # the first step's turn is thinking
        await sync_to_async(chat_session_delete)(session=session)
        async with asyncio.timeout(10):
            outcome = await task

    assert outcome.status == "deleted" and outcome.steps == []
    assert not await ChatSession.objects.filter(pk=session.pk).aexists()
    assert not await Message.objects.filter(session_id=session.pk).aexists()
    assert not await CompressionEvent.objects.filter(memory_key=memory_key_of(session.pk)).aexists()


@pytest.mark.usefixtures("demo_fast")
async def test_a_short_script_runs_in_order_without_an_outage_outside_its_steps(alice):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    script = (DemoStep(text="My name is Ada.", shows="a name"), DemoStep(text="Is my data encrypted?", shows="kb"))

    outcome = await demo_run(session_id=session.pk, script=script)

    assert outcome.status == "complete" and outcome.steps == [1, 2]
    assert offline_overrides_current() == OfflineOverrides()
    texts = [m.content async for m in Message.objects.filter(session=session, role="user").order_by("id")]
    assert texts == [step.text for step in script]


@pytest.mark.usefixtures("demo_fast")
async def test_a_step_already_stored_in_the_chat_is_not_run_again(alice):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    script = (DemoStep(text="My name is Ada.", shows="a name"),)
    first = await demo_run(session_id=session.pk, script=script)

    again = await demo_run(session_id=session.pk, script=script)

    assert first.steps == [1] and again.steps == [] and again.status == "complete"
    assert await Message.objects.filter(session=session).acount() == 2


def test_the_script_fits_its_promises():
    """Facts early, the outage in the middle, the questions about early facts last."""
    texts = [step.text for step in DEMO_SCRIPT]
    assert "ACC-7731" in texts[0]
    assert min(OUTAGE_STEPS) > 5 and max(OUTAGE_STEPS) < len(DEMO_SCRIPT) - 3
    assert texts[-3] == "What is my account id?"
    assert all(text.endswith("?") for text in texts[-3:])


def test_demo_seconds_are_spread_over_the_steps(settings):
    settings.DEMO_SECONDS = 40.0
    thinking, pause = demo_step_seconds()
    assert thinking + pause == pytest.approx(40.0 / len(DEMO_SCRIPT))
    assert thinking > pause > 0
