"""Recall in a real browser (system Chromium, headless) against a real Daphne server (docs/memory.md
§12): what the owner said in one chat is indexed by the memory job; a question in a new chat
recalls it, the inspector's Recall section shows the item with the parts of its score and a link
to the message in the first chat, and the exact text of the request holds the recalled line. A
stranger gets 404 for the section."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import ask, chat_open

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]

SAID = "My locker number is 4471 and the blue umbrella is in locker 12"


def indexed_through(page: Page, message_id: str) -> None:
    """Wait until the memory job's ``index`` step has indexed the chat up to ``message_id`` (the
    job re-renders the inspector when it ends)."""
    row = page.locator("section[aria-labelledby='ins-job'] table.attempts tr", has=page.locator("td", has_text="index"))
    expect(row.locator("td.num").first).to_have_text(f"#{message_id}")
    expect(row).to_have_class("ok")


def test_a_question_in_a_new_chat_recalls_what_the_owner_said_in_another(daphne_server: Server, new_context: Context):
    page = new_context(viewport={"width": 1440, "height": 900}).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    first_url = chat_open(page, daphne_server)
    ask(page, SAID)
    said = page.locator("#messages article.user").last.get_attribute("data-id")
    reply = page.locator("#messages article.assistant").last.get_attribute("data-id")
    assert said and reply
    indexed_through(page, reply)

    second_url = chat_open(page, daphne_server)
    assert second_url != first_url
    ask(page, "Where is the blue umbrella?")
    recall = page.get_by_test_id("recall")
    expect(recall.get_by_test_id("recall-query")).to_have_text("Where is the blue umbrella?")
    # The owner's message (the offline engine's reply, which repeats it, may be recalled too).
    item = recall.get_by_test_id("recall-items").locator("li.role-user", has_text=SAID)
    expect(item).to_have_count(1)
    link = item.get_by_test_id("recall-link")
    expect(link).to_have_attribute(
        "href", re.compile(rf"^{re.escape(first_url.removeprefix(daphne_server.url))}#message-{said}$")
    )
    expect(link).to_contain_text(f"message #{said}")
    expect(item.get_by_test_id("recall-score")).to_contain_text(
        re.compile(r"lexical\srank\s\d+ · cosine\s.+ · decay\s1\.000 · score\s0\.\d+")
    )
    expect(item.get_by_test_id("recall-reason")).not_to_be_empty()
    # The embedder in use is named, or lexical-only is said plainly.
    expect(recall.get_by_test_id("recall-embedder")).to_contain_text(re.compile(r"Embedder: |Lexical only"))

    # The request's exact text holds the recalled line, after the summary's place.
    expect(page.locator("#ins-request-panel tr[data-section='recall'] td.num").first).not_to_have_text("0")
    page.locator("#sent-recall summary").click()
    sent = page.locator("#sent-recall-text")
    expect(sent).to_contain_text("[Recalled from earlier — verbatim, may be outdated]")
    expect(sent).to_contain_text(re.compile(rf"\(chat \".*\", msg {said}\) User: {re.escape(SAID)}"))

    # The link leads to the message in the first chat.
    link.click()
    page.wait_for_url(re.compile(rf"#message-{said}$"))
    expect(page.locator(f"#message-{said}")).to_contain_text(SAID)
    assert page.url.startswith(first_url)
    assert not errors, errors


def test_a_stranger_gets_404_for_the_recall_section(daphne_server: Server, new_context: Context):
    owner = new_context().new_page()
    url = chat_open(owner, daphne_server)
    ask(owner, "The green kayak is at dock 7.")
    stranger = new_context().new_page()
    stranger.goto(daphne_server.url + "/")
    for headers in ({}, {"HX-Request": "true"}):
        response = stranger.request.get(f"{url}recall/", headers=headers)
        assert response.status == 404 and "kayak" not in response.text()
    assert owner.request.get(f"{url}recall/", headers={"HX-Request": "true"}).status == 200
