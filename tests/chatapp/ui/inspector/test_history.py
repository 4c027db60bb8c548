"""The inspector's history: any earlier request of a chat, paged, with the compressions recorded between it and the
request before; only the owner's, 404 for a request of another chat or a malformed id."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from chatapp.chats.access import Owner
from chatapp.chats.memory import memory_key_of
from chatapp.models import ChatSession, ModelCall
from chatapp.ui.inspector.history import request_history_get
from memory.models import CompressionEvent
from tests.chatapp.conftest import Visitor, chat_session_make, message_make
from tests.chatapp.ui.test_pages import context_make

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("offline_engine")]


def call_make(session: ChatSession, tokens: int) -> ModelCall:
    question = message_make(session, "user", f"Question at {tokens} tokens?")
    sources: list[dict[str, Any]] = [{"id": None, "kind": "system"}, {"id": question.pk, "kind": "current"}]
    return ModelCall.objects.create(
        session=session,
        reply_to=question,
        mode="agent",
        model="m",
        estimated_tokens=tokens,
        context=context_make(sources=sources, tokens=tokens),
    )


def event_make(session: ChatSession, *, origin: str, boundary: int) -> CompressionEvent:
    return CompressionEvent.objects.create(
        memory_key=memory_key_of(session.pk),
        kind="compression",
        mode="agent",
        context_window=2048,
        trigger_tokens=1024,
        target_tokens=614,
        tokens_before=1500,
        tokens_after=600,
        messages_summarized=4,
        boundary_after=boundary,
        result_type="llm",
        origin=origin,
    )


@pytest.fixture
def requests(alice: Visitor) -> tuple[ChatSession, list[ModelCall], list[CompressionEvent]]:
    session = chat_session_make(alice.owner, title="Long chat")
    first = call_make(session, 300)
    job = event_make(session, origin="job", boundary=11)
    second = call_make(session, 700)
    inside = event_make(session, origin="request", boundary=22)
    third = call_make(session, 900)
    return session, [first, second, third], [job, inside]


def test_each_request_with_its_neighbours_and_the_compressions_before_it(requests):
    session, (first, second, third), (job, inside) = requests
    newest = request_history_get(session_id=session.pk, model_call_id=None)
    assert newest is not None and newest.request.model_call_id == third.pk
    assert (newest.position, newest.total, newest.earlier_id, newest.later_id) == (3, 3, second.pk, None)
    assert [event.id for event in newest.compressions] == [inside.pk]
    middle = request_history_get(session_id=session.pk, model_call_id=second.pk)
    assert middle is not None and (middle.position, middle.earlier_id, middle.later_id) == (2, first.pk, third.pk)
    assert [(event.id, event.origin) for event in middle.compressions] == [(job.pk, "job")]
    assert middle.request.gauge.used == 700 and (middle.first_id, middle.last_id) == (first.pk, third.pk)
    oldest = request_history_get(session_id=session.pk, model_call_id=first.pk)
    assert oldest is not None and (oldest.position, oldest.earlier_id, oldest.compressions) == (1, None, [])
    other = chat_session_make(Owner(user_id=session.owner_id, session_key=None))
    assert request_history_get(session_id=other.pk, model_call_id=first.pk) is None
    assert request_history_get(session_id=other.pk, model_call_id=None) is None


def test_the_page_pages_back_and_forth(alice: Visitor, requests):
    session, (first, second, third), _ = requests
    url = reverse("session-requests", kwargs={"session_id": session.pk})
    html = alice.client.get(url, {"call": second.pk}).content.decode()
    assert "Request 2 of 3" in html and "This request" in html
    assert f'href="?call={first.pk}" data-testid="request-earlier"' in html
    assert f'href="?call={third.pk}" data-testid="request-later"' in html
    assert "pre-compression (memory job)" in html and "the summary now to message #11" in html
    assert f'href="/s/{session.pk}/#message-{second.reply_to_id}"' in html
    assert "Request 3 of 3" in alice.client.get(url).content.decode()
    assert "Request 3 of 3" in alice.client.get(url, {"call": ""}).content.decode()
    first_page = alice.client.get(url, {"call": first.pk}).content.decode()
    assert "The first request" in first_page and "No compression was recorded" in first_page
    chat = alice.client.get(reverse("session-detail", kwargs={"session_id": session.pk})).content.decode()
    assert f'href="{url}" data-testid="request-history"' in chat


def test_strangers_foreign_requests_and_bad_ids_get_404(alice: Visitor, bob: Visitor, anon: Visitor, requests):
    session, (first, *_), _ = requests
    url = reverse("session-requests", kwargs={"session_id": session.pk})
    for client in (bob.client, anon.client, Client()):
        assert client.get(url).status_code == 404
        assert client.get(url, {"call": first.pk}).status_code == 404
    other = chat_session_make(alice.owner)
    other_url = reverse("session-requests", kwargs={"session_id": other.pk})
    assert alice.client.get(other_url, {"call": first.pk}).status_code == 404
    assert "No request yet" in alice.client.get(other_url).content.decode()
    for bad in ("abc", "-1", "0", "1.5", "٣", str(2**63), "9" * 400):
        assert alice.client.get(url, {"call": bad}).status_code == 404, bad
