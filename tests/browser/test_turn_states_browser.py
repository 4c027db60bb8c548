"""A turn's states on the chat page, in a real browser against a real Daphne server
with the offline engine: the normal state between target and trigger is not painted as a
warning; a stopped reply says so once; the demo's end is announced; Send is disabled for a
message the composer's count predicts will be refused; Delete is a button that asks first; a tab
whose chat was deleted elsewhere says so and sends nothing; a message refused by the cap of
waiting messages can be retried or dismissed and survives a reload until then; a failed reply
can be retried.

``SCREENSHOT_DIR=docs pytest tests/browser -k "not_sent or deleted_elsewhere"`` also saves
``screenshot-not-sent.png`` and ``screenshot-deleted-elsewhere.png``.
"""

from __future__ import annotations

import colorsys
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from chatapp.conversation.demo import DEMO_SCRIPT
from tests.browser.conftest import Server
from tests.browser.test_chat_page import FINAL_REPLIES, ask, chat_open, htmx_idle

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]
DESKTOP = {"width": 1440, "height": 900}

# The computed colours of the gauge's fill and level pill at each level, from the page's stylesheet.
LEVEL_COLOURS = """() => {
    const colours = {};
    for (const level of ["low", "mid", "high", "over"]) {
        const gauge = document.createElement("div");
        gauge.className = "gauge level-" + level;
        const fill = document.createElement("div");
        fill.className = "gauge-fill";
        gauge.append(fill);
        const pill = document.createElement("strong");
        pill.className = "gauge-level level-" + level;
        document.body.append(gauge, pill);
        const image = getComputedStyle(fill).backgroundImage;
        colours[level] = [getComputedStyle(fill).backgroundColor, ...(image.match(/rgba?\\([^)]*\\)/g) || []),
                          getComputedStyle(pill).backgroundColor];
        gauge.remove();
        pill.remove();
    }
    return colours;
}"""


def warning_hue(css: str) -> bool:
    """Whether the CSS colour ``rgb(r, g, b)`` is a saturated red, orange or yellow."""
    red, green, blue = (int(part) / 255 for part in re.findall(r"[\d.]+", css)[:3])
    hue, lightness, saturation = colorsys.rgb_to_hls(red, green, blue)
    return saturation > 0.25 and 0.1 < lightness < 0.95 and (hue * 360 < 70 or hue * 360 > 330)


def test_over_the_target_under_the_trigger_is_not_painted_as_a_warning(daphne_server: Server, new_context: Context):
    page = new_context(viewport=DESKTOP).new_page()
    page.goto(daphne_server.url + "/")
    colours = page.evaluate(LEVEL_COLOURS)
    assert not [colour for colour in colours["mid"] if warning_hue(colour)], colours["mid"]
    assert not [colour for colour in colours["low"] if warning_hue(colour)], colours["low"]
    # Over the trigger and over the window still warn.
    assert any(warning_hue(colour) for colour in colours["high"]), colours["high"]
    assert any(warning_hue(colour) for colour in colours["over"]), colours["over"]


def test_a_reply_stopped_before_any_text_says_so_once(start_server: Callable[..., Server], new_context: Context):
    server = start_server(OFFLINE_DELAY="30")
    page = new_context().new_page()
    chat_open(page, server)
    page.get_by_label("Message", exact=True).fill("What does the Team plan cost?")
    page.get_by_label("Message", exact=True).press("Enter")
    expect(page.locator("#live .thinking")).to_be_visible()
    page.locator("#stop").click()
    stopped = page.locator("#messages article.status-stopped")
    expect(stopped).to_contain_text("Stopped by the user")
    assert stopped.inner_text().lower().count("stopped by the user") == 1, stopped.inner_text()
    page.reload()
    page.wait_for_selector("#chat-page[data-ws='open']")
    assert stopped.inner_text().lower().count("stopped by the user") == 1, stopped.inner_text()


