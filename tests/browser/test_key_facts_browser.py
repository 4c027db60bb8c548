"""Key facts in a real browser (system Chromium, headless) against a real Daphne server: an order
id the owner typed shows in the inspector's Key facts section, the owner pins it and corrects
its value there, and the next request carries the corrected value in its key-facts block
(docs/memory.md §11); a withdrawn fact leaves the current facts and is shown with the message that
withdrew it (F-46)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import ask, chat_open, htmx_idle

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]


def job_settled(page: Page) -> None:
    """Wait until the memory job that follows a reply has ended (it re-renders the inspector)."""
    expect(page.get_by_test_id("memory-job")).to_have_text(re.compile("^(idle|failed)$"))


def test_the_owner_pins_and_edits_a_fact_and_the_next_request_carries_it(daphne_server: Server, new_context: Context):
    page = new_context(viewport={"width": 1440, "height": 900}).new_page()
    errors: list[str] = []
    # Script errors only: a refused form (422) and the missing favicon (404) also log a line.
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if "htmx" in message.text else None)
    missing: list[str] = []
    page.on("response", lambda response: missing.append(response.url) if response.status == 404 else None)
    chat_open(page, daphne_server)
    page.evaluate("window.__sameDocument = true")  # gone if the page were ever reloaded

    ask(page, "Hi, my name is Ada. My order is #W2378156 and it has not arrived.")
    facts = page.get_by_test_id("key-facts")
    current = facts.get_by_test_id("facts-current")
    order = current.locator("li[data-key='order_id']", has_text="#W2378156")
    expect(order).to_be_visible()
    expect(order.get_by_test_id("fact-extractor")).to_have_text("rule")
    source = order.get_by_test_id("fact-source")
    user_message = page.locator("#messages article.user").last
    expect(source).to_have_attribute("href", "#" + (user_message.get_attribute("id") or "?"))
    # The memory job's extraction (the offline engine's, here) adds what no rule finds, live.
    job_settled(page)
    expect(current.locator("li[data-extractor^='llm:']", has_text="Ada")).to_be_visible()

    # Keep the order id always pinned: the action says what it does, and its title explains it.
    keep = order.get_by_role("button", name="Keep always: order_id #W2378156")
    expect(keep).to_have_text("Keep always")
    expect(keep).to_have_attribute("title", re.compile("in every request"))
    keep.click()
    htmx_idle(page)
    expect(order.get_by_test_id("fact-user-pinned")).to_have_text("always pinned by you")
    expect(order.get_by_role("button", name="Stop keeping always: order_id #W2378156")).to_be_visible()
    expect(page.locator("#announce")).to_have_text("Always pinned: order_id #W2378156.")

    # An empty value is refused and changes nothing.
    order.get_by_label("Edit order_id #W2378156").click()
    field = order.get_by_label("New value of order_id")
    field.fill("   ")
    field.evaluate("input => input.required = false")  # past the browser's own check, to the server's
    order.get_by_role("button", name="Save").click()
    htmx_idle(page)
    expect(facts.get_by_test_id("key-facts-error")).to_have_text("A fact's value cannot be empty.")
    expect(current.locator("li[data-key='order_id']")).to_have_count(1)

    # Correct it: the new value is the user's, the old one is kept as superseded.
    field = order.get_by_label("New value of order_id")
    field.fill("#W2378157")
    order.get_by_role("button", name="Save").click()
    htmx_idle(page)
    edited = current.locator("li[data-key='order_id']", has_text="#W2378157")
    expect(edited).to_be_visible()
    expect(edited.get_by_test_id("fact-extractor")).to_have_text("you")
    expect(edited.get_by_test_id("fact-user-pinned")).to_be_visible()
    expect(current.locator("li[data-key='order_id']").get_by_test_id("fact-value")).to_have_text(["#W2378157"])
    expect(facts.get_by_test_id("key-facts-error")).to_have_count(0)
    facts.locator("#facts-superseded summary").click()
    superseded = facts.get_by_test_id("facts-superseded").locator("li", has_text="#W2378156")
    expect(superseded.get_by_test_id("fact-replaced-by")).to_have_text("#W2378157")

    # The next request carries the corrected value in its key-facts block, right after the
    # system prompt, and the section says the fact was pinned in it.
    ask(page, "Where is my order?")
    sent = page.locator("#sent-facts")
    expect(sent).to_be_attached()
    sent.locator("summary").click()
    block = page.locator("#sent-facts-text")
    # The edited value is the slot's current one (the old value may be named as the one replaced).
    expect(block).to_contain_text(re.compile(r"- order_id: #W2378157\b"))
    expect(block).not_to_contain_text("- order_id: #W2378156")
    expect(current.locator("li[data-key='order_id']", has_text="#W2378157")).to_have_attribute("data-status", "pinned")
    expect(page.locator("#ins-request-panel tr[data-section='facts'] td.num").first).not_to_have_text("0")
    assert page.evaluate("window.__sameDocument") is True
    assert not errors, errors
    assert all(url.endswith("/favicon.ico") for url in missing), missing


def test_a_stranger_cannot_use_the_fact_controls(daphne_server: Server, new_context: Context):
    owner = new_context().new_page()
    url = chat_open(owner, daphne_server)
    ask(owner, "My booking is KX-55190.")
    fact = owner.get_by_test_id("facts-current").locator("li", has_text="KX-55190")
    expect(fact).to_be_visible()
    fact_id = fact.get_attribute("data-fact-id")

    stranger = new_context().new_page()
    stranger.goto(daphne_server.url + "/")
    token = stranger.context.cookies()
    csrf = next((cookie["value"] for cookie in token if cookie["name"] == "csrftoken"), "")
    for action, data in (("pin", "pinned=true"), ("hide", "hidden=true"), ("edit", "value=KX-1")):
        response = stranger.request.post(
            f"{url}facts/{fact_id}/{action}/",
            data=data,
            headers={"Content-Type": "application/x-www-form-urlencoded", "X-CSRFToken": csrf, "HX-Request": "true"},
        )
        assert response.status == 404, action
        assert "KX-55190" not in response.text()
    owner.reload()
    fact = owner.get_by_test_id("facts-current").locator("li", has_text="KX-55190")
    expect(fact).to_be_visible()
    expect(fact.get_by_test_id("fact-user-pinned")).to_have_count(0)


def test_a_withdrawn_fact_leaves_the_current_facts_and_is_marked_with_the_message_that_withdrew_it(
    daphne_server: Server, new_context: Context
):
    page = new_context(viewport={"width": 1440, "height": 900}).new_page()
    chat_open(page, daphne_server)
    ask(page, "My work email is carl.berg@brightwave.example and my personal one is carlberg@mailbox.example.")
    current = page.get_by_test_id("facts-current")
    expect(current.locator("li", has_text="carl.berg@brightwave.example")).to_be_visible()

    ask(page, "Please forget my old work email, I left Brightwave last Friday and that inbox is gone.")
    withdrawing = page.locator("#messages article.user").last
    expect(current.locator("li", has_text="carl.berg@brightwave.example")).to_have_count(0)
    expect(current.locator("li", has_text="carlberg@mailbox.example")).to_be_visible()
    page.locator("#facts-superseded summary").click()
    withdrawn = page.get_by_test_id("facts-superseded").locator("li", has_text="carl.berg@brightwave.example")
    expect(withdrawn).to_have_attribute("data-status", "retracted")
    change = withdrawn.get_by_test_id("fact-change")
    expect(change).to_have_text(re.compile(r"^withdrawn in message #\d+$"))
    expect(change.locator("a")).to_have_attribute("href", "#" + (withdrawing.get_attribute("id") or "?"))
