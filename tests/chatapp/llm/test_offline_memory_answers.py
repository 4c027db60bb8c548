"""The offline engine answers from what the request holds (docs/memory.md §6, §10): the key-facts
block, the summary block, the recall block and the retained messages, each rendered here by the
memory engine's own code, so a change of their format shows up as a failing test. In agent mode
a question the context does not answer becomes a ``kb_search`` call; quick-answer answers from
the retrieved passage when it answers the question; statements are noted in the second person."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from chatapp.conversation.quick_answer import quick_answer_system_prompt
from chatapp.kb.documents import DEMO_KB_DIR
from chatapp.kb.search import Passage, passages_format
from chatapp.llm.offline.blocks import facts_lines, message_blocks, question_and_blocks, recall_items
from chatapp.llm.offline.replies import GREETING, WELCOME, OfflineReply, offline_reply
from chatapp.llm.prompts import TOOL_SCHEMAS
from memory.context.assembly import MERGE_SEPARATOR
from memory.facts.block import render_facts
from memory.facts.values import KeyFact
from memory.recall.block import render_recall
from memory.recall.values import RecallItem
from memory.summary.archive import summary_block

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
AGENT_SYSTEM = {"role": "system", "content": "You are the assistant of Kestrel Sync. Use the kb_search tool."}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def reply(messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> OfflineReply:
    return offline_reply(messages, tools=tools, summary_max_tokens=300)


def answer(messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> str:
    result = reply(messages, tools=tools)
    assert result.tool_calls == [], f"expected a text answer, got {result.tool_calls}"
    return result.text


def fact(fact_id: int, kind: str, key: str, value: str, source: int | None, **fields: Any) -> KeyFact:
    return KeyFact(id=fact_id, kind=kind, key=key, value=value, text=value, source_message_id=source, **fields)


def facts_message(*facts: KeyFact) -> dict[str, Any]:
    return {"role": "system", "content": render_facts(list(facts))}


ADA = fact(1, "id", "user_id", "ACC-7731", 1)
ADA_NAME = fact(2, "name", "name", "Ada", 1)


def summary_message(content: str, *, role: str = "system") -> dict[str, Any]:
    return summary_block(content=content, summary_type="llm", compressed_count=36, role=role)


def recalled(text: str, *, message_id: int = 12, role: str = "user", title: str = "") -> RecallItem:
    return RecallItem(
        id=message_id,
        memory_key="1",
        chat_title=title,
        message_ids=(message_id,),
        role=role,
        text=text,
        tokens=len(text.split()),
        created_at=datetime(2026, 11, 30, 9, 15, tzinfo=UTC),
    )


def demo_passage(document: str, section: str) -> Passage:
    """The ``section`` of the demo knowledge base's ``document`` as a retrieved passage."""
    text = (DEMO_KB_DIR / document).read_text()
    title = text.splitlines()[0].lstrip("# ").strip()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0].strip()
    return Passage(chunk_id=1, document_id=1, title=title, text=f"{section}\n\n{body}", score=1.0)


ENCRYPTION = demo_passage("security.md", "Encryption")
ACCOUNTS = demo_passage("security.md", "Accounts")


# --- the blocks, as the memory engine renders them ------------------------------------------------


def test_the_key_facts_block_is_read_back_line_by_line() -> None:
    block = render_facts(
        [
            fact(3, "id", "user_id", "ACC-7731", 1),
            fact(4, "id", "user_id", "ACC-1002", 1),
            fact(5, "address", "home_address", "48 Birch Lane", 9, replaces="12 Elm Road"),
            fact(6, "preference", "allergy", "penicillin", None, pinned_by_user=True),
            KeyFact(
                id=7,
                kind="commitment",
                key="callback",
                value="call back on Friday",
                text="The assistant promised to call back on Friday",
                source_message_id=5,
            ),
        ]
    )

    facts = facts_lines(block)

    assert [(f.key, f.values, f.replaces, f.pinned, f.text) for f in facts] == [
        ("user_id", ("ACC-7731", "ACC-1002"), "", False, ""),
        ("home_address", ("48 Birch Lane",), "12 Elm Road", False, ""),
        ("allergy", ("penicillin",), "", True, ""),
        ("callback", ("call back on Friday",), "", False, "The assistant promised to call back on Friday"),
    ]


