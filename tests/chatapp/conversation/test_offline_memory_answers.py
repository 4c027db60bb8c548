"""The offline engine through the real turn runner (docs/memory.md §6, §10): a newcomer's first
chat shows memory working. Twenty turns after "My name is Ada, account ACC-7731." the chat has
compressed at the offline 2,048-token window, and "What is my account id?" is answered from the
key-facts block of the request, not from a retained message. Knowledge-base questions are
answered from the passage that answers them: quick-answer from the retrieved passages, the
agent by calling ``kb_search`` itself for a question without any "search" prefix."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.conversation.runner import chat_turn_run
from chatapp.models import ChatSession, Message, ModelCall
from memory.storage.summaries import session_summary_get
from tests.chatapp.conftest import chat_session_make, message_make

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]

INTRODUCTION = "Hi! My name is Ada, account ACC-7731."
# What a newcomer asks and tells in a first chat with the demo knowledge base.
NEWCOMER = [
    "How much storage does the Free plan include?",
    "I work at a small design studio with four people.",
    "What does the Team plan cost?",
    "We mostly share large video files with clients.",
    "How long are shared links valid?",
    "What happens after 10 failed sign-in attempts?",
    "Our studio is in Lisbon and we travel a lot.",
    "What is the largest file on paid plans?",
    "Which error code means a conflicting copy?",
    "How often does the desktop client check for changes?",
    "We would like to keep old versions for a year.",
    "How long is version history kept on the Team plan?",
    "Where are the data centres?",
    "What are the API rate limits?",
    "Can I change the region later?",
    "I prefer answers with exact numbers.",
    "How are files split for syncing?",
    "Which error code means a folder holds too many files?",
    "Thanks, that helps.",
]


async def turn(session: ChatSession, text: str) -> tuple[Message, Message]:
    """One turn through the runner, then the session's memory job (extraction, indexing,
    pre-compression), run to completion so the next turn is deterministic."""
    question = await sync_to_async(message_make)(session, "user", text)
    reply = await chat_turn_run(session_id=session.pk, user_message_id=question.pk)
    await memory_engine().run_jobs(memory_key_of(session.pk))
    assert reply.status == Message.Status.COMPLETE, reply.content
    return question, reply


async def after(question: Message) -> list[Message]:
    """The messages the turn of ``question`` stored, in order."""
    return [m async for m in Message.objects.filter(session_id=question.session_id, id__gt=question.pk).order_by("id")]


@pytest.mark.parametrize("mode", [ChatSession.Mode.QUICK_ANSWER, ChatSession.Mode.AGENT])
async def test_the_account_id_given_twenty_turns_earlier_is_answered_from_the_key_facts(alice, settings, mode):
    settings.LLM_CHAT_CONTEXT_WINDOW = 2048  # the offline engine's default window
    session = await sync_to_async(chat_session_make)(alice.owner, mode=mode)

    _, noted = await turn(session, INTRODUCTION)
    for text in NEWCOMER:
        await turn(session, text)
    question, reply = await turn(session, "What is my account id?")

    assert noted.content == "Noted: your name is Ada, account ACC-7731."
    summary = await sync_to_async(session_summary_get)(memory_key=memory_key_of(session.pk))
    assert summary.last_message_id is not None and summary.last_message_id > noted.pk, "compressed past it"
    call = await ModelCall.objects.aget(reply_to=question, step=1)
    request = list(zip(call.context["sources"], call.context["messages"], strict=True))
    retained = [message for source, message in request if source["kind"] in ("history", "current")]
    assert retained and not any("ACC-7731" in (message.get("content") or "") for message in retained)
    (facts,) = [message for source, message in request if source["kind"] == "facts"]
    assert "ACC-7731" in facts["content"]
    assert reply.content == "Your account id is ACC-7731 (from the key facts)."
    assert [m.pk for m in await after(question)] == [reply.pk], "answered from the request, no tool call"

    await turn(session, "Sorry, my name is Joan.")
    _, corrected = await turn(session, "What's my name?")
    assert corrected.content == "Your name is Joan (from the key facts; it replaces Ada)."


async def test_quick_answer_answers_is_my_data_encrypted_from_the_retrieved_passage(alice):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)

    _, reply = await turn(session, "Is my data encrypted?")

    assert (reply.content or "").startswith(
        "From the knowledge base (Kestrel Sync security and privacy › Encryption): “Files are encrypted in transit "
        "with TLS 1.3 and at rest with AES-256.”"
    )


async def test_the_agent_calls_kb_search_for_an_unprefixed_question_and_answers_from_the_passage(alice):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.AGENT)

    question, reply = await turn(session, "Is my data encrypted?")

    call, result, final = await after(question)
    (tool_call,) = call.tool_calls or []
    assert tool_call["function"]["name"] == "kb_search"
    assert json.loads(tool_call["function"]["arguments"]) == {"query": "Is my data encrypted"}
    assert result.role == "tool" and result.tool_call_id == tool_call["id"] and "AES-256" in (result.content or "")
    assert final.pk == reply.pk and (reply.content or "").startswith(
        "From the knowledge base (Kestrel Sync security and privacy › Encryption): “Files are encrypted"
    )
    steps = [c.step async for c in ModelCall.objects.filter(reply_to=question).order_by("step")]
    assert steps == [1, 2], "the tool chain is in the inspector: one call to search, one to answer"


@pytest.mark.parametrize(
    ("mode", "expected", "stored"),
    [
        (ChatSession.Mode.QUICK_ANSWER, "I don't find anything about “capital peru” in my current context.", 1),
        (
            ChatSession.Mode.AGENT,
            "I don't find anything about “capital peru” in my current context or in the knowledge base.",
            3,
        ),
    ],
)
async def test_a_question_nothing_answers_gets_an_honest_not_found(alice, mode: Any, expected: str, stored: int):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=mode)

    question, reply = await turn(session, "What is the capital of Peru?")

    assert reply.content == expected
    assert len(await after(question)) == stored, "the agent searched first; quick-answer answered once"


# The agent answers from its context only when the context covers the question; a passage an
# earlier search brought in that shares a word or two with a new question is no answer to it.
# (question, section, sentence, whether the agent must search: the last may be answered by a
# pricing passage an earlier search brought in, which depends on the database's ranking: SQLite's
# bm25() brings the Free plan in with the Team plan, PostgreSQL's ts_rank_cd does not.)
PRICING_QUESTIONS = [
    ("What is the Team plan price?", "Team plan", "Team plan price: 12 euros per user per month", True),
    ("How much does the Personal plan cost?", "Personal plan", "Personal plan price: 6 euros per month", True),
    ("Is there a free plan?", "Free plan", "Free plan price: 0 euros.", False),
]


@pytest.mark.parametrize("mode", [ChatSession.Mode.AGENT, ChatSession.Mode.QUICK_ANSWER])
async def test_pricing_questions_after_a_question_on_deleted_files_get_the_pricing_passage(alice, mode):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=mode)
    _, trash = await turn(session, "How long do deleted files stay in the trash?")
    assert "Deleted files stay in the trash for 30 days" in (trash.content or "")

    for text, section, sentence, searches in PRICING_QUESTIONS:
        question, reply = await turn(session, text)

        assert (reply.content or "").startswith(
            f"From the knowledge base (Kestrel Sync plans and pricing › {section}): “{sentence}"
        ), (text, reply.content)
        stored = await after(question)
        if mode == ChatSession.Mode.AGENT and (searches or len(stored) > 1):
            call, result, final = stored
            (tool_call,) = call.tool_calls or []
            assert result.role == "tool" and result.tool_call_id == tool_call["id"]
            assert tool_call["function"]["name"] == "kb_search", "searched, not answered from the old passage"
            assert json.loads(tool_call["function"]["arguments"]) == {"query": text.rstrip("?")}
            assert final.pk == reply.pk
        else:
            assert [m.pk for m in stored] == [reply.pk]


@pytest.mark.parametrize("mode", [ChatSession.Mode.AGENT, ChatSession.Mode.QUICK_ANSWER])
async def test_what_encryption_do_you_use_is_answered_from_the_security_passage(alice, mode):
    session = await sync_to_async(chat_session_make)(alice.owner, mode=mode)

    _, reply = await turn(session, "What encryption do you use?")

    assert (reply.content or "").startswith(
        "From the knowledge base (Kestrel Sync security and privacy › Encryption): “Files are encrypted in transit "
        "with TLS 1.3 and at rest with AES-256.”"
    ), reply.content


@pytest.mark.parametrize("mode", [ChatSession.Mode.QUICK_ANSWER, ChatSession.Mode.AGENT])
async def test_when_did_i_pay_is_answered_with_the_date_and_how_much_with_the_amount(alice, settings, mode):
    settings.LLM_CHAT_CONTEXT_WINDOW = 2048  # the offline engine's default window
    session = await sync_to_async(chat_session_make)(alice.owner, mode=mode)

    _, noted = await turn(session, "I paid 75 dollars on 3 April 2026.")
    for text in NEWCOMER:
        await turn(session, text)
    question, when = await turn(session, "When did I pay?")
    _, how_much = await turn(session, "How much did I pay?")

    summary = await sync_to_async(session_summary_get)(memory_key=memory_key_of(session.pk))
    assert summary.last_message_id is not None and summary.last_message_id > noted.pk, "compressed past it"
    call = await ModelCall.objects.aget(reply_to=question, step=1)
    kinds = [source["kind"] for source in call.context["sources"]]
    assert "facts" in kinds
    assert when.content == "Your date is 3 April 2026 (from the key facts; said together with 75 dollars)."
    assert how_much.content == "Your amount is 75 dollars (from the key facts)."
    stored = [m.pk for m in await after(question) if m.pk <= when.pk]
    assert stored == [when.pk], "answered from the request, no tool call"
