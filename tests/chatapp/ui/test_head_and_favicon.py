"""``HEAD`` on the pages (uptime probes, link checkers) and the favicon: ``HEAD /`` answers 200
without creating a browser session, every read-only page answers ``HEAD`` like ``GET`` (still
404 for a chat that is not the caller's), and ``/favicon.ico`` leads to the SVG icon the pages
link."""

from __future__ import annotations

from xml.etree import ElementTree

import pytest
from django.conf import settings
from django.contrib.sessions.models import Session
from django.contrib.staticfiles import finders
from django.test import Client
from django.urls import reverse

from tests.chatapp.conftest import Visitor, chat_session_make

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("offline_engine")]


def test_head_of_the_start_page_is_200_and_creates_no_session():
    client = Client()
    response = client.head("/")
    assert response.status_code == 200
    assert response.content == b""
    assert response["Content-Type"] == "text/html; charset=utf-8"
    assert settings.SESSION_COOKIE_NAME not in response.cookies
    assert not Session.objects.exists()
    # A GET still gives an anonymous visitor their browser session (their chats stay theirs).
    assert client.get("/").status_code == 200
    assert Session.objects.count() == 1


def test_head_answers_like_get_on_read_only_pages(alice: Visitor, bob: Visitor):
    session = chat_session_make(alice.owner)
    detail = reverse("session-detail", kwargs={"session_id": session.pk})
    inspector = reverse("session-inspector", kwargs={"session_id": session.pk})
    for path in (detail, inspector, reverse("kb-index")):
        assert alice.client.head(path).status_code == 200, path
    assert bob.client.head(detail).status_code == 404
    assert Client().head(detail).status_code == 404
    # Actions stay POST-only.
    assert alice.client.head(reverse("session-compress", kwargs={"session_id": session.pk})).status_code == 405


@pytest.mark.parametrize("method", ["get", "head"])
def test_favicon_ico_redirects_to_the_svg_icon(method: str):
    response = getattr(Client(), method)("/favicon.ico")
    assert response.status_code == 302
    assert response["Location"] == f"/{settings.STATIC_URL}favicon.svg".replace("//", "/")
    assert Client().post("/favicon.ico").status_code == 405


def test_the_icon_is_a_small_svg_that_every_page_links():
    path = finders.find("favicon.svg")
    assert path is not None
    with open(path, "rb") as icon:
        data = icon.read()
    assert len(data) < 2048
    root = ElementTree.fromstring(data)
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("viewBox") == "0 0 32 32"
    page = Client().get("/").content.decode()
    assert '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in page