def test_the_recall_block_is_read_back_item_by_item_with_multi_line_text() -> None:
    block = render_recall([recalled("My booking reference is ZX-9917.\n\nThe trip is in May.", title="Trip")])

    (item,) = recall_items(block)

    assert item.text == "My booking reference is ZX-9917.\n\nThe trip is in May."
    assert (item.role, item.chat, item.where) == ("user", "Trip", "2026-11-30, msg 12")


def test_blocks_merged_into_the_question_are_split_off_it() -> None:
    merged = MERGE_SEPARATOR.join(
        [render_facts([ADA]), summary_message("- User: I live in Lisbon.")["content"], "What is my account id?"]
    )

    question, blocks = question_and_blocks(merged)

    assert question == "What is my account id?"
    assert [block.kind for block in blocks] == ["facts", "summary"]
    assert [block.kind for block in message_blocks("Just a message.\n\nWith two paragraphs.")] == ["text"]


# --- questions about the conversation ------------------------------------------------------------


def test_the_account_id_is_answered_from_the_key_facts_block() -> None:
    messages = [
        SYSTEM,
        facts_message(ADA, ADA_NAME),
        user("How long are shared links valid?"),
        user("What is my account id?"),
    ]

    assert answer(messages) == "Your account id is ACC-7731 (from the key facts)."
    assert answer([*messages[:-1], user("What's my name?")]) == "Your name is Ada (from the key facts)."


def test_without_the_block_the_account_id_is_honestly_not_found() -> None:
    assert answer([SYSTEM, user("What is my account id?")]) == (
        "I don't find anything about “account id” in my current context."
    )


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("What's my name?", "Your name is Ada (from the key facts)."),
        ("What is my dog's name?", "Your dog's name is Biscuit (from the key facts)."),
        ("Which booking reference did I give you earlier?", "Your reservation id is ZX-9917 (from the key facts)."),
        ("What was my booking reference?", "Your booking reference is ZX-9917 (from the key facts)."),
        ("What are my booking references?", "Your booking references are ZX-9917 (from the key facts)."),
        ("Where do I live?", "Your home address is 48 Birch Lane (from the key facts; it replaces 12 Elm Road)."),
        (
            "What are my account ids?",
            "Your account ids: ACC-7731 and ACC-1002 (from the key facts, newest first).",
        ),
    ],
)
def test_the_slot_that_answers_is_chosen_by_the_words_of_the_question(question: str, expected: str) -> None:
    block = facts_message(
        fact(1, "id", "user_id", "ACC-7731", 7),
        fact(2, "id", "user_id", "ACC-1002", 3),
        fact(3, "id", "reservation_id", "ZX-9917", 4),
        fact(4, "address", "home_address", "48 Birch Lane", 9, replaces="12 Elm Road"),
        fact(5, "name", "pet_name", "Biscuit", 5),
        fact(6, "name", "name", "Ada", 1),
    )

    assert answer([SYSTEM, block, user(question)]) == expected


def test_a_commitment_is_answered_with_its_text() -> None:
    promise = KeyFact(
        id=1,
        kind="commitment",
        key="callback",
        value="call back on Friday",
        text="The assistant promised to call back on Friday",
        source_message_id=5,
    )

    assert answer([SYSTEM, facts_message(promise), user("When is the callback?")]) == (
        "From the key facts: The assistant promised to call back on Friday (call back on Friday)."
    )


def test_a_later_correction_in_the_window_beats_a_fact_not_yet_updated() -> None:
    messages = [
        SYSTEM,
        facts_message(ADA_NAME),
        user("Sorry, my name is Joan."),
        assistant("Noted."),
        user("What's my name?"),
    ]

    assert answer(messages) == "From our conversation: “Sorry, my name is Joan.”"
    pinned = fact(2, "name", "name", "Ada", 1, pinned_by_user=True)
    assert answer([SYSTEM, facts_message(pinned), *messages[2:]]) == "Your name is Ada (from the key facts)."


def test_the_summary_answers_an_id_question_and_never_quotes_the_assistants_lines() -> None:
    summary = summary_message(
        "- User: Hi! My name is Ada, account ACC-7731.\n- Assistant: Noted: your name is Ada, account ACC-7731."
    )

    assert answer([SYSTEM, summary, user("What is my account id?")]) == (
        "From the conversation summary: “My name is Ada, account ACC-7731.”"
    )


def test_a_recalled_message_is_quoted_with_its_date_and_id() -> None:
    recall = {"role": "system", "content": render_recall([recalled("My booking reference is ZX-9917.")])}

    assert answer([SYSTEM, summary_message("- User: I like tea."), recall, user("What was my booking reference?")]) == (
        "From an earlier message (2026-11-30, #12): “My booking reference is ZX-9917.”"
    )


