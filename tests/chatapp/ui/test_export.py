"""Exporting a chat with its memory (``/s/<id>/export.md`` and ``export.json``, docs/export.md):
both formats of a chat with tool calls, summary versions, key facts in every state, compression
events and a memory job; the owner only (404 for anyone else and for unknown sessions and
formats); a chat deleted before and while it streams; the page-by-page streaming that bounds
memory; the file name."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse
from django.test import AsyncClient
from django.urls import reverse
from django.utils import timezone

from chatapp.chats import export as export_module
from chatapp.chats.export import (
    EXPORT_FORMATS,
    chat_export_filename,
    chat_export_stream,
    fenced,
    inline,
    quoted,
)
from chatapp.chats.memory import memory_key_of
from chatapp.chats.selectors import message_list_between
from chatapp.chats.services import chat_session_delete
from chatapp.models import ChatSession, Message
from memory.api import KeyFact
from memory.models import KeyFact as KeyFactRow
from memory.models import MemoryJobState, SessionSummary
from memory.storage.summaries import compression_event_create, compression_event_list_after, session_summary_save
from memory.summary.store import CompressionRecord, Summary
from tests.chatapp.conftest import Visitor, chat_session_make, message_make

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "db_connections_closed"),
]

TOOL_CALL = {
    "id": "call_kb_1",
    "type": "function",
    "function": {"name": "kb_search", "arguments": '{"query": "encryption at rest"}'},
}
# A tool result holding a run of three backticks: the Markdown fence around it must be longer.
TOOL_RESULT = "Security: data is encrypted at rest with ```AES-256```."
SUMMARY_V1 = "The user is Ada (account ACC-7731). She asked about encryption."
SUMMARY_V2 = "[Raw archive of newly added messages]\n- User: Ship it to 12 Elm Street."


def export_url(session_id: int, fmt: str) -> str:
    return reverse("session-export", kwargs={"session_id": session_id, "fmt": fmt})


async def download(visitor: Visitor | None, path: str) -> tuple[Any, bytes]:
    """GET ``path`` as ``visitor`` (None: a browser without cookies); the response and its
    whole body, streamed or not."""
    client = AsyncClient()
    if visitor is not None:
        client.cookies = visitor.client.cookies
    # Any: django-stubs types the test response as a plain HttpResponse, not a streaming one.
    response: Any = await client.get(path)
    if not response.streaming:
        return response, response.content
    return response, b"".join([chunk async for chunk in response.streaming_content])


def rich_chat(owner_visitor: Visitor) -> dict[str, Any]:
    """A chat with plain turns, a tool call and its result, a Markdown reply, an app-written
    error note, two summary versions (an LLM summary, then a degraded raw archive), a superseded
    compression, key facts active, superseded and hidden, and a failed memory job."""
    session = chat_session_make(owner_visitor.owner, title='Ada\'s "account" / Q&A ✓')
    key = memory_key_of(session.pk)
    u1 = message_make(session, "user", "Hi! My name is Ada, account ACC-7731.")
    a1 = message_make(session, "assistant", "Noted.", reply_to=u1)
    u2 = message_make(session, "user", "Is my data encrypted?")
    call = message_make(session, "assistant", None, tool_calls=[TOOL_CALL], reply_to=u2)
    tool = message_make(session, "tool", TOOL_RESULT, tool_call_id="call_kb_1", name="kb_search", reply_to=u2)
    a2 = message_make(session, "assistant", "# Yes\nIt is encrypted with AES-256.", reply_to=u2)
    u3 = message_make(session, "user", "Ship it to 12 Elm Street. No, to 14 Oak Road.")
    note = message_make(session, "assistant", "The model is unavailable.", reply_to=u3, origin="app", status="error")
    messages = [u1, a1, u2, call, tool, a2, u3, note]

    assert session_summary_save(
        memory_key=key,
        expected_version=0,
        new=Summary(content=SUMMARY_V1, summary_type="llm", last_message_id=a2.pk, compressed_count=6),
        token_count=20,
    )
    # The offline engine's summarizer copies sentences: its summaries are extractive, stored as "llm".
    ok = {
        "model": "offline-engine",
        "phase": "primary",
        "number": 1,
        "latency_ms": 12,
        "ok": True,
        "error": "",
        "method": "extractive",
    }
    failed = {**ok, "ok": False, "error": "HTTP 500: summaries are switched to fail"}
    window: dict[str, Any] = {"mode": "agent", "context_window": 2048, "trigger_tokens": 1024, "target_tokens": 614}
    compression_event_create(
        memory_key=key,
        record=CompressionRecord(
            kind="compression",
            **window,
            tokens_before=1100,
            tokens_after=600,
            messages_summarized=6,
            boundary_after=a2.pk,
            result_type="llm",
            attempts=[ok],
            duration_ms=40,
            summary_content=SUMMARY_V1,
            summary_version=1,
        ),
    )
    compression_event_create(
        memory_key=key,
        record=CompressionRecord(
            kind="superseded",
            **window,
            tokens_before=1090,
            tokens_after=1090,
            boundary_before=a2.pk,
            boundary_after=a2.pk,
            result_type="llm",
            attempts=[ok],
            summary_content="a summary another request beat",
        ),
    )
    assert session_summary_save(
        memory_key=key,
        expected_version=1,
        new=Summary(content=SUMMARY_V2, summary_type="raw", last_message_id=u3.pk, compressed_count=7),
        token_count=20,
    )
    compression_event_create(
        memory_key=key,
        record=CompressionRecord(
            kind="compression",
            **window,
            tokens_before=1200,
            tokens_after=500,
            messages_summarized=1,
            boundary_before=a2.pk,
            boundary_after=u3.pk,
            result_type="raw",
            degraded=True,
            attempts=[failed, {**failed, "number": 2}],
            duration_ms=90,
            summary_content=SUMMARY_V2,
            summary_version=2,
            notes=["every summarizer attempt failed: raw archive"],
        ),
    )

    def fact(kind: str, slot: str, value: str, source: Message, **fields: Any) -> KeyFactRow:
        return KeyFactRow.objects.create(
            memory_key=key, scope_key="user:1", kind=kind, key=slot, value=value, text=f"{slot} is {value}",
            source_message_id=source.pk, **fields,
        )  # fmt: skip

    account = fact("id", "account_id", "ACC-7731", u1)
    new_address = fact("address", "shipping_address", "14 Oak Road", u3)
    old_address = fact(
        "address", "shipping_address", "12 Elm Street", u3, invalidated_at=timezone.now(), superseded_by=new_address
    )
    hidden = fact("name", "name", "Ada", u1, hidden_by_user=True)
    MemoryJobState.objects.create(
        memory_key=key, status="failed", last_error="key-facts extraction timed out", runs=3,
        lease_owner="worker-on-secret-host:4242",
    )  # fmt: skip
    return {
        "session": session,
        "messages": messages,
        "facts": {"active": account, "active2": new_address, "superseded": old_address, "hidden": hidden},
    }


# --- JSON ------------------------------------------------------------------------------------


async def test_json_export_holds_messages_summary_versions_key_facts_events_and_the_job(alice: Visitor):
    chat = await sync_to_async(rich_chat)(alice)
    session, messages = chat["session"], chat["messages"]
    response, body = await download(alice, export_url(session.pk, "json"))

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="chat-{session.pk}-adas-account-qa.json"'
    assert response["Cache-Control"] == "private, no-store"
    data = json.loads(body)
    assert data["format"] == "kestrel-chat-export" and data["version"] == 1
    assert data["session"]["id"] == session.pk and data["session"]["title"] == session.title
    assert data["session"]["mode"] == "agent"
    assert data["as_of"]["last_message_id"] == messages[-1].pk

    exported = data["messages"]
    assert [m["id"] for m in exported] == [m.pk for m in messages]
    assert [m["role"] for m in exported] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    assert exported[0]["content"] == "Hi! My name is Ada, account ACC-7731."
    assert exported[3]["tool_calls"] == [TOOL_CALL] and exported[3]["content"] is None
    assert exported[4]["tool_call_id"] == "call_kb_1" and exported[4]["name"] == "kb_search"
    assert exported[4]["content"] == TOOL_RESULT
    assert exported[7]["origin"] == "app" and exported[7]["status"] == "error"
    assert all(m["created"] and m["reply_to"] in (None, *(x.pk for x in messages)) for m in exported)

    assert data["summary"] == {
        "summary_type": "raw",
        "summary_kind": "raw",
        "content": SUMMARY_V2,
        "boundary": messages[6].pk,
        "compressed_count": 7,
        "version": 2,
    }
    versions = data["summary_versions"]
    assert [(v["version"], v["summary_type"], v["summary_kind"], v["degraded"]) for v in versions] == [
        (1, "llm", "extractive", False),
        (2, "raw", "raw", True),
    ]
    assert [v["content"] for v in versions] == [SUMMARY_V1, SUMMARY_V2]
    assert [v["boundary"] for v in versions] == [messages[5].pk, messages[6].pk]

    events = data["compression_events"]
    assert [e["kind"] for e in events] == ["compression", "superseded", "compression"]
    assert [e["summary_version"] for e in events] == [1, None, 2]
    assert [(e["result_type"], e["summary_kind"]) for e in events] == [
        ("llm", "extractive"),
        ("llm", "extractive"),
        ("raw", "raw"),
    ]
    assert all("summary_content" not in e for e in events)
    assert [a["ok"] for a in events[2]["attempts"]] == [False, False]
    assert events[2]["notes"] == ["every summarizer attempt failed: raw archive"]
    assert versions[1]["compression_event_id"] == events[2]["id"]

    facts = {f["id"]: f for f in data["key_facts"]}
    assert {f["state"] for f in facts.values()} == {"active", "superseded", "hidden"}
    assert facts[chat["facts"]["active"].pk]["value"] == "ACC-7731"
    superseded = facts[chat["facts"]["superseded"].pk]
    assert superseded["state"] == "superseded" and superseded["superseded_by"] == chat["facts"]["active2"].pk
    assert facts[chat["facts"]["hidden"].pk]["state"] == "hidden"
    assert facts[chat["facts"]["active2"].pk]["replaces"] == "12 Elm Street"

    assert data["memory_job"]["status"] == "failed" and data["memory_job"]["runs"] == 3
    assert data["memory_job"]["last_error"] == "key-facts extraction timed out"
    assert "lease_owner" not in data["memory_job"] and b"secret-host" not in body


async def test_an_empty_chat_exports_as_valid_json_with_empty_lists(alice: Visitor):
    session = await sync_to_async(chat_session_make)(alice.owner)
    _, body = await download(alice, export_url(session.pk, "json"))
    data = json.loads(body)
    assert data["messages"] == [] and data["summary_versions"] == [] and data["compression_events"] == []
    assert data["key_facts"] == [] and data["as_of"] == {"last_message_id": None, "last_compression_event_id": None}
    assert data["summary"]["version"] == 0 and data["memory_job"]["status"] == "idle"


def extractive_summary_chat(visitor: Visitor) -> ChatSession:
    """A chat whose current summary the offline engine's extractive summarizer wrote (stored as
    ``llm``, with its compression event's attempts saying ``extractive``)."""
    session = chat_session_make(visitor.owner)
    user = message_make(session, "user", "My account is ACC-7731.")
    reply = message_make(session, "assistant", "Noted.", reply_to=user)
    key = memory_key_of(session.pk)
    assert session_summary_save(
        memory_key=key,
        expected_version=0,
        new=Summary(content="- The user's account is ACC-7731.", summary_type="llm", last_message_id=reply.pk),
        token_count=10,
    )
    attempt = {"model": "offline-engine", "phase": "primary", "number": 1, "latency_ms": 3, "ok": True}
    compression_event_create(
        memory_key=key,
        record=CompressionRecord(
            kind="compression",
            mode="quick-answer",
            context_window=2048,
            trigger_tokens=1024,
            target_tokens=614,
            tokens_before=1100,
            tokens_after=300,
            messages_summarized=2,
            boundary_after=reply.pk,
            result_type="llm",
            attempts=[{**attempt, "method": "extractive"}],
            summary_content="- The user's account is ACC-7731.",
            summary_version=1,
        ),
    )
    return session


