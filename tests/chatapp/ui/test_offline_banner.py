"""The offline banner says plainly what the offline engine can and cannot do (docs/memory.md §6)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("offline_engine")]


def banner_text(client: Client) -> str:
    html = client.get("/").content.decode()
    match = re.search(r'<div id="offline-banner"[^>]*>(?P<body>.*?)</div>', html, re.S)
    assert match is not None, "no offline banner"
    return " ".join(re.sub(r"<[^>]+>", " ", match["body"]).split())


def test_the_banner_says_what_the_offline_engine_answers_from_and_what_it_cannot_do():
    text = banner_text(Client())

    assert "Offline engine in use" in text and "context window 4096 tokens" in text
    for can in ("key facts, summary, recalled and recent messages", "knowledge base", "calculates"):
        assert can in text
    assert "does not reason or write new text" in text and "visibly forgotten" in text
    assert "LLM_BASE_URL" in text


def test_a_configured_model_shows_no_banner(settings):
    settings.LLM_CHAT_BASE_URL = "http://127.0.0.1:9/v1"

    assert 'id="offline-banner"' not in Client().get("/").content.decode()
