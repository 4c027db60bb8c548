"""Search across chats from the sidebar, in a real browser against a real Daphne server with the offline engine:
typing shows the owner's matches from another chat with the match marked and markup escaped; a match opens its
chat scrolled to the message, marked and focused; another visitor finds nothing; axe finds no serious violation in
either theme.

``SCREENSHOT_DIR=docs pytest tests/browser -k search`` also saves ``screenshot-search.png``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from tests.browser.conftest import Server
from tests.browser.test_accessibility_browser import axe_violations, theme_set
from tests.browser.test_chat_page import ask, chat_open

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]

FACT = "My locker at the <b>Zephyrine</b> gym has code 4711."
FILLER = [f"Note {n}: the weather was mild and the trains ran on time." for n in range(1, 5)]


def test_typing_in_the_sidebar_finds_another_chat_and_jumps_to_the_message(daphne_server: Server, new_context: Context):
    page = new_context(viewport={"width": 1280, "height": 640}).new_page()
    first = chat_open(page, daphne_server, mode="Quick answer")
    ask(page, FACT)
    for text in FILLER:
        ask(page, text)
    title = page.locator("#chat-title").inner_text()
    target = page.locator("#messages article.user").first
    message_id = target.get_attribute("data-id")

    chat_open(page, daphne_server, mode="Quick answer")
    ask(page, "Something else entirely.")
    box = page.get_by_role("searchbox", name="Search your chats")
    box.press_sequentially("zephyr", delay=40)  # a word still being typed matches as a prefix
    hit = page.locator(f'#search-results .search-hit[data-message-id="{message_id}"]')
    expect(hit).to_have_count(1)
    # The question, and the reply that quotes it: both from the first chat.
    expect(page.locator("#search-results .hit-title")).to_have_text([title] * 2)
    expect(hit.locator(".hit-role")).to_contain_text("You")
    expect(hit.locator("mark")).to_have_text("Zephyrine")
    expect(hit.locator(".hit-snippet")).to_contain_text("<b>")  # markup shown as text, never as an element
    expect(hit.locator(".hit-snippet b")).to_have_count(0)
    assert hit.get_attribute("href") == f"/s/{first.rstrip('/').rsplit('/', 1)[-1]}/#message-{message_id}"

    for theme in ("dark", "light"):
        theme_set(page, theme)
        assert axe_violations(page) == [], theme

    if directory := os.environ.get("SCREENSHOT_DIR"):
        page.screenshot(path=str(Path(directory) / "screenshot-search.png"))

    hit.click()
    page.wait_for_selector("#chat-page[data-ws='open']")
    expect(page.locator("#chat-title")).to_have_text(title)
    jumped = page.locator(f"#message-{message_id}")
    expect(jumped).to_have_class("message user status-complete jump-target")
    expect(jumped).to_be_in_viewport()
    expect(jumped).to_be_focused()
    expect(page.locator(".message.jump-target")).to_have_count(1)

    # Bad input says so; another visitor finds nothing of this one's.
    box = page.get_by_role("searchbox", name="Search your chats")
    box.fill('"*()')
    expect(page.locator("#search-results")).to_contain_text("Nothing to search for")
    stranger = new_context().new_page()
    stranger.goto(daphne_server.url + "/")
    stranger.get_by_role("searchbox", name="Search your chats").press_sequentially("zephyrine")
    expect(stranger.locator("#search-results")).to_contain_text("No message of yours holds all of")
    expect(stranger.locator("#search-results .search-hit")).to_have_count(0)