def test_a_recalled_search_result_is_quoted_as_the_knowledge_base_without_its_call() -> None:
    result = 'kb_search({"query": "sign-in"}) -> ' + passages_format([ACCOUNTS])
    recall = {"role": "system", "content": render_recall([recalled(result, role="tool")])}

    assert answer([SYSTEM, recall, user("What happens after 10 failed sign-in attempts?")]) == (
        "From the knowledge base (Kestrel Sync security and privacy › Accounts): “After 10 failed sign-in attempts "
        "an account is locked for 15 minutes.”"
    )


PAID = "I paid 75 dollars on 3 April 2026."


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("When did I pay?", "Your date is 3 April 2026 (from the key facts; said together with 75 dollars)."),
        ("How much did I pay?", "Your amount is 75 dollars (from the key facts)."),
    ],
)
def test_a_when_question_gets_the_date_and_a_how_much_question_the_amount(question: str, expected: str) -> None:
    block = facts_message(
        fact(1, "money", "amount", "75 dollars", 3),
        fact(2, "date", "date", "14 March 2027", 5),
        fact(3, "date", "date", "3 April 2026", 3),
    )
    summary = summary_message(f"- User: {PAID}\n- User: My Team plan renews on 14 March 2027.")

    assert answer([SYSTEM, block, summary, user(question)]) == expected


def test_a_when_question_is_never_answered_with_an_amount() -> None:
    block = facts_message(fact(1, "money", "amount", "75 dollars", 3), fact(2, "date", "date", "3 April 2026", 4))

    assert (
        answer([SYSTEM, block, user("When did I pay?")]) == "I don't find anything about “pay” in my current context."
    )


@pytest.mark.parametrize("role", ["system", "user"])
def test_blocks_merged_by_strict_alternation_are_read_too(role: str) -> None:
    merged = MERGE_SEPARATOR.join([render_facts([ADA]), summary_message("- User: I like tea.", role=role)["content"]])
    question = user(MERGE_SEPARATOR.join([merged, "What is my account id?"]))

    assert answer([SYSTEM, question]) == "Your account id is ACC-7731 (from the key facts)."


# --- the knowledge base ----------------------------------------------------------------------------


def test_quick_answer_answers_is_my_data_encrypted_from_the_retrieved_passage() -> None:
    system = {"role": "system", "content": quick_answer_system_prompt([ENCRYPTION, ACCOUNTS])}

    text = answer([system, user("Is my data encrypted?")])

    assert text.startswith(
        "From the knowledge base (Kestrel Sync security and privacy › Encryption): “Files are encrypted in transit "
        "with TLS 1.3 and at rest with AES-256.”"
    )
    assert "the data cannot be recovered" in text


def test_quick_answer_says_so_when_the_passages_do_not_answer() -> None:
    system = {"role": "system", "content": quick_answer_system_prompt([ENCRYPTION])}

    assert answer([system, user("What is the capital of Peru?")]) == (
        "I don't find anything about “capital peru” in my current context."
    )


def test_the_agent_searches_the_knowledge_base_for_a_question_the_context_does_not_answer() -> None:
    messages = [AGENT_SYSTEM, user("Hi! My name is Ada."), assistant("Noted."), user("Is my data encrypted?")]

    (call,) = reply(messages, tools=TOOL_SCHEMAS).tool_calls

    assert call["function"]["name"] == "kb_search"
    assert json.loads(call["function"]["arguments"]) == {"query": "Is my data encrypted"}
    assert reply(messages, tools=TOOL_SCHEMAS) == reply(messages, tools=TOOL_SCHEMAS), "deterministic"


def test_the_agent_answers_from_the_context_without_searching_when_it_can() -> None:
    messages = [AGENT_SYSTEM, facts_message(ADA), user("What is my account id?")]

    assert answer(messages, tools=TOOL_SCHEMAS) == "Your account id is ACC-7731 (from the key facts)."


def tool_turn(query: str, result: str) -> list[dict[str, Any]]:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "kb_search", "arguments": json.dumps({"query": query})},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "name": "kb_search", "content": result},
    ]


