"""Pages for owners, other users and anonymous strangers (404 for anything not yours)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.sessions.models import Session
from django.test import Client

from chatapp.models import ChatSession
from tests.chatapp.conftest import Visitor, chat_session_make, message_make

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("offline_engine")]


def test_first_visit_creates_a_browser_session_and_shows_the_offline_banner():
    client = Client()
    response = client.get("/")
    assert response.status_code == 200
    assert settings.SESSION_COOKIE_NAME in response.cookies
    assert b'data-testid="offline-banner"' in response.content
    # The next request keeps the same browser session, so what it creates stays its own.
    response = client.post("/s/new/", {"mode": "quick-answer"})
    session = ChatSession.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/s/{session.pk}/"
    assert session.owner is None and session.owner_session_key == client.cookies[settings.SESSION_COOKIE_NAME].value
    assert client.get(f"/s/{session.pk}/").status_code == 200


def test_post_without_a_prior_visit_still_gets_an_owner():
    client = Client()
    response = client.post("/s/new/", {"mode": "agent"})
    session = ChatSession.objects.get()
    assert response.status_code == 302 and session.mode == "agent"
    assert client.get(f"/s/{session.pk}/").status_code == 200


def test_a_user_creates_sessions_they_own(alice: Visitor):
    alice.client.post("/s/new/", {"mode": "agent"})
    assert ChatSession.objects.get().owner_id == alice.owner.user_id


@pytest.mark.parametrize("mode", ["", "chaos", "AGENT"])
def test_a_bad_mode_is_a_400_and_creates_nothing(alice: Visitor, mode: str):
    response = alice.client.post("/s/new/", {"mode": mode})
    assert response.status_code == 400 and not ChatSession.objects.exists()


def test_methods_are_restricted(alice: Visitor):
    assert alice.client.get("/s/new/").status_code == 405
    assert alice.client.post("/").status_code == 405


@pytest.mark.parametrize("owner_kind", ["user", "anonymous"])
def test_the_chat_page_is_only_for_its_owner(
    alice: Visitor, bob: Visitor, anon: Visitor, anon2: Visitor, owner_kind: str
):
    owner, others = (alice, [bob, anon]) if owner_kind == "user" else (anon, [anon2, alice])
    session = chat_session_make(owner.owner, title="secret plans")
    message_make(session, "user", "my locker code is 4711")
    page = owner.client.get(f"/s/{session.pk}/")
    assert page.status_code == 200 and b"my locker code is 4711" in page.content
    for stranger in [*others, None]:
        client = stranger.client if stranger else Client()
        response = client.get(f"/s/{session.pk}/")
        assert response.status_code == 404 and b"4711" not in response.content


def test_unknown_sessions_are_404(alice: Visitor):
    assert alice.client.get("/s/424242/").status_code == 404


def test_the_list_shows_only_your_sessions(alice: Visitor, bob: Visitor, anon: Visitor):
    chat_session_make(alice.owner, title="alice chat")
    chat_session_make(bob.owner, title="bob chat")
    chat_session_make(anon.owner, title="anon chat")
    for visitor, own in [(alice, b"alice chat"), (bob, b"bob chat"), (anon, b"anon chat")]:
        content = visitor.client.get("/").content
        assert own in content
        assert sum(title in content for title in (b"alice chat", b"bob chat", b"anon chat")) == 1


def test_message_text_is_escaped(alice: Visitor):
    session = chat_session_make(alice.owner)
    message_make(session, "user", "<script>alert('x')</script>")
    content = alice.client.get(f"/s/{session.pk}/").content
    assert b"<script>alert" not in content and b"&lt;script&gt;alert" in content


def test_a_stale_session_cookie_owns_nothing(anon: Visitor):
    session = chat_session_make(anon.owner)
    Session.objects.all().delete()  # the browser session expired or was deleted
    assert anon.client.get(f"/s/{session.pk}/").status_code == 404