def test_a_stopped_demo_says_it_ended(start_server: Callable[..., Server], new_context: Context):
    server = start_server(DEMO_SECONDS="600")  # long thinking: the first step is still running
    page = new_context().new_page()
    page.goto(server.url + "/")
    page.get_by_role("button", name="Run the demo").click()
    page.wait_for_selector("#chat-page[data-ws='open']")
    note = page.locator("#thread-note")
    expect(note).to_have_attribute("role", "status")  # in the page from the start: announced when filled
    expect(note).to_be_empty()
    expect(page.locator("#live .thinking")).to_be_visible()
    page.locator("#stop").click()
    expect(note).to_have_text(f"The demo stopped at step 1 of {len(DEMO_SCRIPT)}. This chat is yours to go on with.")


def test_send_is_disabled_while_the_count_predicts_a_refusal(daphne_server: Server, new_context: Context):
    page = new_context(viewport=DESKTOP).new_page()
    chat_open(page, daphne_server)
    composer, send = page.get_by_label("Message", exact=True), page.locator("#send")
    count = page.get_by_test_id("composer-count")
    # Nothing to send: a blank message.
    composer.fill("   \n  ")
    expect(send).to_be_disabled()
    # Under the character limit (8,000) but more tokens than the 4,096-token window leaves (3,857).
    composer.fill(" ".join(f"x{n}q{n * 7}" for n in range(800)))
    expect(count).to_have_attribute("data-state", "over_window")
    expect(send).to_be_disabled()
    composer.press("Enter")
    expect(page.locator("#outbox article")).to_have_count(0)
    assert composer.input_value().startswith("x0q0")
    composer.fill("What does the Team plan cost?")
    expect(count).to_have_attribute("data-state", "ok")
    expect(send).to_be_enabled()


def test_delete_is_a_button_that_asks_first(daphne_server: Server, new_context: Context):
    page = new_context().new_page()
    first_url = chat_open(page, daphne_server)
    first_id = first_url.rstrip("/").rsplit("/", 1)[1]
    chat_open(page, daphne_server)
    item = page.locator(f"#session-item-{first_id}")
    expect(item.get_by_role("link", name=re.compile("Delete"))).to_have_count(0)
    delete = item.get_by_role("button", name=re.compile("^Delete"))
    delete.focus()
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.keyboard.press("Enter")
    htmx_idle(page)
    expect(item).to_have_count(1)  # declined: kept
    page.once("dialog", lambda dialog: dialog.accept())
    delete.click()
    expect(item).to_have_count(0)


def test_a_tab_whose_chat_was_deleted_elsewhere_says_so_and_sends_nothing(daphne_server: Server, new_context: Context):
    context = new_context(viewport=DESKTOP)
    other = context.new_page()
    chat_open(other, daphne_server)
    doomed = context.new_page()
    doomed_url = chat_open(doomed, daphne_server)
    doomed_id = doomed_url.rstrip("/").rsplit("/", 1)[1]
    ask(doomed, "What does the Team plan cost?")
    other.reload()  # its sidebar lists the newer chat too
    other.once("dialog", lambda dialog: dialog.accept())
    other.locator(f"#session-item-{doomed_id}").get_by_text("Delete", exact=True).click()
    expect(other.locator(f"#session-item-{doomed_id}")).to_have_count(0)

    expect(doomed.locator("#chat-page")).to_have_attribute("data-ws", "gone")
    expect(doomed.locator("#errors")).to_have_text(
        "This chat was deleted in another tab or window: nothing more can be sent here."
    )
    expect(doomed.get_by_label("Message", exact=True)).to_be_disabled()
    expect(doomed.locator("#send")).to_be_disabled()
    expect(doomed.locator(f"#session-item-{doomed_id}")).to_have_count(0)
    expect(doomed.locator(".session-item")).to_have_count(1)  # the other chat stays listed
    if directory := os.environ.get("SCREENSHOT_DIR"):
        doomed.screenshot(path=str(Path(directory) / "screenshot-deleted-elsewhere.png"))


def not_sent(page: Page, text: str) -> None:
    """Send ``text`` while a turn runs and the cap is one waiting message: it is refused."""
    page.get_by_label("Message", exact=True).fill(text)
    page.get_by_label("Message", exact=True).press("Enter")
    bubble = page.locator("#outbox article", has_text=text)
    expect(bubble.locator(".status.rejected")).to_contain_text("Not sent")


