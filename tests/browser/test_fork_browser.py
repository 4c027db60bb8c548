"""Edit a sent message into a new chat, in a real browser against a real Daphne server with the offline engine: the
edit opens a new chat holding the history before the message and the edited text, answered; both chats say where
they diverge, and the original is unchanged (docs/memory.md §8, "Edit into a new chat").

``SCREENSHOT_DIR=docs pytest tests/browser -k fork`` also saves ``screenshot-fork.png``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import FINAL_REPLIES, ask, chat_open

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]


def test_editing_a_message_forks_the_chat_and_leaves_the_original_as_it_was(
    daphne_server: Server, new_context: Context
):
    page = new_context(viewport={"width": 1440, "height": 900}).new_page()
    original = chat_open(page, daphne_server)
    ask(page, "My account id is ACC-5151.")
    ask(page, "What does the knowledge base say about encryption at rest?")
    ask(page, "Thanks, that is all.")
    users = page.locator("#messages article.user")
    expect(users).to_have_count(3)
    second_id = users.nth(1).get_attribute("data-id")
    before = page.locator("#messages article").count()

    edit = users.nth(1).locator("details.edit-message")
    edit.locator("summary").click()
    edit.get_by_label("Edited message").fill("What does the knowledge base say about the Team plan price?")
    edit.get_by_role("button", name="Send as a new chat").click()

    # The new chat: the first turn copied, the edited question answered, and a note saying where they diverge.
    page.wait_for_url(lambda url: url != original and re.search(r"/s/\d+/$", url) is not None)
    page.wait_for_selector("#chat-page[data-ws='open']")
    expect(page.locator(FINAL_REPLIES)).to_have_count(2)
    copied = page.locator("#messages article.user")
    expect(copied).to_have_count(2)
    expect(copied.nth(0)).to_contain_text("ACC-5151")
    expect(copied.nth(1)).to_contain_text("Team plan price")
    expect(copied.nth(1).get_by_test_id("edited-mark")).to_be_visible()
    note = page.get_by_test_id("fork-notes")
    expect(note).to_contain_text(f"the same up to your message #{second_id} there")
    expect(page.locator(FINAL_REPLIES).last).not_to_contain_text("encryption")
    if directory := os.environ.get("SCREENSHOT_DIR"):
        page.screenshot(path=str(Path(directory) / "screenshot-fork.png"))
    expect(page.locator(".session-item.current")).to_contain_text(f"(edited at #{second_id})")

    # The original: as it was, with its edited message marked and a link to the copy.
    note.get_by_role("link").click()
    page.wait_for_selector("#chat-page[data-ws='open']")
    assert page.url == original
    expect(page.locator("#messages article")).to_have_count(before)
    expect(page.locator(f"#message-{second_id}").get_by_test_id("forked-mark")).to_be_visible()
    expect(page.get_by_test_id("fork-notes")).to_contain_text(f"Your message #{second_id} was edited into")
