"""A knowledge-base search that found nothing is no memory, in a real browser against a real Daphne server with
the offline engine: after "Compress now" the summary does not hold it, and a later question is not answered with it
(docs/memory.md §12, "Results that found nothing")."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import BrowserContext, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import FINAL_REPLIES, ask, chat_open, htmx_idle

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]


def test_a_search_that_found_nothing_is_neither_summarized_nor_quoted_later(
    daphne_server: Server, new_context: Context
):
    page = new_context(viewport={"width": 1440, "height": 900}).new_page()
    chat_open(page, daphne_server)
    ask(page, "Search the knowledge base for zebra migration.")
    expect(page.locator(FINAL_REPLIES).last).to_contain_text("found nothing")
    ask(page, "My locker code is 4711 and my desk is in room B12.")
    ask(page, "What does the knowledge base say about the Team plan price?")
    page.get_by_role("button", name="Compress now").click()
    expect(page.locator("#inspector[data-summary-version='1']")).to_be_attached()
    htmx_idle(page)
    page.locator("#summary-text summary").click()
    summary = page.get_by_test_id("summary-content")
    expect(summary).to_contain_text("zebra migration")  # the question is remembered
    expect(summary).not_to_contain_text("no passages found")  # the empty result is not

    ask(page, "What is known about zebra migration?")
    expect(page.locator(FINAL_REPLIES).last).not_to_contain_text("no passages found")
