"""The search across chats over HTTP: htmx gets the results alone, a plain request the page with them; matches are
marked and everything else escaped; links jump to the message; strangers see nothing; any text answers 200."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from chatapp.chats.search import SEARCH_MAX_CHARS
from tests.chatapp.conftest import Visitor, chat_session_make, message_make

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("offline_engine")]

HTMX = {"HX-Request": "true"}
SEARCH = reverse("chat-search")


@pytest.fixture
def secret(alice: Visitor):
    session = chat_session_make(alice.owner, title="<i>Plans</i>")
    return message_make(session, "user", "The <b>kumquat</b> code is 7731 & <script>alert(1)</script>.")


def test_htmx_gets_marked_escaped_results_linking_to_the_message(alice: Visitor, secret):
    response = alice.client.get(SEARCH, {"q": "kumquat"}, headers=HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html and 'id="chat-search-q"' not in html
    assert "<mark>kumquat</mark>" in html
    assert "&lt;/b&gt;" in html and "&amp;" in html and "&lt;script&gt;" in html and "<script>" not in html
    assert "&lt;i&gt;Plans&lt;/i&gt;" in html and "<i>" not in html
    assert f'href="/s/{secret.session_id}/#message-{secret.pk}"' in html
    assert "1 message:" in html


def test_a_plain_request_gets_the_page_with_the_query_in_the_box(alice: Visitor, secret):
    response = alice.client.get(SEARCH, {"q": 'kumquat "<x>'})
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" in html and 'id="chat-search-q"' in html
    assert 'value="kumquat &quot;&lt;x&gt;"' in html
    assert "No message of yours holds all of “kumquat &quot;&lt;x&gt;”." in html
    assert "<mark>kumquat</mark>" in alice.client.get(SEARCH, {"q": "kumquat"}).content.decode()


def test_the_search_box_is_in_every_sidebar(alice: Visitor, secret):
    for path in ("/", f"/s/{secret.session_id}/", "/kb/"):
        html = alice.client.get(path).content.decode()
        assert 'role="search"' in html and 'hx-get="/search/"' in html and 'id="search-results"' in html


def test_strangers_never_see_the_owners_messages(alice: Visitor, bob: Visitor, anon: Visitor, secret):
    for client in (bob.client, anon.client, Client()):
        for headers in (HTMX, {}):
            response = client.get(SEARCH, {"q": "kumquat"}, headers=headers)
            assert response.status_code == 200
            assert b"7731" not in response.content and b"<mark>" not in response.content
            assert b"Plans" not in response.content and b"No message of yours" in response.content
    # The link itself is the owner's only.
    assert bob.client.get(f"/s/{secret.session_id}/").status_code == 404


@pytest.mark.parametrize(
    ("query", "note"),
    [
        ("", None),
        ("   ", None),
        ("x" * (SEARCH_MAX_CHARS + 1), "too long: at most 200 characters"),
        ("x" * 100_000, "too long"),
        ('"*()', "Nothing to search for"),
        ("the is a", "only very common words"),
        ('NEAR("kumquat" 7731', "No message of yours"),
        ("kum\x00quat'", "No message of yours"),
        ("kumquat 77", "1 message"),
    ],
)
def test_any_text_answers_200_with_a_clear_note(alice: Visitor, secret, query: str, note: str | None):
    for headers in (HTMX, {}):
        response = alice.client.get(SEARCH, {"q": query}, headers=headers)
        assert response.status_code == 200
        html = response.content.decode()
        if note is None:
            assert 'data-testid="search-note"' not in html
        else:
            assert note in html


def test_only_get_and_head(alice: Visitor):
    assert alice.client.head(SEARCH, {"q": "x"}).status_code == 200
    assert alice.client.post(SEARCH, {"q": "x"}).status_code == 405
