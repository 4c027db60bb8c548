"""Whole chat turns and memory jobs against a llama.cpp-like fake server (tests/fake_openai.py):
an agent turn that calls the calculator and sends the call back, a turn whose server drops the
connection before the first token, a reply cut off at the token limit, and key facts extracted
from a server refusing both ``response_format`` types."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chatapp.chats.selectors import CUT_OFF_REPLY_MARKER
from chatapp.conversation.runner import chat_turn_run
from chatapp.models import ChatSession, Message, ModelCall
from tests.chatapp.chats.test_memory_facts import GOOD, extraction, facts_of, job_with, say
from tests.chatapp.conftest import chat_session_make, message_make
from tests.fake_openai import FakeOpenAI, chunk, completion, dropped, stream, text_stream

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]

CALCULATOR_CALL = stream(
    chunk({"role": "assistant", "content": None}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "17*23"}'},
                }
            ]
        }
    ),
    chunk(finish_reason="tool_calls"),
)


@pytest.fixture
def llama_cpp_chat(fake_openai: FakeOpenAI, settings: Any) -> FakeOpenAI:
    """The chat model is the fake server behaving as llama.cpp's (the summarizer stays offline)."""
    settings.LLM_CHAT_BASE_URL = fake_openai.base_url
    settings.LLM_CHAT_MODEL = "fake-model"
    settings.LLM_CHAT_CONTEXT_WINDOW = 32_000
    return fake_openai.llama_cpp()


async def turn_run(owner: Any, mode: str, text: str) -> Message:
    session = await sync_to_async(chat_session_make)(owner.owner, mode=mode)
    question = await sync_to_async(message_make)(session, "user", text)
    return await chat_turn_run(session_id=session.pk, user_message_id=question.pk)


async def test_an_agent_turn_calls_the_calculator_and_sends_the_call_back(alice, llama_cpp_chat, errors_sent):
    llama_cpp_chat.script(CALCULATOR_CALL, text_stream("17 x 23 = 391."))

    reply = await turn_run(alice, ChatSession.Mode.AGENT, "What is 17 x 23?")

    assert (reply.status, reply.content) == (Message.Status.COMPLETE, "17 x 23 = 391.")
    assert errors_sent == []
    first, refused, retried = (recorded.json for recorded in llama_cpp_chat.requests)
    assert first["tool_choice"] == "auto"
    tool_result = retried["messages"][-1]
    assert tool_result["role"] == "tool" and "391" in tool_result["content"]
    # The assistant's tool-call message: null refused with HTTP 500, then sent as "".
    assert [request["messages"][-2]["content"] for request in (refused, retried)] == [None, ""]

    # The call records what the server taught, and the inspector says it in words.
    call = await ModelCall.objects.filter(session_id=reply.session_id).alatest("id")
    assert call.context["calibration"]["usage"] == "not reported"
    assert call.context["calibration"]["adapted"] == ["null_content"]
    page = (await sync_to_async(alice.client.get)(f"/s/{reply.session_id}/")).content.decode()
    assert 'data-testid="server-adapted">Learnt from this server: tool-call messages go with content' in page
    assert "not reported by this server, so calibration cannot learn from it" in page


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_server_gone_before_the_first_token_is_llm_connection(alice, llama_cpp_chat, errors_sent, how):
    llama_cpp_chat.script(dropped(how))

    reply = await turn_run(alice, ChatSession.Mode.QUICK_ANSWER, "Hello?")

    assert reply.status == Message.Status.ERROR
    (error,) = errors_sent
    assert error.code == "llm_connection"
    assert llama_cpp_chat.base_url in error.message and "before the first token" in error.message


@pytest.mark.parametrize("mode", [ChatSession.Mode.QUICK_ANSWER, ChatSession.Mode.AGENT])
async def test_a_reply_cut_off_at_the_token_limit_is_stored_cut_off_and_sent_back_marked(
    alice, llama_cpp_chat, errors_sent, mode
):
    llama_cpp_chat.script(
        text_stream("The three steps are: first, unpack; second,", finish_reason="length"), text_stream("Third: run.")
    )
    session = await sync_to_async(chat_session_make)(alice.owner, mode=mode)
    question = await sync_to_async(message_make)(session, "user", "List the three setup steps.")

    reply = await chat_turn_run(session_id=session.pk, user_message_id=question.pk)

    assert (reply.status, reply.content) == (Message.Status.CUT_OFF, "The three steps are: first, unpack; second,")
    assert errors_sent == []
    more = await sync_to_async(message_make)(session, "user", "Please continue from where your reply was cut off.")
    assert (await chat_turn_run(session_id=session.pk, user_message_id=more.pk)).status == Message.Status.COMPLETE
    sent = llama_cpp_chat.requests[-1].json["messages"]
    assert sent[-2] == {
        "role": "assistant",
        "content": f"The three steps are: first, unpack; second,{CUT_OFF_REPLY_MARKER}",
    }


async def test_a_model_copying_the_cut_off_marker_stores_its_reply_without_it(alice, llama_cpp_chat, errors_sent):
    # A small model repeats what it was sent: the marker after its earlier cut-off reply.
    llama_cpp_chat.script(text_stream(f"Third: run the installer.{CUT_OFF_REPLY_MARKER}"))

    reply = await turn_run(alice, ChatSession.Mode.QUICK_ANSWER, "Please continue.")

    assert (reply.status, reply.content) == (Message.Status.COMPLETE, "Third: run the installer.")
    assert errors_sent == []


async def test_key_facts_come_from_a_server_refusing_both_response_formats(alice, settings, fake_openai):
    settings.LLM_SUMMARY_BASE_URL = fake_openai.base_url
    settings.LLM_SUMMARY_MODEL = "fake-model"
    settings.MEMORY_SUMMARY_ATTEMPTS = 1
    fake_openai.llama_cpp().json_object_error = True
    fake_openai.script(completion(f"Here are the facts:\n```json\n{GOOD}\n```\nAnything else?"))
    session = await sync_to_async(chat_session_make)(alice.owner, mode=ChatSession.Mode.QUICK_ANSWER)
    await say(session, "I'm allergic to penicillin.")

    await job_with(extraction()).run_now(str(session.pk))

    formats = [(recorded.json.get("response_format") or {}).get("type") for recorded in fake_openai.requests]
    assert formats == ["json_schema", "json_object", None]
    (fact,) = await facts_of(session)
    assert (fact.key, fact.value, fact.extractor) == ("allergy", "penicillin", "llm:fake-model")
