"""The demo walk-through in a real browser (system Chromium, headless) against a real Daphne server
(docs/demo.md): "Run the demo" on the start page opens a chat of the visitor's that talks by
itself; its page shows, live, compressions, the injected summarizer outage degrading one of them
to the raw archive and the recovery after it, the key facts with the corrected address, the
account id answered after its message was summarized, and the recalled early message. The Stop
button stops a demo turn; a stranger gets 404 for the demo chat.

``SCREENSHOT_DIR=docs pytest tests/browser -k walk_through`` also saves ``screenshot-demo.png``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from chatapp.conversation.demo import DEMO_SCRIPT, DEMO_TITLE, OUTAGE_STEPS
from tests.browser.conftest import Server

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]
FINAL_REPLIES = "#messages article.assistant:not(:has(details.tool-call))"
# The whole walk-through at DEMO_SECONDS=0 on a loaded two-core machine (milliseconds).
WALK_THROUGH_MS = 180_000
LAPTOP = "My old laptop is a ThinkPad called Falcon and it keeps the tax folder in sync."

# The final reply that follows the user message with ``text`` (tool-call steps in between).
REPLY_TO = """text => {
    const asked = [...document.querySelectorAll('#messages article.user')]
        .find(article => article.querySelector('.content')?.textContent.trim() === text);
    for (let next = asked?.nextElementSibling; next; next = next.nextElementSibling) {
        if (next.matches('article.user')) return null;
        if (next.matches('article.assistant') && !next.querySelector('details.tool-call')) {
            return next.querySelector('.content')?.textContent ?? '';
        }
    }
    return null;
}"""


def demo_run_from_start_page(page: Page, server: Server) -> str:
    """Click "Run the demo" on the start page; returns the demo chat's URL once its socket is open."""
    page.goto(server.url + "/")
    actions = page.get_by_test_id("start-actions")
    expect(actions.get_by_test_id("start-new-chat")).to_be_visible()
    actions.get_by_role("button", name="Run the demo").click()
    page.wait_for_selector("#chat-page[data-ws='open']")
    expect(page.locator("#chat-title")).to_have_text(DEMO_TITLE)
    return page.url


def test_the_walk_through_shows_compression_degradation_key_facts_and_recall(
    start_server: Callable[..., Server], new_context: Context
):
    server = start_server(DEMO_SECONDS="0")
    page = new_context(viewport={"width": 1440, "height": 900}, reduced_motion="reduce").new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    url = demo_run_from_start_page(page, server)

    # Every step's question and its final reply arrive over the socket, in order.
    page.wait_for_function(
        """([selector, n, last]) => document.querySelectorAll(selector).length >= n
               && [...document.querySelectorAll('#messages article.user .content')].at(-1)?.textContent.trim() === last
               && !document.querySelector('#live').children.length
               && document.querySelector('#stop').disabled""",
        arg=[FINAL_REPLIES, len(DEMO_SCRIPT), DEMO_SCRIPT[-1].text],
        timeout=WALK_THROUGH_MS,
    )
    asked = page.locator("#messages article.user .content").all_inner_texts()
    assert [text.strip() for text in asked] == [step.text for step in DEMO_SCRIPT]
    # Its end is said in the status region under the transcript.
    expect(page.locator("#thread-note")).to_have_text(
        f"The demo has ended: all {len(DEMO_SCRIPT)} steps ran. This chat is yours to go on with."
    )
    expect(page.locator("#messages details.tool-call").first).to_contain_text("kb_search")
    expect(page.locator("#messages .mark[data-mark='summarized']").first).to_be_attached()
    # Recent turns stay verbatim after the compressions: the last request retained earlier questions of the user.
    retained = page.locator("#messages article.user:has(.mark[data-mark='retained'])")
    assert retained.count() >= 2, retained.count()

    # Compressions: several; one degraded by the injected outage, every attempt failed; recovered.
    inspector = page.locator("#inspector")
    timeline = page.get_by_test_id("timeline")
    compressions = timeline.locator("li[data-kind='compression']")
    expect(compressions.nth(2)).to_be_attached()
    degraded = timeline.locator("li.degraded")
    expect(degraded.first).to_contain_text("injected summarizer outage (demo walk-through, step")
    assert degraded.count() <= len(OUTAGE_STEPS) < compressions.count()
    expect(inspector).to_have_attribute("data-health", "ok")
    expect(page.get_by_test_id("summary-type")).not_to_have_class(re.compile(r"\btype-raw\b"))

    # Key facts: the early facts pinned, the corrected address superseding the first one.
    current = page.get_by_test_id("facts-current")
    for value in ("ACC-7731", "240 euros", "14 March 2027", "Ada Byron", "48 Birch Lane"):
        expect(current.get_by_test_id("fact-value").filter(has_text=value)).to_have_count(1)
    superseded = page.get_by_test_id("facts-superseded")
    old = superseded.locator("li.fact", has_text="12 Elm Road")
    expect(old.get_by_test_id("fact-replaced-by")).to_have_text("48 Birch Lane")

    # The account id answered after its message was summarized (the offline engine answers from
    # the request's key facts, summary and recall blocks).
    answer = page.evaluate(REPLY_TO, "What is my account id?")
    assert answer is not None and "ACC-7731" in answer
    address = page.evaluate(REPLY_TO, "What is my shipping address?")
    assert address is not None and "48 Birch Lane" in address

    # The last question recalled the early message about the laptop, with a link to it.
    recall = page.get_by_test_id("recall")
    expect(recall.get_by_test_id("recall-query")).to_have_text(DEMO_SCRIPT[-1].text)
    item = recall.get_by_test_id("recall-items").locator("li.role-user", has_text=LAPTOP)
    expect(item).to_have_count(1)
    said = page.locator("#messages article.user", has_text=LAPTOP).get_attribute("data-id")
    expect(item).to_have_attribute("data-same-chat", "true")
    expect(item.get_by_test_id("recall-link")).to_have_attribute("href", f"#message-{said}")
    expect(page.locator(f"#mark-{said}")).to_have_attribute("data-mark", "summarized")
    assert not errors

    if directory := os.environ.get("SCREENSHOT_DIR"):
        page.screenshot(path=str(Path(directory) / "screenshot-demo.png"))

    stranger = new_context().new_page()
    response = stranger.goto(url)
    assert response is not None and response.status == 404


def test_the_stop_button_stops_a_demo_turn(start_server: Callable[..., Server], new_context: Context):
    server = start_server(DEMO_SECONDS="600")  # 18 s of thinking per step
    page = new_context().new_page()
    demo_run_from_start_page(page, server)
    expect(page.locator("#live .thinking")).to_be_visible()
    stop = page.locator("#stop")
    expect(stop).to_be_enabled()
    stop.click()
    expect(page.locator("#messages article.status-stopped")).to_contain_text("Stopped by the user")
    expect(stop).to_be_disabled()
    expect(page.locator("#messages article.user")).to_have_count(1)
    expect(page.locator("#messages article.user .content")).to_have_text(DEMO_SCRIPT[0].text)