def test_a_message_not_sent_for_the_cap_can_be_retried_or_dismissed_and_survives_a_reload(
    start_server: Callable[..., Server], new_context: Context
):
    server = start_server(OFFLINE_DELAY="30", CHAT_MAX_PENDING_TURNS="1")
    page = new_context(viewport=DESKTOP).new_page()
    chat_open(page, server)
    page.get_by_label("Message", exact=True).fill("What does the Team plan cost?")
    page.get_by_label("Message", exact=True).press("Enter")
    expect(page.locator("#live .thinking")).to_be_visible()
    not_sent(page, "And the Business plan?")
    not_sent(page, "Never mind this one.")
    retry_card = page.locator("#outbox article", has_text="And the Business plan?")
    dismiss_card = page.locator("#outbox article", has_text="Never mind this one.")
    expect(retry_card.get_by_role("button", name="Retry")).to_be_visible()
    if directory := os.environ.get("SCREENSHOT_DIR"):
        page.locator(".chat").screenshot(path=str(Path(directory) / "screenshot-not-sent.png"))

    # A reload keeps both, still refused, with their buttons.
    page.reload()
    page.wait_for_selector("#chat-page[data-ws='open']")
    for card in (retry_card, dismiss_card):
        expect(card.locator(".status.rejected")).to_contain_text("Not sent")
        expect(card.get_by_role("button", name="Retry")).to_be_visible()
    dismiss_card.get_by_role("button", name="Dismiss").click()
    expect(dismiss_card).to_have_count(0)

    # Once the running turn is stopped, Retry sends it through the normal path: stored, shown once.
    page.locator("#stop").click()
    expect(page.locator("#stop")).to_be_disabled()
    retry_card.get_by_role("button", name="Retry").click()
    asked = page.locator("#messages article.user", has_text="And the Business plan?")
    expect(asked).to_have_count(1)
    expect(page.locator("#outbox article")).to_have_count(0)
    page.reload()
    page.wait_for_selector("#chat-page[data-ws='open']")
    expect(page.locator("#outbox article")).to_have_count(0)
    expect(asked).to_have_count(1)
    expect(page.locator("#messages article.user", has_text="Never mind this one.")).to_have_count(0)


def test_a_failed_reply_can_be_retried_as_a_new_turn(start_server: Callable[..., Server], new_context: Context):
    server = start_server(OFFLINE_FAIL_CHAT="1")
    page = new_context().new_page()
    chat_open(page, server, mode="Quick answer")
    ask(page, "What does the Team plan cost?")
    failed = page.locator("#messages article.status-error")
    expect(failed).to_have_count(1)
    expect(failed.locator(".status")).to_contain_text("This reply failed")
    answered = page.locator(FINAL_REPLIES).count()
    failed.get_by_role("button", name="Retry").click()
    page.wait_for_function("n => document.querySelectorAll('#messages article.status-error').length >= n", arg=2)
    asked = page.locator("#messages article.user .content")
    expect(asked).to_have_count(2)
    assert [text.strip() for text in asked.all_inner_texts()] == ["What does the Team plan cost?"] * 2
    expect(page.locator(FINAL_REPLIES)).to_have_count(answered + 1)


def test_a_reply_cut_off_at_the_token_limit_is_marked_and_continue_asks_for_more(
    start_server: Callable[..., Server], new_context: Context
):
    server = start_server(LLM_MAX_OUTPUT_TOKENS="16")
    page = new_context().new_page()
    chat_open(page, server)
    ask(page, "How large can a file be?")
    reply = page.locator("#messages article.assistant").last
    expect(reply).to_have_class(re.compile(r"\bstatus-cut_off\b"))
    expect(reply.get_by_test_id("cut-off")).to_contain_text("Cut off at the model's token limit")

    reply.get_by_role("button", name=re.compile("^Continue")).click()
    expect(page.locator("#messages article.user").last).to_contain_text(
        "Please continue from where your reply was cut off."
    )
    # The continuation is answered, and the first reply no longer offers Continue (only the last one may).
    expect(page.locator("#messages article").last).to_have_class(re.compile(r"\bassistant\b"))
    expect(page.locator("#messages article.user")).to_have_count(2)
    first = page.locator("#messages article.assistant", has=page.get_by_test_id("cut-off")).first
    expect(first.get_by_role("button", name=re.compile("^Continue"))).to_be_hidden()
