"""Copy buttons and highlighted code blocks, in a real browser against a real Daphne server with
the offline engine: every message and every code block has a keyboard-reachable "Copy" button
that says "Copied" (the Clipboard API, and the fallback where the page may not use it); fenced
code is highlighted by the server with classes, under a head naming its language.

``SCREENSHOT_DIR=docs pytest tests/browser -k code_block`` also saves ``screenshot-code.png``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import ask, chat_open

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]

CODE = "def total(items):\n    return sum(items)  # every item\n"
MESSAGE = f"Is this right?\n\n```python\n{CODE}```"
# The text of the page's one copy event: what execCommand("copy") copied from the selection.
COPY_EVENTS = """() => {
    window.__copied = [];
    document.addEventListener("copy", (event) => {
        const area = event.target;
        window.__copied.push(area.value.substring(area.selectionStart, area.selectionEnd));
    });
    Object.defineProperty(navigator, "clipboard", {value: undefined, configurable: true});
}"""


def test_code_blocks_are_highlighted_and_messages_and_code_blocks_copy(daphne_server: Server, new_context: Context):
    context = new_context(viewport={"width": 1440, "height": 900}, permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    chat_open(page, daphne_server, mode="Quick answer")
    ask(page, MESSAGE)
    asked = page.locator("#messages article.user").first

    # Highlighted by the server: token classes, no inline style, under a head naming the language.
    block = asked.locator(".content .code-block")
    expect(block.locator(".code-lang")).to_have_text("python")
    keyword, comment = block.locator(".highlight .k").first, block.locator(".highlight .c1").first
    expect(keyword).to_have_text("def")
    expect(comment).to_have_text("# every item")
    assert asked.locator(".content [style]").count() == 0
    colours = {
        part.evaluate("element => getComputedStyle(element).color")
        for part in (keyword, comment, block.locator(".highlight .n").first)
    }
    assert len(colours) == 3, colours  # a keyword, a comment and a name each look different

    # The code block's button copies the code alone (Clipboard API).
    code_button = block.get_by_role("button", name="Copy the code")
    code_button.click()
    expect(code_button).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == CODE
    expect(code_button).to_have_text("Copy")  # back after a moment

    # The message's button, from the keyboard, copies the message as written (its Markdown).
    message_button = asked.locator(".message-meta").get_by_role("button", name="Copy message")
    message_button.focus()
    page.keyboard.press("Enter")
    expect(message_button).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == MESSAGE
    # Every stored message with text has one, the assistant's reply too.
    reply = page.locator("#messages article.assistant").last
    expect(reply.locator(".message-meta .copy-message")).to_have_count(1)
    reply.locator(".message-meta .copy-message").press("Space")
    expect(reply.locator(".message-meta .copy-message")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()").strip() == reply.locator(".content").inner_text().strip()

    if directory := os.environ.get("SCREENSHOT_DIR"):
        code_button.click()
        expect(code_button).to_have_text("Copied")
        asked.scroll_into_view_if_needed()
        asked.screenshot(path=str(Path(directory) / "screenshot-code.png"))


def test_copy_falls_back_to_the_selection_without_the_clipboard_api(daphne_server: Server, new_context: Context):
    page = new_context().new_page()
    chat_open(page, daphne_server, mode="Quick answer")
    ask(page, MESSAGE)
    page.evaluate(COPY_EVENTS)
    button = page.locator("#messages article.user .code-block").get_by_role("button", name="Copy the code")
    button.focus()
    page.keyboard.press("Enter")
    expect(button).to_have_text("Copied")
    assert page.evaluate("window.__copied") == [CODE]
    expect(button).to_be_focused()  # the hidden text area it copied from gave focus back
