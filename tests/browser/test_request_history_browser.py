"""The inspector's history in a real browser against a real Daphne server with the offline engine: from the
inspector, page back through a chat's earlier requests, each as it was sent, with the compression made between two
of them, and jump from a request to its question; axe finds no serious violation in either theme.

``SCREENSHOT_DIR=docs pytest tests/browser -k history`` also saves ``screenshot-request-history.png``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from tests.browser.conftest import Server
from tests.browser.test_accessibility_browser import axe_violations, theme_set
from tests.browser.test_chat_page import ask, chat_open, htmx_idle

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]


def test_paging_back_through_earlier_requests_with_the_compression_between(daphne_server: Server, new_context: Context):
    page = new_context(viewport={"width": 1440, "height": 900}).new_page()
    chat_open(page, daphne_server, mode="Quick answer")
    ask(page, "What does the Team plan cost?")
    ask(page, "And the Business plan?")
    page.get_by_role("button", name="Compress now").click()
    expect(page.locator("#announce")).to_contain_text("Memory compressed:")
    htmx_idle(page)
    ask(page, "What is the largest file?")
    latest = page.get_by_test_id("context-used").inner_text()

    page.get_by_test_id("request-history").click()
    expect(page.get_by_test_id("request-position")).to_have_text("Request 3 of 3")
    expect(page.get_by_test_id("context-used")).to_have_text(latest)  # the newest is the inspector's last
    compressions = page.get_by_test_id("request-compressions")
    expect(compressions.locator(".event.kind-compression")).to_have_count(1)
    expect(page.get_by_role("heading", name="This request")).to_be_visible()

    for theme in ("light", "dark"):
        theme_set(page, theme)
        assert axe_violations(page) == [], theme
    theme_set(page, "light")

    if directory := os.environ.get("SCREENSHOT_DIR"):
        page.screenshot(path=str(Path(directory) / "screenshot-request-history.png"), full_page=True)

    page.get_by_test_id("request-earlier").click()
    expect(page.get_by_test_id("request-position")).to_have_text("Request 2 of 3")
    expect(page.get_by_test_id("request-compressions")).to_contain_text("No compression was recorded")
    expect(page.locator("#sent-current-text")).to_contain_text("And the Business plan?")
    page.get_by_test_id("request-earlier").click()
    expect(page.get_by_test_id("request-position")).to_have_text("Request 1 of 3")
    expect(page.get_by_test_id("request-pager")).to_contain_text("The first request")
    expect(page.locator("#sent-current-text")).to_contain_text("What does the Team plan cost?")
    page.get_by_test_id("request-later").click()
    expect(page.get_by_test_id("request-position")).to_have_text("Request 2 of 3")

    # From a request to its question in the chat.
    page.get_by_role("link", name="message #").click()
    page.wait_for_selector("#chat-page[data-ws='open']")
    expect(page.locator(".message.jump-target")).to_contain_text("And the Business plan?")