async def test_an_extractive_summary_is_exported_as_extractive_not_as_an_llm_one(alice: Visitor):
    session = await sync_to_async(extractive_summary_chat)(alice)
    _, body = await download(alice, export_url(session.pk, "json"))
    data = json.loads(body)
    assert data["summary"]["summary_type"] == "llm" and data["summary"]["summary_kind"] == "extractive"
    assert [(v["summary_type"], v["summary_kind"]) for v in data["summary_versions"]] == [("llm", "extractive")]
    _, body = await download(alice, export_url(session.pk, "md"))
    text = body.decode()
    assert "Version 1 · extractive summary · covers messages up to" in text
    assert "### Version 1 · extractive summary" in text and "LLM summary" not in text


# --- Markdown --------------------------------------------------------------------------------


async def test_markdown_export_reads_as_a_document_with_everything_in_it(alice: Visitor):
    chat = await sync_to_async(rich_chat)(alice)
    session, messages = chat["session"], chat["messages"]
    response, body = await download(alice, export_url(session.pk, "md"))
    text = body.decode()

    assert response.status_code == 200 and response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="chat-{session.pk}-adas-account-qa.md"'
    assert text.startswith('# Ada\'s "account" / Q&A ✓\n')
    outline = [line for line in text.splitlines() if line.startswith("## ")]
    assert outline == [
        "## Key facts",
        "## Current summary",
        "## Messages",
        "## Summary versions",
        "## Compression events",
        "## Memory job",
    ]
    # Every message, in order, under its own heading; a reply's own heading stays quoted.
    headings = [line for line in text.splitlines() if line.startswith("### #")]
    assert [h.split(" · ")[0] for h in headings] == [f"### #{m.pk}" for m in messages]
    assert "> # Yes\n> It is encrypted with AES-256." in text
    assert (
        f"### #{messages[7].pk} · Assistant" in text and "(error; written by the app, never sent to the model)" in text
    )
    # The tool call and its result, verbatim; the fence outgrows the result's own backticks.
    assert "Tool call `kb_search`, id `call_kb_1`:" in text
    assert '```json\n{"query": "encryption at rest"}\n```' in text
    assert f"### #{messages[4].pk} · Tool `kb_search` answering `call_kb_1`" in text
    assert f"````text\n{TOOL_RESULT}\n````" in text
    # Key facts by state, the summary now and every version, events with their attempts.
    assert "### Active (2)" in text and "### Hidden (1)" in text and "### Superseded (1)" in text
    assert "- `account_id` = `ACC-7731` · id · from message #" in text
    assert f"Version 2 · raw archive · covers messages up to #{messages[6].pk} · 7 messages compressed" in text
    assert "### Version 1 · extractive summary" in text and "### Version 2 · raw archive (degraded)" in text
    assert f"```text\n{SUMMARY_V1}\n```" in text
    assert "1200 → 500 tokens" in text and "2 attempts, 2 failed" in text
    assert (
        "primary attempt 2 (offline-engine, extractive, 12 ms): failed: HTTP 500: summaries are switched to fail"
        in text
    )
    assert (
        "result extractive summary, wrote version 1" in text
        and "result raw archive (degraded), wrote version 2" in text
    )
    assert "note: every summarizer attempt failed: raw archive" in text
    assert text.rstrip().endswith("Status failed · 3 runs · last error: key-facts extraction timed out")
    assert "secret-host" not in text


