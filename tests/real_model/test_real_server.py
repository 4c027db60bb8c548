"""A short scripted chat against a real OpenAI-compatible server (``make real-model`` starts llama.cpp's server,
llama-cpp-python's build, with SmolLM2-135M-Instruct; docs/configuration.md "Per server"): an agent turn offered
the calculator, quick-answer turns past a small window so the summarizer runs, and the memory job's LLM key-fact
extraction. It fails on any protocol error (an HTTP error, a malformed or empty body, a lost connection, a
timeout) on any of these paths; what the small model writes is printed, not judged. Skipped unless
``REAL_LLM_BASE_URL`` names the server (``REAL_LLM_MODEL``: the model name sent, default ``smollm2``)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chatapp.chats.memory import memory_engine
from chatapp.conversation.runner import chat_turn_run
from chatapp.llm.clients import refused_shapes_forget
from chatapp.models import ChatSession, Message, ModelCall
from chatapp.realtime.protocol import ErrorEvent
from memory.models import CompressionEvent
from tests.chatapp.conftest import chat_session_make, message_make

BASE_URL = os.environ.get("REAL_LLM_BASE_URL", "")

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(not BASE_URL, reason="REAL_LLM_BASE_URL is not set: run `make real-model`"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("demo_kb", "db_connections_closed"),
    pytest.mark.timeout(1800),
]

# About 150 tokens per message with its fact: five of them cross the trigger of the 1,536-token window whatever the
# model answers, so the summarizer runs however short its replies are.
FILLER = 3 * (
    "I am planning a long trip next spring and I keep a travel journal with notes about trains, hotels, museums, "
    "food and the weather in every city, so please keep track of what I tell you as we go along. "
)
TURNS = [
    f"Hi, my name is Ada Lovelace and my account id is ACC-7731. {FILLER}",
    f"I live at 12 Baker Street in London and my phone number is +44 20 7946 0958. {FILLER}",
    f"My favourite food is ramen and I am allergic to penicillin. {FILLER}",
    f"My booking reference for the Paris hotel is ZFA04Y, for three nights in April. {FILLER}",
    f"I would rather take the train than fly whenever the trip is under six hours. {FILLER}",
    "What is my account id?",
]


@pytest.fixture
def real_server(settings: Any) -> str:
    """Every LLM path on the real server: chat, summary and extraction; the bundled embedder stays local."""
    model = os.environ.get("REAL_LLM_MODEL", "smollm2")
    settings.LLM_CHAT_BASE_URL = settings.LLM_SUMMARY_BASE_URL = BASE_URL
    settings.LLM_CHAT_MODEL = settings.LLM_SUMMARY_MODEL = model
    settings.LLM_FAILOVER_MODEL = ""
    settings.LLM_CHAT_MAX_OUTPUT_TOKENS = 96
    settings.LLM_CHAT_TIMEOUT = settings.LLM_SUMMARY_TIMEOUT = 300.0
    settings.LLM_MAX_CONCURRENCY = None  # the default: one request at a time to a server on this machine
    settings.MEMORY_SUMMARY_ROLE = "user"
    settings.LLM_STRICT_ALTERNATION = True
    refused_shapes_forget()
    return model


async def turn(session: ChatSession, text: str) -> Message:
    question = await sync_to_async(message_make)(session, "user", text)
    return await chat_turn_run(session_id=session.pk, user_message_id=question.pk)


def protocol_failures(errors: list[ErrorEvent]) -> list[str]:
    """The turns' error events but an empty reply (``llm_empty``: what a small model may write, not the protocol)."""
    return [f"{event.code}: {event.message}" for event in errors if event.code != "llm_empty"]


def protocol_errors(attempts: list[dict[str, Any]]) -> list[str]:
    """Attempt errors that are the endpoint's (``LLMError``), not the model's writing (cut off, empty, unparsable)."""
    return [str(attempt.get("error")) for attempt in attempts if str(attempt.get("error") or "").startswith("LLMError")]


async def test_an_agent_turn_with_the_calculator_has_no_protocol_error(alice, real_server, errors_sent, settings):
    settings.LLM_CHAT_CONTEXT_WINDOW = 8192
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.AGENT)

    reply = await turn(session, "What is 17 x 23? Use the calculator tool.")

    calls = [call async for call in ModelCall.objects.filter(session=session).order_by("id")]
    tool_results = await Message.objects.filter(session=session, role=Message.Role.TOOL).acount()
    print(
        f"agent: {len(calls)} model calls, {tool_results} tool results, {reply.status}: {(reply.content or '')[:120]!r}"
    )
    assert protocol_failures(errors_sent) == []
    assert reply.status in (Message.Status.COMPLETE, Message.Status.CUT_OFF) or errors_sent
    assert calls


async def test_turns_past_a_small_window_compress_and_extract_facts_with_no_protocol_error(
    alice, real_server, errors_sent, settings
):
    settings.LLM_CHAT_CONTEXT_WINDOW = 1536
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)

    replies = [await turn(session, text) for text in TURNS]
    run = await memory_engine().run_jobs(str(session.pk))

    events = [event async for event in CompressionEvent.objects.filter(memory_key=str(session.pk)).order_by("id")]
    attempts = [attempt for event in events for attempt in event.attempts]
    job_errors = [attempt.error for attempt in (run.attempts if run else ()) if attempt.error]
    print(
        f"turns: {[reply.status for reply in replies]}; compressions: {[event.result_type for event in events]}; "
        f"summary attempts: {len(attempts)} ({sum(not a.get('ok') for a in attempts)} failed); job errors: {job_errors}"
    )
    assert protocol_failures(errors_sent) == []
    answered = [reply for reply in replies if reply.status in (Message.Status.COMPLETE, Message.Status.CUT_OFF)]
    assert len(answered) + len(errors_sent) == len(replies)
    assert events, "the small window never compressed"
    assert protocol_errors(attempts) == []
    assert run is not None and [error for error in job_errors if error.startswith("LLMError")] == []