def test_after_its_search_the_agent_quotes_the_passage_that_answers() -> None:
    messages = [
        AGENT_SYSTEM,
        user("Is my data encrypted?"),
        *tool_turn("Is my data encrypted", passages_format([ACCOUNTS, ENCRYPTION])),
    ]

    text = answer(messages, tools=TOOL_SCHEMAS)

    assert text.startswith("From the knowledge base (Kestrel Sync security and privacy › Encryption): “Files are")


@pytest.mark.parametrize("result", ["no passages found for 'capital Peru'", passages_format([ACCOUNTS])])
def test_after_a_search_that_found_nothing_relevant_the_agent_says_so(result: str) -> None:
    messages = [AGENT_SYSTEM, user("What is the capital of Peru?"), *tool_turn("What is the capital of Peru", result)]

    assert answer(messages, tools=TOOL_SCHEMAS) == (
        "I don't find anything about “capital peru” in my current context or in the knowledge base."
    )


def test_a_question_about_the_user_is_searched_but_a_passage_never_answers_it_with_one_word() -> None:
    device = Passage(
        chunk_id=4, document_id=3, title="Support", text="Each device shows its name in the web app.", score=1
    )
    messages = [AGENT_SYSTEM, user("What's my name?"), *tool_turn("What's my name", passages_format([device]))]

    assert reply(messages[:2], tools=TOOL_SCHEMAS).tool_calls[0]["function"]["name"] == "kb_search"
    assert answer(messages, tools=TOOL_SCHEMAS) == (
        "I don't find anything about “name” in my current context or in the knowledge base."
    )


def test_an_explicit_search_quotes_the_passage_that_matches_best_not_only_the_top_one() -> None:
    release = Passage(
        chunk_id=9,
        document_id=9,
        title="Kestrel Sync support and release notes",
        text="Release 4.2\n\nVersion 4.2 raised the file size limit on paid plans from 20 GB to 50 GB.",
        score=2.0,
    )
    question = "What does the knowledge base say about the largest single file?"
    passages = passages_format([release, demo_passage("limits.md", "File limits")])
    messages = [AGENT_SYSTEM, user(question), *tool_turn("largest single file", passages)]

    assert answer(messages, tools=TOOL_SCHEMAS) == (
        "The knowledge base says (Kestrel Sync limits › File limits): “The largest single file is 50 GB on paid plans "
        "and 2 GB on the Free plan.”"
    )
    rate = [AGENT_SYSTEM, user("Search the knowledge base for API rate limits."), *tool_turn("API rate limits", "")]
    rate[-1]["content"] = passages_format([demo_passage("limits.md", "API rate limits")])
    assert answer(rate, tools=TOOL_SCHEMAS) == (
        "The knowledge base says (Kestrel Sync limits › API rate limits): “The public REST API allows 600 requests per "
        "minute per access token, and 20 concurrent uploads per account.”"
    )


def pricing_passages() -> str:
    return passages_format([demo_passage("pricing.md", plan) for plan in ("Free plan", "Personal plan", "Team plan")])


DELETED_FILES = demo_passage("limits.md", "Deleted files")


@pytest.mark.parametrize(
    ("question", "section", "sentence"),
    [
        ("What is the Team plan price?", "Team plan", "Team plan price: 12 euros per user per month"),
        ("How much does the Personal plan cost?", "Personal plan", "Personal plan price: 6 euros per month"),
        ("Is there a free plan?", "Free plan", "Free plan price: 0 euros."),
    ],
)
def test_the_agent_searches_when_a_passage_in_its_context_only_loosely_matches(
    question: str, section: str, sentence: str
) -> None:
    earlier = [
        AGENT_SYSTEM,
        user("How long do deleted files stay in the trash?"),
        *tool_turn("How long do deleted files stay in the trash", passages_format([DELETED_FILES])),
        assistant("From the knowledge base (Kestrel Sync limits › Deleted files): “Deleted files stay in the trash …”"),
        user(question),
    ]

    (call,) = reply(earlier, tools=TOOL_SCHEMAS).tool_calls

    assert call["function"]["name"] == "kb_search"
    assert json.loads(call["function"]["arguments"]) == {"query": question.rstrip("?")}
    searched = [*earlier, *tool_turn(question.rstrip("?"), pricing_passages())]
    assert answer(searched, tools=TOOL_SCHEMAS).startswith(
        f"From the knowledge base (Kestrel Sync plans and pricing › {section}): “{sentence}"
    )


