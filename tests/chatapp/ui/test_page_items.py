"""The chat page as a newcomer reads it: every bubble carries its
memory mark, the newest reply included; the gauge says its level and its marks in words; a
degraded compression lists its attempts and backoff waits, adding up to its duration, with each
error once; the summary type says who wrote it; the composer counts the message being typed
against the room the context window leaves for it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import reverse

from chatapp.chats.memory import memory_engine, next_request_of_mode
from chatapp.conversation.compress import session_memory_compress
from chatapp.conversation.runner import chat_turn_run
from chatapp.models import ChatSession, Message, ModelCall
from chatapp.realtime.protocol import ChatDoneEvent, ChatMessageEvent, MemoryCompressionEvent
from chatapp.ui.composer import composer_count_get
from chatapp.ui.inspector.attempts import attempt_log_build, error_text
from chatapp.ui.inspector.gauge import Gauge
from chatapp.ui.inspector.marks import MARK_NEXT, MarkBasis
from chatapp.ui.inspector.state import inspector_state_get
from chatapp.ui.page_feed import PageFeed, compression_sentence
from memory.api import get_counter
from memory.summary.archive import summary_block
from memory.summary.chain import summary_kind
from tests.chatapp.conftest import Visitor, chat_session_make, message_make

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]

HTMX = {"HX-Request": "true"}


def url(name: str, session: ChatSession) -> str:
    return reverse(name, kwargs={"session_id": session.pk})


def page_of(visitor: Visitor, session: ChatSession) -> str:
    return visitor.client.get(url("session-detail", session)).content.decode()


def marks_in(html: str) -> dict[int, str]:
    return {int(i): mark for i, mark in re.findall(r'id="mark-(\d+)" class="mark" data-mark="([\w-]*)"', html)}


def history_make(session: ChatSession, pairs: int) -> None:
    for i in range(pairs):
        user = message_make(session, "user", f"Fact {i}: locker {i} has code {1000 + i}.")
        message_make(session, "assistant", f"Noted, locker {i} is {1000 + i}.", reply_to=user)


# --- 4a: the newest reply has its mark like every other bubble ---------------------------------


def test_a_message_newer_than_the_last_request_is_marked_for_the_next_one():
    basis = MarkBasis(boundary=3, history_ids=frozenset({4, 5}), current_ids=frozenset({6, 7}))
    assert [basis.mark(i) for i in (1, 3, 4, 6, 7, 8, 20)] == [
        "summarized",
        "summarized",
        "retained",
        "current",
        "current",
        MARK_NEXT,
        MARK_NEXT,
    ]
    assert basis.newest_id == 7
    # Before any request and any summary, every message waits for the next request.
    assert MarkBasis().mark(1) == MARK_NEXT
    # An app-written note stays "not sent to the model", however new.
    assert basis.mark_of(9, Message.Origin.APP) == "not-sent"


def test_after_a_turn_every_bubble_has_a_mark_the_reply_too_on_the_socket_and_on_reload(alice: Visitor):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    question = message_make(session, "user", "What does the Team plan cost?")
    async_to_sync(chat_turn_run)(session_id=session.pk, user_message_id=question.pk)
    reply = Message.objects.filter(session=session, role="assistant").latest("id")

    # Reloaded: the question was the request's current turn; the reply, stored after it, goes
    # with the next request. Before this change the reply's mark was empty (and hidden).
    marks = marks_in(page_of(alice, session))
    assert marks == {question.pk: "current", reply.pk: MARK_NEXT}
    assert ">next request</span>" in page_of(alice, session)

    # On the socket: a page that saw the request gets the reply with its mark, and chat.done
    # (which rebuilds the marks from the stored state) leaves it so.
    feed = PageFeed(session_id=session.pk)
    feed.snapshot()
    feed.marks.pop(reply.pk)  # as if the reply had not arrived yet
    html = feed.render(ChatMessageEvent(message=reply.as_dict()))
    assert f'<span id="mark-{reply.pk}" class="mark" data-mark="next">next request</span>' in html
    done = feed.render(ChatDoneEvent(turn_id=question.pk, message_id=reply.pk, status="complete"))
    assert f'id="mark-{reply.pk}"' not in done  # unchanged, so not sent again

    # The next request carries the reply in its retained window: the mark follows.
    follow_up = message_make(session, "user", "And the Business plan?")
    async_to_sync(chat_turn_run)(session_id=session.pk, user_message_id=follow_up.pk)
    marks = marks_in(page_of(alice, session))
    assert marks[reply.pk] == "retained" and marks[follow_up.pk] == "current"
    assert all(marks.values())


# --- 4b: the gauge says its level and its marks in words ----------------------------------------


@pytest.mark.parametrize(
    ("used", "level", "words"),
    [
        (600, "low", "under the target"),
        (700, "mid", "over the target"),
        (1100, "high", "over the trigger"),
        (2100, "over", "over the context window"),
    ],
)
def test_the_gauge_level_is_said_in_words(used: int, level: str, words: str):
    gauge = Gauge(used=used, context_window=2048, trigger_tokens=1024, target_tokens=614)
    assert gauge.level == level and gauge.level_label == words
    assert gauge.value_text == (f"{used:,} of 2,048 tokens, {words}; target 614, trigger 1,024, window 2,048")


def test_the_gauge_labels_its_marks_in_words_and_for_screen_readers(alice: Visitor):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.AGENT)
    question = message_make(session, "user", "search the knowledge base for Team plan price")
    async_to_sync(chat_turn_run)(session_id=session.pk, user_message_id=question.pk)
    used = ModelCall.objects.filter(session=session).latest("id").estimated_tokens
    html = page_of(alice, session)

    level = "under the target" if used <= 1228 else "over the target"
    assert f'aria-valuetext="{used:,} of 4,096 tokens, {level}; target 1,228, trigger 2,048, window 4,096"' in html
    assert f'data-testid="gauge-level">{level}</strong>' in html
    scale = re.search(r'<div class="gauge-scale"[^>]*>(.*?)</div>', html)
    assert scale is not None
    assert re.findall(r">(\w+)</span>", scale.group(1)) == ["target", "trigger", "window"]
    assert "target <strong>1,228</strong>: compression aims below it" in html
    assert "trigger <strong>2,048</strong>: compression starts above it" in html
    assert "window <strong>4,096</strong>: the model's limit" in html


# --- 4c: the degraded state: each error once, the attempts and waits adding up -------------------


def attempt(phase: str, number: int, ms: int, *, ok: bool = False, error: str = "", wait_ms: int = 0) -> dict[str, Any]:
    return {
        "model": "m",
        "phase": phase,
        "number": number,
        "latency_ms": ms,
        "ok": ok,
        "error": error,
        "wait_ms": wait_ms,
    }


def test_the_attempt_log_lists_the_waits_and_adds_up_to_the_duration():
    attempts = [
        attempt("primary", 1, 12, error="RuntimeError: HTTP 500"),
        attempt("primary", 2, 10, error="RuntimeError: HTTP 500", wait_ms=500),
        attempt("primary", 3, 11, error="RuntimeError: HTTP 500", wait_ms=1000),
        attempt("failover", 1, 7, error="TimeoutError: summarizer did not answer in time"),
        attempt("failover", 2, 9, ok=True, wait_ms=500),
    ]
    log = attempt_log_build(attempts, duration_ms=2070)

    assert [(e.text, e.count) for e in log.errors] == [
        ("RuntimeError: HTTP 500", 3),
        ("TimeoutError: summarizer did not answer in time", 1),
    ]
    assert (log.tries, log.failed, log.tries_ms, log.waits_ms, log.other_ms) == (5, 4, 49, 2000, 21)
    assert log.total_ms == log.tries_ms + log.waits_ms + log.other_ms == 2070
    primary, failover = log.groups
    assert (primary.phase, failover.phase) == ("primary", "failover")
    assert [(s.kind, s.ms, s.error_index) for s in primary.steps] == [
        ("try", 12, 1),
        ("wait", 500, None),
        ("try", 10, 1),
        ("wait", 1000, None),
        ("try", 11, 1),
    ]
    assert [(s.kind, s.ok, s.error_index) for s in failover.steps] == [
        ("try", False, 2),
        ("wait", True, None),
        ("try", True, None),
    ]


def test_one_error_is_not_numbered_and_a_sum_over_the_duration_is_the_total():
    log = attempt_log_build([attempt("primary", n, 5, error="boom") for n in (1, 2)], duration_ms=0)
    assert [s.error_index for s in log.groups[0].steps] == [None, None]
    assert log.other_ms == 0 and log.total_ms == 10
    # A new chunk's tries start a new group even for the same summarizer.
    chunks = attempt_log_build([attempt("primary", 1, 1, ok=True), attempt("primary", 1, 1, ok=True)], duration_ms=5)
    assert len(chunks.groups) == 2 and chunks.errors == [] and chunks.other_ms == 3


def test_a_degraded_compression_shows_its_error_once_with_every_attempt(alice: Visitor, settings):
    settings.OFFLINE_FAIL_SUMMARY = True
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    history_make(session, 3)
    message_make(session, "user", "Which code has locker 0?")
    async_to_sync(session_memory_compress)(session_id=session.pk)
    state = inspector_state_get(session_id=session.pk)
    (event,) = state.timeline
    assert state.health.event_id == event.id
    html = page_of(alice, session)

    # Once, in the compression event, and naming the engine once (error_text).
    error = state.health.error
    assert "OFFLINE_FAIL_SUMMARY" in error and error == error_text(state.health.last_error) != state.health.last_error
    assert html.count(error) == 1 and "offline engine: " not in html
    assert f"All 3 attempts failed with: {error}" in html
    assert f'<a href="#event-{event.id}" data-testid="health-event">' in html
    assert f'<li id="event-{event.id}"' in html
    assert len(re.findall(r'class="step try failed" data-kind="try">#\d failed [\d,]+\u00a0ms', html)) == 3
    log = event.attempt_log
    assert log.total_ms == max(event.duration_ms, log.tries_ms + log.waits_ms)
    total = (
        f"{log.total_ms:,}\u00a0ms = {log.tries_ms:,}\u00a0ms in 3 attempts + {log.waits_ms:,}\u00a0ms of backoff "
        f"waits + {log.other_ms:,}\u00a0ms"
    )
    assert total in html
    assert f"6 messages</span> archived verbatim (raw archive) · {log.total_ms:,}\u00a0ms</p>" in html


# --- 4d: the summary type says who wrote it --------------------------------------------------------


def test_summary_kind_tells_an_extractive_summary_from_an_llm_one():
    extractive = [{"ok": False, "method": "extractive"}, {"ok": True, "method": "extractive"}]
    assert summary_kind("llm", extractive) == "extractive"
    assert summary_kind("llm", [{"ok": True, "method": "llm"}]) == "llm"
    assert summary_kind("llm", [{"ok": True}]) == "llm"  # recorded before the method was
    assert summary_kind("llm", [{"ok": True, "method": "extractive"}, {"ok": True, "method": "llm"}]) == "llm"
    assert summary_kind("raw", extractive) == "raw" and summary_kind("none", []) == "none"


def test_the_offline_engines_summary_is_called_extractive_everywhere(alice: Visitor):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    history_make(session, 3)
    message_make(session, "user", "Which code has locker 0?")
    events = async_to_sync(session_memory_compress)(session_id=session.pk)
    state = inspector_state_get(session_id=session.pk)

    assert state.summary.summary_type == "llm"  # what the memory app stores is unchanged
    assert state.summary.kind == "extractive" and state.summary.type_label == "extractive summary"
    assert state.summary.versions[0].result_label == "extractive summary"
    assert state.timeline[0].result_label == "extractive summary"
    html = page_of(alice, session)
    assert (
        'data-testid="summary-type" class="summary-type type-extractive" data-kind="extractive">extractive summary<'
        in html
    )
    assert "LLM summary" not in html
    assert "(extractive summary)" in compression_sentence(events[0])
    feed = PageFeed(session_id=session.pk)
    assert "(extractive summary)" in feed.render(
        MemoryCompressionEvent(turn_id=None, step=0, event=events[0].as_dict())
    )


def test_a_summary_from_an_llm_endpoint_is_still_an_llm_summary(alice: Visitor, settings, fake_openai):
    settings.LLM_SUMMARY_BASE_URL = fake_openai.base_url
    settings.LLM_SUMMARY_MODEL = "summarizer-model"
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    history_make(session, 3)
    message_make(session, "user", "Which code has locker 0?")
    async_to_sync(session_memory_compress)(session_id=session.pk)
    state = inspector_state_get(session_id=session.pk)
    assert state.summary.kind == "llm" and state.summary.type_label == "LLM summary"


# --- 6: the composer's token count ----------------------------------------------------------------


def expected_room(session: ChatSession, *, facts_tokens: int = 0) -> int:
    """The room by the rule of chatapp.ui.composer, recomputed from its parts."""
    engine = memory_engine()
    budget, counter = engine.budget, engine.counter
    system, tools, reserve_share = next_request_of_mode(session.mode)
    passages = int(budget.target_tokens * reserve_share)
    fixed = counter.count_request([{"role": "system", "content": system}], tools) + passages
    summary = budget.summary_reserve_tokens if session.messages.exists() else 0
    return budget.window_tokens - fixed - summary - facts_tokens - budget.recall_budget_tokens


def test_the_composer_counts_with_the_model_tokenizer_against_the_room_left(alice: Visitor):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.AGENT)
    counter = get_counter("offline-engine")
    empty = composer_count_get(session=session, text="")
    assert empty.state == "empty" and empty.tokens is None and empty.room == expected_room(session)
    assert empty.context_window == 4096 and 0 < empty.room < 4096

    text = "What does the Team plan cost? 团队版多少钱？"
    count = composer_count_get(session=session, text=text)
    assert count.tokens == counter.count_message({"role": "user", "content": text})
    assert count.state == "ok" and count.room == empty.room

    # The agent's tool schemas take room that quick-answer gives to its passages instead.
    session.mode = ChatSession.Mode.QUICK_ANSWER
    assert composer_count_get(session=session, text=text).room == expected_room(session)


def test_a_message_over_the_room_or_the_character_limit_is_flagged(alice: Visitor, settings):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    room = composer_count_get(session=session, text="").room
    big = "团" * (room + 10)  # at least one token per character, under the character limit
    assert len(big) <= settings.CHAT_MAX_MESSAGE_CHARS
    over = composer_count_get(session=session, text=big)
    assert over.state == "over_window" and over.tokens is not None and over.tokens > over.room
    settings.CHAT_MAX_MESSAGE_CHARS = 20
    too_long = composer_count_get(session=session, text="x" * 21)
    assert too_long.state == "over_chars" and too_long.tokens is None  # not even counted


def test_the_composer_says_what_an_oversized_message_breaks(alice: Visitor, settings):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    room = composer_count_get(session=session, text="").room
    big = "团" * (room + 10)
    tokens = composer_count_get(session=session, text=big).tokens
    html = alice.client.post(url("session-composer-count", session), {"text": big}, headers=HTMX).content.decode()
    assert 'data-state="over_window"' in html
    assert (
        f'<strong data-testid="composer-tokens">{tokens:,}&nbsp;tokens</strong>: more than the <span class="nowrap">'
        f'<span data-testid="composer-room">{room:,}</span> tokens</span> this chat\'s context window leaves for a '
        "message, so it would probably be refused as too large." in html
    )
    settings.CHAT_MAX_MESSAGE_CHARS = 8000
    html = alice.client.post(
        url("session-composer-count", session), {"text": "x" * 8001}, headers=HTMX
    ).content.decode()
    assert 'data-state="over_chars"' in html
    assert (
        '<strong>8,001&nbsp;characters</strong>: more than the <span class="nowrap">8,000 characters</span> a '
        "message may have. Shorten it to send it." in html
    )
    # The page does not cut a longer text silently (no maxlength): the count says it, chat.js
    # disables Send (tests/browser/test_chat_controls_browser.py).
    page = page_of(alice, session)
    assert '<form id="composer" class="composer" data-max-chars="8000">' in page
    assert "maxlength" not in page.split('id="composer-text"', 1)[1].split(">", 1)[0]


def test_the_room_shrinks_with_the_summary_and_the_last_requests_key_facts(alice: Visitor):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    history_make(session, 3)
    message_make(session, "user", "Which code has locker 0?")
    before = composer_count_get(session=session, text="")
    assert before.room == expected_room(session)  # the summary reserve, history being there
    async_to_sync(session_memory_compress)(session_id=session.pk)
    engine = memory_engine()
    stored = inspector_state_get(session_id=session.pk).summary
    block = engine.counter.count_message(
        summary_block(
            content=stored.content,
            summary_type=stored.summary_type,
            compressed_count=stored.compressed_count,
            role=engine.budget.summary_role,
        )
    )
    after = composer_count_get(session=session, text="")
    reserve = engine.budget.summary_reserve_tokens
    assert after.room == before.room - max(0, block - reserve)
    call = ModelCall.objects.create(
        session=session, mode="quick-answer", model="m", estimated_tokens=1, context={"facts": {"tokens": 40}}
    )
    assert composer_count_get(session=session, text="").room == after.room - 40
    call.delete()


def test_the_composer_count_endpoint_renders_the_partial(alice: Visitor):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.AGENT)
    response = alice.client.post(url("session-composer-count", session), {"text": "Hello there"}, headers=HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    tokens = get_counter("offline-engine").count_message({"role": "user", "content": "Hello there"})
    room = composer_count_get(session=session, text="").room
    assert html.lstrip().startswith('<p id="composer-count" class="composer-count" data-state="ok"')
    assert (
        f'data-testid="composer-tokens">{tokens}</strong> of <span class="nowrap"><span data-testid="composer-room">'
        f"{room:,}</span> tokens</span>" in html
    )
    assert 'hx-trigger="input delay:300ms from:#composer-text"' in html
    empty = alice.client.post(url("session-composer-count", session), {}, headers=HTMX).content.decode()
    assert 'data-state="empty"' in empty and "Room for one message" in empty
    # The page itself shows the room before anything is typed.
    assert f'<span data-testid="composer-room">{room:,}</span>' in page_of(alice, session)
    assert alice.client.get(url("session-composer-count", session)).status_code == 405


@pytest.mark.parametrize("owner_kind", ["user", "anonymous"])
def test_the_composer_count_is_404_for_strangers(
    alice: Visitor, bob: Visitor, anon: Visitor, anon2: Visitor, owner_kind: str
):
    owner, others = (alice, [bob, anon]) if owner_kind == "user" else (anon, [anon2, alice])
    session = chat_session_make(owner.owner, title="secret plans")
    for stranger in [*others, None]:
        client = stranger.client if stranger else Client()
        response = client.post(url("session-composer-count", session), {"text": "hi"}, headers=HTMX)
        assert response.status_code == 404 and b"secret" not in response.content
    assert owner.client.post(url("session-composer-count", session), {"text": "hi"}, headers=HTMX).status_code == 200


def test_the_composer_count_needs_the_csrf_token(alice: Visitor):
    session = chat_session_make(alice.owner)
    client = Client(enforce_csrf_checks=True)
    client.cookies = alice.client.cookies
    assert client.post(url("session-composer-count", session), {"text": "hi"}, headers=HTMX).status_code == 403


def test_the_room_is_recounted_when_a_reply_ends_or_the_mode_changes(alice: Visitor):
    session = chat_session_make(alice.owner)
    count_url = url("session-composer-count", session)
    refresh = (
        f'<div id="composer-refresh" hidden hx-swap-oob="true" hx-post="{count_url}" hx-include="#composer-text" '
        'hx-trigger="load" hx-target="#composer-count" hx-swap="outerHTML"></div>'
    )
    # The page holds the (idle) target of the out-of-band refresh.
    assert '<div id="composer-refresh" hidden></div>' in page_of(alice, session)
    feed = PageFeed(session_id=session.pk)
    feed.snapshot()
    assert refresh in feed.render(ChatDoneEvent(turn_id=1, message_id=1, status="complete"))
    response = alice.client.post(url("session-mode", session), {"mode": "quick-answer"}, headers=HTMX)
    assert refresh in response.content.decode()