def test_markdown_helpers_keep_content_verbatim_and_contained():
    assert fenced("a ```` b", "text") == "`````text\na ```` b\n`````\n"
    assert fenced("plain") == "```\nplain\n```\n"
    assert quoted("# title\n\n- item") == "> # title\n>\n> - item\n"
    assert quoted("") == ">\n"
    assert inline("a`b") == "``a`b``" and inline("`x`") == "`` `x` ``" and inline("two\nlines") == "`two lines`"


# --- who may export --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["md", "json"])
async def test_export_is_404_for_strangers_unknown_sessions_and_formats(
    alice: Visitor, bob: Visitor, anon: Visitor, anon2: Visitor, fmt: str
):
    for owner, strangers in ((alice, [bob, anon, None]), (anon, [anon2, alice, None])):
        chat = await sync_to_async(rich_chat)(owner)
        session = chat["session"]
        for stranger in strangers:
            response, body = await download(stranger, export_url(session.pk, fmt))
            assert response.status_code == 404, stranger
            assert b"ACC-7731" not in body and b"Ada" not in body
        response, _ = await download(owner, export_url(session.pk, fmt))
        assert response.status_code == 200
    for missing in (999_999, 2**63, 2**70):
        response, _ = await download(alice, export_url(missing, fmt))
        assert response.status_code == 404
    response, _ = await download(alice, export_url(session.pk, "txt"))
    assert response.status_code == 404
    response = await AsyncClient().post(export_url(session.pk, fmt))
    assert response.status_code == 405


