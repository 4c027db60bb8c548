"""Regenerate on the chat page, in a real browser against a real Daphne server with the offline engine: only the
last reply offers it; the new reply replaces the old one in the transcript, says it is version 2 of 2, and the
earlier version can be paged to and back (docs/memory.md §8, "Regenerate").

``SCREENSHOT_DIR=docs pytest tests/browser -k regenerate`` also saves ``screenshot-regenerate.png``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, FilePayload, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import FINAL_REPLIES, ask, chat_open

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]
REGENERATE = re.compile(r"^Regenerate the reply")


def test_regenerate_replaces_the_last_reply_and_keeps_the_old_one_as_a_version(
    daphne_server: Server, new_context: Context
):
    context = new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    chat_open(page, daphne_server)
    ask(page, "Hello, I have a question about tools.")
    ask(page, "Search the knowledge base for the Heron bulk import tool.")
    first = page.locator(FINAL_REPLIES).last
    expect(first).to_contain_text("found nothing")
    # Only the chat's last message offers Regenerate.
    expect(page.get_by_role("button", name=REGENERATE)).to_have_count(1)
    expect(first.get_by_role("button", name=REGENERATE)).to_be_visible()

    # The knowledge base learns about the tool in another tab; the reply is regenerated.
    kb = context.new_page()
    kb.goto(daphne_server.url + "/kb/")
    heron: FilePayload = {
        "name": "heron.md",
        "mimeType": "text/markdown",
        "buffer": b"# Heron bulk import tool\n\nThe Heron bulk import tool uploads a whole USB drive in one go.",
    }
    kb.get_by_label("File", exact=True).set_input_files(files=[heron])
    kb.get_by_role("button", name="Upload").click()
    expect(kb.get_by_test_id("upload-notice")).to_contain_text("Heron")

    page.bring_to_front()
    first.get_by_role("button", name=REGENERATE).click()
    latest = page.locator(FINAL_REPLIES).last
    expect(latest).to_contain_text("USB drive")
    expect(page.locator("#messages article", has_text="found nothing")).to_have_count(0)
    expect(latest.get_by_test_id("version-label")).to_have_text("Version 2 of 2")

    # Page back to the first version, and back to the current one.
    latest.get_by_role("button", name="Show the earlier version 1").click()
    earlier = latest.get_by_test_id("earlier-version")
    expect(earlier).to_contain_text("Version 1 of 2")
    expect(earlier).to_contain_text("found nothing")
    expect(earlier).to_contain_text("not sent to the model")
    if directory := os.environ.get("SCREENSHOT_DIR"):
        latest.screenshot(path=str(Path(directory) / "screenshot-regenerate.png"))
    earlier.get_by_role("button", name="Back to the current version").click()
    expect(latest.get_by_test_id("earlier-version")).to_have_count(0)

    # Bring the first version back: it becomes the newest (3 of 3), the second is kept as a version.
    latest.get_by_role("button", name="Show the earlier version 1").click()
    latest.get_by_test_id("earlier-version").get_by_role("button", name="Use this version").click()
    current = page.locator(FINAL_REPLIES).last
    expect(current.get_by_test_id("version-label")).to_have_text("Version 3 of 3")
    expect(current).to_contain_text("found nothing")
    expect(page.locator("#messages article", has_text="USB drive")).to_have_count(0)
    current.get_by_role("button", name="Show the earlier version 2").click()
    expect(current.get_by_test_id("earlier-version")).to_contain_text("USB drive")

    # A reload shows the same: one reply, version 3 of 3.
    page.reload()
    page.wait_for_selector("#chat-page[data-ws='open']")
    expect(page.locator(FINAL_REPLIES)).to_have_count(2)
    expect(page.locator(FINAL_REPLIES).last.get_by_test_id("version-label")).to_have_text("Version 3 of 3")
