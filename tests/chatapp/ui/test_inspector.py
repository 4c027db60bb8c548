"""The inspector's reads: figures come from the ModelCall snapshot and the memory app's records,
never from a second estimate; degradation shows as raw archive with every failed attempt."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.urls import reverse

from chatapp.conversation.compress import session_memory_compress
from chatapp.conversation.runner import chat_turn_run
from chatapp.models import ChatSession, Message, ModelCall
from chatapp.ui.inspector.attempts import error_text
from chatapp.ui.inspector.marks import MarkBasis
from chatapp.ui.inspector.request import messages_text
from chatapp.ui.inspector.state import inspector_state_get
from tests.chatapp.conftest import Visitor, chat_session_make, message_make

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]


def test_before_any_request_the_inspector_is_idle(alice: Visitor):
    state = inspector_state_get(session_id=chat_session_make(alice.owner).pk)
    assert state.request is None and state.timeline == [] and state.summary.version == 0
    assert state.health.status == "idle" and state.basis == MarkBasis()


def test_the_last_request_is_shown_exactly_as_recorded(alice: Visitor):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.AGENT)
    question = message_make(session, "user", "search the knowledge base for Team plan price")
    async_to_sync(chat_turn_run)(session_id=session.pk, user_message_id=question.pk)
    call = ModelCall.objects.filter(session=session).latest("id")
    request = inspector_state_get(session_id=session.pk).request

    assert request is not None and request.model_call_id == call.pk and request.step == 2
    assert request.gauge.used == call.context["tokens"] == call.estimated_tokens
    assert (request.gauge.trigger_tokens, request.gauge.target_tokens) == (2048, 1228)
    sections = {s.key: s for s in request.sections}
    for key in ("system", "summary", "retained", "current", "tools"):
        assert sections[key].tokens == call.context["sections"][key]
    assert sum(s.tokens for s in request.sections) == request.gauge.context_window == 4096
    assert sections["overhead"].tokens == 3 and sections["free"].tokens == 4096 - call.estimated_tokens
    assert sections["current"].text == messages_text(call.context["messages"][1:])
    assert '"name": "kb_search"' in sections["tools"].text  # the schemas stored with the call
    assert call.prompt_tokens is not None and request.prompt_tokens == call.prompt_tokens
    assert request.prompt_tokens_difference == call.prompt_tokens - call.estimated_tokens
    replies = list(question.replies.order_by("id"))  # tool call, tool result, final answer
    assert request.current_ids == {question.pk, replies[0].pk, replies[1].pk} and request.history_ids == set()


def test_a_failing_summarizer_shows_as_raw_archive_with_every_attempt(alice: Visitor, settings):
    settings.OFFLINE_FAIL_SUMMARY = True
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    for i in range(3):
        user = message_make(session, "user", f"Fact {i}: locker {i} is {1000 + i}.")
        message_make(session, "assistant", "Noted.", reply_to=user)
    message_make(session, "user", "Which code has locker 0?")
    async_to_sync(session_memory_compress)(session_id=session.pk)
    state = inspector_state_get(session_id=session.pk)

    assert state.health.status == "raw_archive" and state.health.label == "raw archive"
    assert "OFFLINE_FAIL_SUMMARY" in state.health.last_error and state.health.failed_attempts == 3
    assert state.summary.summary_type == "raw" and state.summary.type_label == "raw archive"
    (event,) = state.timeline
    assert event.kind == "compression" and event.degraded and event.messages_summarized == 6
    assert [(a["phase"], a["number"], a["ok"]) for a in event.attempts] == [("primary", n, False) for n in (1, 2, 3)]
    (version,) = state.summary.versions
    assert version.version == 1 and version.result_label == "raw archive" and "- User: Fact 0" in version.content
    # The stored error names the engine twice (ours, then the engine's own message): shown once.
    assert "HTTP 500: offline engine: " in event.attempts[0]["error"]
    (error,) = event.attempt_log.errors
    assert error.count == 3
    assert error.text == event.attempts[0]["error"].replace("HTTP 500: offline engine: ", "HTTP 500: ")


def test_an_error_names_the_engine_once():
    assert error_text("The offline engine failed with HTTP 500: offline engine: injected outage.") == (
        "The offline engine failed with HTTP 500: injected outage."
    )
    assert error_text("LLMError: The offline engine reported an error: Offline engine: busy.") == (
        "LLMError: The offline engine reported an error: busy."
    )
    for unchanged in (
        "The model endpoint at http://127.0.0.1:9/v1 failed with HTTP 500: model crashed.",
        "The offline engine did not answer within 5 s.",
        "The offline engine failed with HTTP 500: the engine: no route.",
        "",
    ):
        assert error_text(unchanged) == unchanged


def test_compress_now_is_offered_only_when_there_is_something_to_fold(alice: Visitor):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    page = reverse("session-detail", kwargs={"session_id": session.pk})

    def offered() -> bool:
        state = inspector_state_get(session_id=session.pk).can_compress
        html = alice.client.get(page).content.decode()
        assert ('id="compress-now" aria-describedby="compress-hint" disabled' in html) is not state
        return state

    assert not offered()  # an empty chat
    first = message_make(session, "user", "Fact 0: locker 0 is 1000.")
    assert not offered()  # nothing before the newest question
    message_make(session, "assistant", "Noted.", reply_to=first)
    assert not offered()
    message_make(session, "user", "Which code has locker 0?")
    assert offered()
    async_to_sync(session_memory_compress)(session_id=session.pk)
    assert not offered()  # all folded: nothing left before the newest question


def test_each_summary_version_says_what_it_folded_in_and_how_the_summary_grew(alice: Visitor):
    session = chat_session_make(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    for round_number in range(2):
        for i in range(2):
            user = message_make(session, "user", f"Round {round_number} fact {i}: locker {i} is {1000 + i}.")
            message_make(session, "assistant", "Noted.", reply_to=user)
        message_make(session, "user", "Which code has locker 0?")
        async_to_sync(session_memory_compress)(session_id=session.pk)
    newer, older = inspector_state_get(session_id=session.pk).summary.versions

    assert (newer.version, older.version) == (2, 1)
    assert older.previous_chars == 0 and newer.previous_chars == len(older.content) > 0
    assert older.boundary_after is not None and newer.boundary_after is not None
    assert newer.boundary_before == older.boundary_after < newer.boundary_after
    for version in (older, newer):
        folded = session.messages.filter(id__gt=version.boundary_before or 0, id__lte=version.boundary_after)
        # Compress now closed the unanswered question of round 0 with an app-written note, which is
        # never summarized (docs/memory.md F-37).
        folded = folded.exclude(origin=Message.Origin.APP)
        assert version.messages_summarized == folded.count() >= 4