async def test_a_deleted_chat_is_404_and_its_memory_is_not_exported(alice: Visitor):
    chat = await sync_to_async(rich_chat)(alice)
    session = chat["session"]
    session_id = session.pk
    await sync_to_async(chat_session_delete)(session=session)
    for fmt in ("md", "json"):
        response, body = await download(alice, export_url(session_id, fmt))
        assert response.status_code == 404 and b"ACC-7731" not in body


async def test_a_chat_deleted_while_it_streams_ends_early_as_a_well_formed_document(alice: Visitor):
    chat = await sync_to_async(rich_chat)(alice)
    session = chat["session"]
    stream = chat_export_stream(session=session, export_format=EXPORT_FORMATS["json"], page_size=3)
    memory_key = memory_key_of(session.pk)
    chunks = [await anext(stream), await anext(stream), await anext(stream)]  # head, "messages":[, page 1
    await sync_to_async(chat_session_delete)(session=session)
    chunks.extend([chunk async for chunk in stream])
    data = json.loads("".join(chunks))
    assert [m["id"] for m in data["messages"]] == [m.pk for m in chat["messages"][:3]]
    assert data["summary_versions"] == [] and data["compression_events"] == []
    assert data["summary"]["version"] == 2  # the head was read before the delete
    assert not await sync_to_async(SessionSummary.objects.filter(memory_key=memory_key).exists)()