def test_the_agent_answers_from_a_passage_in_its_context_that_covers_the_question() -> None:
    messages = [
        AGENT_SYSTEM,
        user("Search the knowledge base for deleted files."),
        *tool_turn("deleted files", passages_format([DELETED_FILES])),
        assistant("The knowledge base says …"),
        user("How long do deleted files stay in the trash?"),
    ]

    assert answer(messages, tools=TOOL_SCHEMAS) == (
        "From the knowledge base (Kestrel Sync limits › Deleted files): “Deleted files stay in the trash for 30 days "
        "on Free and Personal plans and for 180 days on Team and Enterprise plans.”"
    )


@pytest.mark.parametrize(
    "question", ["Is our studio in Lisbon permanently?", "Tell me if our studio is in Lisbon permanently"]
)
def test_after_a_search_that_found_nothing_the_agent_still_answers_from_what_the_user_said(question: str) -> None:
    messages = [
        AGENT_SYSTEM,
        user("Our studio is in Lisbon and we travel a lot."),
        assistant("Noted: your studio is in Lisbon and you travel a lot."),
        user(question),
    ]

    (call,) = reply(messages, tools=TOOL_SCHEMAS).tool_calls
    searched = [*messages, *tool_turn(question.rstrip("?"), "no passages found")]

    assert call["function"]["name"] == "kb_search", "“permanently” is not in what the user said"
    assert answer(searched, tools=TOOL_SCHEMAS) == (
        "From our conversation: “Our studio is in Lisbon and we travel a lot.”"
    )


@pytest.mark.parametrize("tools", [None, TOOL_SCHEMAS])
def test_what_encryption_do_you_use_is_answered_without_use_as_a_topic(tools: list[dict[str, Any]] | None) -> None:
    system = {"role": "system", "content": quick_answer_system_prompt([ACCOUNTS, ENCRYPTION])}

    assert answer([system, user("What encryption do you use?")], tools=tools).startswith(
        "From the knowledge base (Kestrel Sync security and privacy › Encryption): “Files are encrypted in transit "
        "with TLS 1.3 and at rest with AES-256.”"
    )
    assert answer([SYSTEM, user("Which encryption is used?")]) == (
        "I don't find anything about “encryption” in my current context."
    )


@pytest.mark.parametrize(
    ("text", "expression"),
    [("Calculate 10/0", "10/0"), ("Calculate 2+2", "2+2"), ("What is 12*(3+4)?", "12*(3+4)"), ("2 + 2", "2 + 2")],
)
def test_quick_answer_says_it_has_no_calculator_and_points_to_agent_mode(text: str, expression: str) -> None:
    assert answer([SYSTEM, user(text)]) == (
        f"Quick answer has no calculator, and I only answer from what I can quote, so I don't compute “{expression}”."
        " Switch this chat to agent mode: its calculator tool does."
    )
    (call,) = reply([SYSTEM, user(text)], tools=TOOL_SCHEMAS).tool_calls
    assert call["function"]["name"] == "calculator", "agent mode computes it"


# --- statements -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hi! My name is Ada, account ACC-7731.", "Noted: your name is Ada, account ACC-7731."),
        ("Hello, I'm Ada.", "Noted: you're Ada."),
        ("Our studio is in Lisbon and we travel a lot.", "Noted: your studio is in Lisbon and you travel a lot."),
        (
            "I live at 12 Elm Road. I'm allergic to penicillin!",
            "Noted: you live at 12 Elm Road; you're allergic to penicillin.",
        ),
        (
            "I was charged 240 euros twice on my March invoice.",
            "Noted: you were charged 240 euros twice on your March invoice.",
        ),
        ("Thanks a lot!", WELCOME),
        ("Hi there!", GREETING),
    ],
)
def test_statements_are_acknowledged_sensibly(text: str, expected: str) -> None:
    assert answer([SYSTEM, user(text)], tools=TOOL_SCHEMAS) == expected


def test_an_earlier_search_that_found_nothing_is_never_quoted_as_what_the_conversation_said() -> None:
    """A newcomer saw "From our conversation: “no passages found for 'zebra migration'”" recalled later as if it
    were something said: an empty result is no evidence."""
    messages = [
        AGENT_SYSTEM,
        user("Search the knowledge base for zebra migration"),
        *tool_turn("zebra migration", "no passages found for 'zebra migration'"),
        assistant("I searched the knowledge base for “zebra migration” and found nothing."),
        user("What is known about zebra migration?"),
    ]

    text = answer(messages)
    assert "no passages found" not in text
    assert text == "From our conversation: “Search the knowledge base for zebra migration”"
