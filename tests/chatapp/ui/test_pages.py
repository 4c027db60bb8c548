"""The chat page's endpoints and htmx partials, without a browser: full page versus partial,
steering headers (HX-Trigger, HX-Redirect, out-of-band fragments), and who may use them (404 for
another user and for an anonymous stranger, on every endpoint)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from chatapp.chats.memory import memory_key_of
from chatapp.models import ChatSession, Message, ModelCall
from memory.api import Summary
from memory.models import CompressionEvent, SessionSummary
from memory.storage.summaries import session_summary_get, session_summary_save
from tests.chatapp.conftest import Visitor, chat_session_make, message_make

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("offline_engine")]

HTMX = {"HX-Request": "true"}


def htmx_from(path: str) -> dict[str, str]:
    """The headers htmx sends from the page at ``path``."""
    return {**HTMX, "HX-Current-URL": f"http://testserver{path}"}


def url(name: str, session: ChatSession) -> str:
    return reverse(name, kwargs={"session_id": session.pk})


def history_make(session: ChatSession, pairs: int) -> list[Message]:
    """``pairs`` finished turns of plain chat, then one open question."""
    made: list[Message] = []
    for i in range(pairs):
        made.append(message_make(session, "user", f"Fact {i}: locker {i} has code {1000 + i}."))
        made.append(message_make(session, "assistant", f"Noted, locker {i} is {1000 + i}.", reply_to=made[-1]))
    made.append(message_make(session, "user", "Which code does locker 0 have?"))
    return made


# --- who may use what: every session endpoint answers 404 to strangers ------------------------

SESSION_ENDPOINTS: list[tuple[str, str, dict[str, Any]]] = [
    ("get", "session-detail", {}),
    ("get", "session-item", HTMX),
    ("get", "session-inspector", {}),
    ("get", "session-inspector", HTMX),
    ("get", "session-recall", {}),
    ("get", "session-recall", HTMX),
    ("get", "session-rename", {}),
    ("get", "session-rename", HTMX),
    ("post", "session-rename", HTMX),
    ("get", "session-delete", {}),
    ("post", "session-delete", HTMX),
    ("post", "session-delete", {}),
    ("post", "session-mode", HTMX),
    ("post", "session-compress", HTMX),
    ("post", "session-compress", {}),
]
POST_DATA = {"session-rename": {"title": "stolen"}, "session-mode": {"mode": "quick-answer"}}


@pytest.mark.parametrize(("method", "name", "headers"), SESSION_ENDPOINTS)
@pytest.mark.parametrize("owner_kind", ["user", "anonymous"])
def test_every_session_endpoint_is_404_for_strangers(
    alice: Visitor, bob: Visitor, anon: Visitor, anon2: Visitor, owner_kind: str, method: str, name: str, headers: dict
):
    owner, others = (alice, [bob, anon]) if owner_kind == "user" else (anon, [anon2, alice])
    session = chat_session_make(owner.owner, title="secret plans")
    history_make(session, 1)
    for stranger in [*others, None]:
        client = stranger.client if stranger else Client()
        response = getattr(client, method)(url(name, session), POST_DATA.get(name, {}), headers=headers)
        assert response.status_code == 404, (name, stranger)
        assert b"secret plans" not in response.content
    session.refresh_from_db()
    assert session.title == "secret plans" and session.mode == ChatSession.Mode.AGENT
    assert not SessionSummary.objects.exists()
    # ... and the owner gets through.
    response = getattr(owner.client, method)(url(name, session), POST_DATA.get(name, {}), headers=headers)
    assert response.status_code in (200, 302), name


@pytest.mark.parametrize("name", ["session-rename", "session-delete", "session-mode", "session-compress"])
def test_actions_need_the_csrf_token(alice: Visitor, name: str):
    session = chat_session_make(alice.owner)
    client = Client(enforce_csrf_checks=True)
    client.cookies = alice.client.cookies
    assert client.post(url(name, session), POST_DATA.get(name, {}), headers=HTMX).status_code == 403
    assert ChatSession.objects.filter(pk=session.pk).exists()


# --- the chat page and its partials ----------------------------------------------------------


def test_the_chat_page_has_the_socket_the_inspector_and_the_marks(alice: Visitor):
    session = chat_session_make(alice.owner, title="Plans")
    history_make(session, 1)
    content = alice.client.get(url("session-detail", session)).content.decode()
    assert f'ws-connect="/ws/chat/{session.pk}/page/"' in content and 'hx-ext="ws"' in content
    assert 'id="inspector"' in content and "No request yet" in content
    assert "/static/django_htmx/htmx-2.min.js" in content and "/static/django_htmx/ext/hx-ws-2.min.js" in content
    assert 'data-testid="offline-banner"' in content
    assert 'aria-current="page"' in content  # the open chat in the sidebar


def test_the_inspector_is_a_partial_for_htmx_and_the_page_otherwise(alice: Visitor):
    session = chat_session_make(alice.owner)
    partial = alice.client.get(url("session-inspector", session), headers=HTMX)
    assert partial.status_code == 200
    text = partial.content.decode().strip()
    assert text.startswith('<aside id="inspector"') and "<html" not in text and "hx-swap-oob" not in text
    page = alice.client.get(url("session-inspector", session)).content.decode()
    assert "<html" in page and 'id="inspector"' in page and 'id="composer"' in page


def test_messages_render_safe_markdown_tool_blocks_and_status(alice: Visitor):
    session = chat_session_make(alice.owner)
    user = message_make(session, "user", "Show **bold** and <img src=x onerror=alert(1)>")
    call = {"id": "c1", "type": "function", "function": {"name": "kb_search", "arguments": '{"query": "price"}'}}
    message_make(session, "assistant", None, tool_calls=[call], reply_to=user)
    message_make(session, "tool", "Team plan: 12 euros", tool_call_id="c1", name="kb_search", reply_to=user)
    message_make(session, "assistant", "```\nif a < b:\n    pass\n```", reply_to=user, status=Message.Status.STOPPED)
    content = alice.client.get(url("session-detail", session)).content.decode()
    assert "<strong>bold</strong>" in content and "<img" not in content and "&lt;img src=x" in content
    assert '<details id="tool-call-' in content and "Calls <code>kb_search</code>" in content
    assert '"query": "price"' in content or "&quot;query&quot;: &quot;price&quot;" in content
    assert "Result of <code>kb_search</code>" in content and "Team plan: 12 euros" in content
    assert "<pre><span></span><code>if a &lt; b:" in content and "Stopped by the user" in content


def test_transcript_marks_follow_the_boundary_and_the_last_request(alice: Visitor):
    session = chat_session_make(alice.owner)
    made = history_make(session, 3)
    boundary = made[1].pk
    session_summary_save(
        memory_key=memory_key_of(session.pk),
        expected_version=0,
        new=Summary(content="s", summary_type="llm", last_message_id=boundary, compressed_count=2),
        token_count=1,
    )
    sources: list[dict[str, Any]] = [{"id": None, "kind": "system"}, {"id": None, "kind": "summary"}]
    sources += [{"id": m.pk, "kind": "history"} for m in made[2:-1]] + [{"id": made[-1].pk, "kind": "current"}]
    context = context_make(sources=sources, tokens=100)
    context["summary"]["last_message_id"] = boundary  # the request sent that summary
    ModelCall.objects.create(
        session=session,
        reply_to=made[-1],
        mode="agent",
        model="m",
        estimated_tokens=100,
        context=context,
    )
    content = alice.client.get(url("session-detail", session)).content.decode()
    assert f'data-testid="request-summary" data-boundary="{boundary}"' in content
    assert f'id="mark-{made[0].pk}" class="mark" data-mark="summarized"' in content
    assert f'id="mark-{made[1].pk}" class="mark" data-mark="summarized"' in content
    assert f'id="mark-{made[2].pk}" class="mark" data-mark="retained"' in content
    assert f'id="mark-{made[-1].pk}" class="mark" data-mark="current"' in content


def context_make(*, sources: list[dict], tokens: int, prompt: str = "You help.") -> dict[str, Any]:
    """A ``ModelCall.context`` as the engine stores it (texts are placeholders)."""
    messages = [{"role": "system", "content": prompt}] + [
        {"role": "user", "content": f"message {s['id']}"} for s in sources[1:]
    ]
    return {
        "messages": messages,
        "sources": sources,
        "tokens": tokens,
        "sections": {"system": 20, "summary": 10, "retained": 40, "current": 17, "tools": 10},
        "context_window": 2048,
        "trigger_tokens": 1024,
        "target_tokens": 614,
        "summary": {"type": "llm", "content": "s", "last_message_id": None, "compressed_count": 0, "version": 1},
        "events": [],
        "elisions": [],
        "repairs": [],
        "overflow": False,
        "tools": [{"type": "function", "function": {"name": "kb_search"}}],
    }


# --- rename, delete, mode ----------------------------------------------------------------------


def test_rename_with_htmx_swaps_the_sidebar_entry_and_the_open_title(alice: Visitor):
    session = chat_session_make(alice.owner, title="Old")
    form = alice.client.get(url("session-rename", session), headers=HTMX).content.decode()
    assert form.strip().startswith(f'<li id="session-item-{session.pk}"') and 'name="title"' in form
    assert "autofocus" in form
    page = url("session-detail", session)
    response = alice.client.post(url("session-rename", session), {"title": "  New   name "}, headers=htmx_from(page))
    text = response.content.decode()
    session.refresh_from_db()
    assert response.status_code == 200 and session.title == "New name"
    assert text.strip().startswith(f'<li id="session-item-{session.pk}"') and "New name" in text
    assert '<h1 id="chat-title" hx-swap-oob="true">New name</h1>' in text
    # From another page the title of the open chat is not touched.
    other = alice.client.post(url("session-rename", session), {"title": "Again"}, headers=htmx_from("/"))
    assert "chat-title" not in other.content.decode()


def test_a_bad_title_is_422_for_htmx_and_400_otherwise(alice: Visitor):
    session = chat_session_make(alice.owner, title="Keep")
    too_long = {"title": "x" * 201}
    htmx = alice.client.post(url("session-rename", session), too_long, headers=HTMX)
    assert htmx.status_code == 422 and b'aria-invalid="true"' in htmx.content
    assert alice.client.post(url("session-rename", session), too_long).status_code == 400
    session.refresh_from_db()
    assert session.title == "Keep"


def test_plain_rename_redirects_to_the_chat(alice: Visitor):
    session = chat_session_make(alice.owner)
    response = alice.client.post(url("session-rename", session), {"title": "Plain"})
    assert response.status_code == 302 and response["Location"] == url("session-detail", session)


def test_delete_removes_messages_and_memory(alice: Visitor):
    session = chat_session_make(alice.owner, title="Doomed")
    history_make(session, 2)
    key = memory_key_of(session.pk)
    SessionSummary.objects.create(memory_key=key, content="s", summary_type="llm", last_message_id=1, version=1)
    CompressionEvent.objects.create(
        memory_key=key,
        kind="compression",
        mode="agent",
        context_window=1,
        trigger_tokens=1,
        target_tokens=1,
        tokens_before=1,
        tokens_after=1,
    )
    keep = chat_session_make(alice.owner, title="Keeper")
    response = alice.client.post(url("session-delete", session), headers=htmx_from(url("session-detail", keep)))
    text = response.content.decode()
    assert response.status_code == 200 and text.strip().startswith('<ul class="sessions" id="session-list">')
    assert "Keeper" in text and "Doomed" not in text
    assert f'<li id="session-item-{keep.pk}" class="session-item current"' in text  # still the open chat
    assert not ChatSession.objects.filter(pk=session.pk).exists()
    assert not Message.objects.filter(session_id=session.pk).exists()
    assert not SessionSummary.objects.filter(memory_key=key).exists()
    assert not CompressionEvent.objects.filter(memory_key=key).exists()


def test_deleting_the_open_chat_redirects_the_client(alice: Visitor):
    session = chat_session_make(alice.owner)
    response = alice.client.post(url("session-delete", session), headers=htmx_from(url("session-detail", session)))
    assert response.status_code == 200 and response["HX-Redirect"] == "/"


def test_delete_without_javascript_confirms_first(alice: Visitor):
    session = chat_session_make(alice.owner, title="Confirm me")
    page = alice.client.get(url("session-delete", session))
    assert page.status_code == 200 and b"Delete this chat" in page.content
    assert ChatSession.objects.filter(pk=session.pk).exists()
    response = alice.client.post(url("session-delete", session))
    assert response.status_code == 302 and response["Location"] == "/"
    assert not ChatSession.objects.filter(pk=session.pk).exists()


def test_mode_switch_returns_the_switch_the_sidebar_entry_and_an_announcement(alice: Visitor):
    session = chat_session_make(alice.owner)
    response = alice.client.post(url("session-mode", session), {"mode": "quick-answer"}, headers=HTMX)
    text = response.content.decode()
    session.refresh_from_db()
    assert response.status_code == 200 and session.mode == ChatSession.Mode.QUICK_ANSWER
    assert text.strip().startswith('<form id="mode-form"') and 'value="quick-answer" checked' in text
    assert f'<li id="session-item-{session.pk}" class="session-item current" hx-swap-oob="true">' in text
    assert 'id="announce"' in text and "Quick answer" in text
    bad = alice.client.post(url("session-mode", session), {"mode": "chaos"}, headers=HTMX)
    assert bad.status_code == 422
    assert alice.client.post(url("session-mode", session), {"mode": "agent"}).status_code == 302


# --- compress now ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("db_connections_closed")
def test_compress_now_folds_history_and_returns_the_inspector(alice: Visitor):
    session = chat_session_make(alice.owner)
    made = history_make(session, 3)
    response = alice.client.post(url("session-compress", session), headers=HTMX)
    text = response.content.decode()
    state = session_summary_get(memory_key=memory_key_of(session.pk))
    assert response.status_code == 200 and text.strip().startswith('<aside id="inspector"')
    assert state.version == 1 and state.last_message_id == made[-2].pk and state.compressed_count == 6
    assert 'data-summary-version="1"' in text and "<strong>v1</strong>" in text
    announcement = json.loads(response["HX-Trigger-After-Swap"])["chat:announce"]["text"]
    assert "6 messages folded into the summary" in announcement and 'id="announce"' not in text
    event = CompressionEvent.objects.get(memory_key=memory_key_of(session.pk))
    assert any("requested by the user" in note for note in event.notes)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("db_connections_closed")
def test_compress_now_without_a_question_does_nothing(alice: Visitor):
    session = chat_session_make(alice.owner)
    response = alice.client.post(url("session-compress", session), headers=HTMX)
    assert response.status_code == 200 and "Nothing to compress yet" in response["HX-Trigger-After-Swap"]
    assert not SessionSummary.objects.exists()
    plain = alice.client.post(url("session-compress", session))
    assert plain.status_code == 302 and plain["Location"] == url("session-detail", session)
