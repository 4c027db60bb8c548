"""The transcript's badges agree with the inspector's "Last request" panel after the memory job's
pre-compression, live, after a reload and after the next request, in a real browser against a
real Daphne server with the offline engine."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import QUESTIONS, ask, chat_open, htmx_idle

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]

# Every transcript message's id and mark, the last request's summary boundary and the stored one.
PAGE_STATE = """() => ({
    marks: Array.from(document.querySelectorAll('#messages article[data-id]'))
        .map((article) => [Number(article.dataset.id), article.querySelector('.mark').dataset.mark]),
    sent: document.querySelector('[data-testid=request-summary]').dataset.boundary,
    stored: document.querySelector('[data-testid=summary-boundary]').dataset.boundary,
})"""


def job_done(page: Page) -> None:
    expect(page.get_by_test_id("memory-job")).to_have_text(re.compile("^(idle|failed)$"))
    htmx_idle(page)


def badges_agree_with_the_inspector(page: Page) -> tuple[int, int]:
    """Checks "in summary" badges against the last request's boundary and "next request: in summary"
    against what was folded since; returns the two boundaries."""
    state = page.evaluate(PAGE_STATE)
    sent, stored = int(state["sent"] or 0), int(state["stored"] or 0)
    marks = dict(state["marks"])
    assert [i for i, mark in marks.items() if mark == "summarized"] == [i for i in marks if i <= sent], state
    assert [i for i, mark in marks.items() if mark == "folded"] == [i for i in marks if sent < i <= stored], state
    for i, mark in marks.items():
        expected = "in summary" if mark == "summarized" else "next request: in summary" if mark == "folded" else None
        if expected:
            expect(page.locator(f"#mark-{i}")).to_have_text(expected)
    return sent, stored


def test_badges_follow_the_last_request_and_mark_what_the_job_folded_since(
    small_window_server: Server, new_context: Context
):
    page = new_context(viewport={"width": 1440, "height": 900}).new_page()
    chat_open(page, small_window_server)
    folded_seen = False
    for question in QUESTIONS:
        ask(page, question)
        job_done(page)
        sent, stored = badges_agree_with_the_inspector(page)
        if sent and stored > sent:  # the job folded more after a request that sent a summary
            folded_seen = True
            break
    assert folded_seen, "the memory job never compressed after a request that carried a summary"
    expect(page.locator("#messages .mark[data-mark='folded']").first).to_be_visible()
    expect(page.get_by_test_id("request-summary")).to_have_text(f"Summary sent: messages up to #{sent}.")

    # A reload shows the same, from the stored state.
    page.reload()
    page.wait_for_selector("#chat-page[data-ws='open']")
    htmx_idle(page)
    assert badges_agree_with_the_inspector(page) == (sent, stored)

    # The next request sends that summary: what was folded is now plainly "in summary".
    ask(page, "search the knowledge base for support hours")
    job_done(page)
    new_sent, _ = badges_agree_with_the_inspector(page)
    assert new_sent >= stored