# --- bounded memory: pages -------------------------------------------------------------------


async def test_a_long_chat_streams_page_by_page_and_stops_at_its_snapshot(alice: Visitor, monkeypatch):
    session = await sync_to_async(chat_session_make)(alice.owner)
    for i in range(11):
        await sync_to_async(message_make)(session, "user", f"message {i}")
    reads: list[tuple[int, int]] = []
    real_page = message_list_between

    def recording_page(**kwargs: Any) -> list[Message]:
        page = real_page(**kwargs)
        reads.append((kwargs["limit"], len(page)))
        return page

    monkeypatch.setattr("chatapp.chats.export.message_list_between", recording_page)
    stream = chat_export_stream(session=session, export_format=EXPORT_FORMATS["json"], page_size=4)
    chunks = [await anext(stream), await anext(stream)]  # the head, then the start of "messages"
    # A turn stored after the export began is not part of it (the snapshot's upper bound).
    await sync_to_async(message_make)(session, "user", "written during the export")
    chunks.extend([chunk async for chunk in stream])

    assert reads == [(4, 4), (4, 4), (4, 3), (4, 0)]  # never more than a page in memory
    message_chunks = [chunk for chunk in chunks if '"role":"user"' in chunk]
    assert [chunk.count('"role":"user"') for chunk in message_chunks] == [4, 4, 3]
    data = json.loads("".join(chunks))
    assert [m["content"] for m in data["messages"]] == [f"message {i}" for i in range(11)]


async def test_the_response_is_streamed(alice: Visitor):
    session = await sync_to_async(chat_session_make)(alice.owner)
    await sync_to_async(message_make)(session, "user", "hello")
    client = AsyncClient()
    client.cookies = alice.client.cookies
    response: Any = await client.get(export_url(session.pk, "md"))
    # An async iterator: Django's ASGI handler sends it chunk by chunk instead of collecting it.
    assert isinstance(response, StreamingHttpResponse) and response.is_async
    _, body = await download(alice, export_url(session.pk, "md"))
    assert "> hello" in body.decode()


# --- file name and the page's link ------------------------------------------------------------


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        ("", "chat-{id}.json"),
        ("数据加密", "chat-{id}.json"),
        ('Q3 "plan" ../../etc/passwd; rm -rf', "chat-{id}-q3-plan-etcpasswd-rm-rf.json"),
        ("x" * 300, "chat-{id}-" + "x" * 60 + ".json"),
    ],
)
def test_the_file_name_is_safe_ascii(alice: Visitor, title: str, expected: str):
    session = chat_session_make(alice.owner, title=title[:200])
    name = chat_export_filename(session=session, export_format=EXPORT_FORMATS["json"])
    assert name == expected.format(id=session.pk)
    assert all(c.isascii() and (c.isalnum() or c in "-.") for c in name)


def test_the_chat_page_links_both_exports(alice: Visitor):
    session = chat_session_make(alice.owner)
    page = alice.client.get(reverse("session-detail", kwargs={"session_id": session.pk})).content.decode()
    assert f'href="/s/{session.pk}/export.md" download' in page
    assert f'href="/s/{session.pk}/export.json" download' in page


def test_superseded_state_wins_over_hidden():
    fact = KeyFact(
        id=1, kind="id", key="k", value="v", text="", source_message_id=None,
        invalidated_at=timezone.now() - timedelta(seconds=1), hidden_by_user=True,
    )  # fmt: skip
    assert export_module.key_fact_state(fact) == "superseded"


def test_page_reads_refuse_an_empty_page(alice: Visitor):
    session = chat_session_make(alice.owner)
    with pytest.raises(ValueError, match="limit must be at least 1"):
        message_list_between(session_id=session.pk, after_id=0, up_to_id=10, limit=0)
    with pytest.raises(ValueError, match="limit must be at least 1"):
        compression_event_list_after(memory_key=memory_key_of(session.pk), after_id=0, up_to_id=10, limit=0)
