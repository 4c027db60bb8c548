"""The page's layout, in a real browser at a wide and a
phone size: one mode control (the open chat's; a new chat starts in the last used mode), the
start page's "New chat" button, a chat titled from its first message without identifiers or
contact data, the offline banner dismissed for good on a phone, and a one-line chat header."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import BrowserContext, Page, ViewportSize, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import ask, htmx_idle

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]
WIDE: ViewportSize = {"width": 1440, "height": 900}
PHONE: ViewportSize = {"width": 390, "height": 844}
SIZES = pytest.mark.parametrize("size", [WIDE, PHONE], ids=["wide", "phone"])


def is_phone(page: Page) -> bool:
    size = page.viewport_size
    return size is not None and size["width"] <= PHONE["width"]


def start_new_chat(page: Page, server: Server) -> str:
    """The start page's "New chat" button; returns the chat's URL once its socket is open."""
    page.goto(server.url + "/")
    button = page.get_by_test_id("start-actions").get_by_role("button", name="New chat")
    expect(button).to_be_visible()
    button.click()
    page.wait_for_selector("#chat-page[data-ws='open']")
    return page.url


def sidebar_new_chat(page: Page) -> str:
    """The chat list's "New chat" button (in its drawer on a phone)."""
    before = page.url
    if is_phone(page):
        page.get_by_role("button", name="Chats", exact=True).click()
        expect(page.locator("#sidebar")).to_be_in_viewport()
    page.locator("#sidebar").get_by_role("button", name="New chat").click()
    page.wait_for_url(lambda url: url != before)
    page.wait_for_selector("#chat-page[data-ws='open']")
    return page.url


def mode_choose(page: Page, label: str) -> None:
    """Click the open chat's mode control (its visible label: a segmented control on a phone)."""
    page.locator("#mode-form label", has_text=label).click()
    expect(page.locator("#mode-form").get_by_label(label, exact=True)).to_be_checked()
    expect(page.locator(".session-item.current .mode")).to_have_text(label)
    htmx_idle(page)


@SIZES
def test_one_mode_control_and_a_new_chat_starts_in_the_last_used_mode(
    daphne_server: Server, new_context: Context, size: dict[str, int]
):
    page = new_context(viewport=size, reduced_motion="reduce").new_page()
    page.goto(daphne_server.url + "/")
    expect(page.locator("select:not(#theme-choice)")).to_have_count(0)  # no second, "new chat" mode control
    expect(page.get_by_test_id("new-chat-mode")).to_contain_text("A new chat starts in Agent mode")
    first = start_new_chat(page, daphne_server)
    # The page's only mode control is the open chat's, showing its mode.
    expect(page.locator("input[name='mode']")).to_have_count(2)
    expect(page.get_by_role("group", name="Mode of this chat")).to_be_visible()
    expect(page.locator("#mode-form").get_by_label("Agent", exact=True)).to_be_checked()

    mode_choose(page, "Quick answer")
    expect(page.locator("#announce")).to_contain_text("Quick answer")
    second = sidebar_new_chat(page)
    assert second != first
    expect(page.locator("#mode-form").get_by_label("Quick answer", exact=True)).to_be_checked()
    expect(page.locator(".session-item.current .mode")).to_have_text("Quick answer")

    # Remembered by the server: a fresh page load of the start page says so, and its button obeys.
    page.goto(daphne_server.url + "/")
    expect(page.get_by_test_id("new-chat-mode")).to_contain_text("A new chat starts in Quick answer mode")
    start_new_chat(page, daphne_server)
    expect(page.locator("#mode-form").get_by_label("Quick answer", exact=True)).to_be_checked()

    # Switched back to agent here; then opening the first chat (quick answer) makes quick answer
    # the last used mode again, and a new chat from its page starts in it.
    mode_choose(page, "Agent")
    expect(page.locator("#mode-form").get_by_label("Quick answer", exact=True)).not_to_be_checked()
    sidebar_new_chat(page)
    expect(page.locator("#mode-form").get_by_label("Agent", exact=True)).to_be_checked()
    page.goto(first)
    page.wait_for_selector("#chat-page[data-ws='open']")
    expect(page.locator("#mode-form").get_by_label("Quick answer", exact=True)).to_be_checked()
    sidebar_new_chat(page)
    expect(page.locator("#mode-form").get_by_label("Quick answer", exact=True)).to_be_checked()


@SIZES
def test_the_first_message_titles_the_chat_without_identifiers_or_contact_data(
    daphne_server: Server, new_context: Context, size: dict[str, int]
):
    page = new_context(viewport=size, reduced_motion="reduce").new_page()
    start_new_chat(page, daphne_server)
    expect(page.locator("#chat-title")).to_have_text(re.compile(r"^Chat \d+$"))
    ask(page, "Hi! My name is Ada, account ACC-7731, email ada@example.com.")
    title = "Hi! My name is Ada, account …, email …"
    expect(page.locator("#chat-title")).to_have_text(title)
    expect(page.locator(".session-item.current .session-link")).to_have_text(title)
    expect(page).to_have_title(f"{title} · Kestrel Assistant")
    ask(page, "My order is #W2378156.")  # later messages do not retitle it
    expect(page.locator("#chat-title")).to_have_text(title)

    # Still editable as before.
    if is_phone(page):
        page.get_by_role("button", name="Chats", exact=True).click()
    page.locator(".session-item.current").get_by_role("link", name="Rename").click()
    field = page.get_by_label("New title")
    field.fill("Ada's account")
    field.press("Enter")
    expect(page.locator("#chat-title")).to_have_text("Ada's account")


def test_the_phone_can_dismiss_the_offline_banner_for_good(daphne_server: Server, new_context: Context):
    context = new_context(viewport=WIDE, reduced_motion="reduce")
    page = context.new_page()
    page.goto(daphne_server.url + "/")
    banner = page.get_by_test_id("offline-banner")
    dismiss = page.get_by_role("button", name="Dismiss the offline engine notice")
    # Wide: always there (it is how the page says it is offline), with nothing to dismiss.
    expect(banner).to_be_visible()
    expect(dismiss).to_be_hidden()

    page.set_viewport_size(PHONE)
    expect(dismiss).to_be_visible()
    dismiss.click()
    expect(banner).to_be_hidden()
    expect(page.locator("#main")).to_be_focused()  # not lost on <body>
    page.reload()
    expect(page.get_by_test_id("offline-banner")).to_be_hidden()
    # Remembered across pages and tabs of this browser.
    other = context.new_page()
    other.set_viewport_size(PHONE)
    start_new_chat(other, daphne_server)
    expect(other.get_by_test_id("offline-banner")).to_be_attached()
    expect(other.get_by_test_id("offline-banner")).to_be_hidden()
    # Back on a wide screen it shows again: there is room, and the page stays honest.
    other.set_viewport_size(WIDE)
    expect(other.get_by_test_id("offline-banner")).to_be_visible()

    # Another browser (no storage) still sees it on a phone.
    fresh = new_context(viewport=PHONE).new_page()
    fresh.goto(daphne_server.url + "/")
    expect(fresh.get_by_test_id("offline-banner")).to_be_visible()


# The header's visible children: each one's box, and whether they all share one line.
HEADER_LINE = """() => {
    const header = document.querySelector(".chat-header");
    const boxes = Array.from(header.children)
        .filter((child) => child.getClientRects().length && getComputedStyle(child).visibility !== "hidden")
        .map((child) => child.getBoundingClientRect());
    const top = Math.max(...boxes.map((box) => box.top));
    const bottom = Math.min(...boxes.map((box) => box.bottom));
    const title = document.getElementById("chat-title").getBoundingClientRect();
    const own = header.getBoundingClientRect();
    return {count: boxes.length, oneLine: top < bottom, overflow: header.scrollWidth - header.clientWidth,
            right: Math.max(...boxes.map((box) => box.right)), headerRight: own.right, titleWidth: title.width};
}"""


@pytest.mark.parametrize("size", [WIDE, PHONE, {"width": 360, "height": 740}], ids=["wide", "phone", "small-phone"])
def test_the_chat_header_takes_one_line(daphne_server: Server, new_context: Context, size: dict[str, int]):
    page = new_context(viewport=size, reduced_motion="reduce").new_page()
    start_new_chat(page, daphne_server)
    mode_choose(page, "Quick answer")  # the longer label checked
    ask(page, "What does the Team plan cost for a team of ten people every month?")
    line = page.evaluate(HEADER_LINE)
    # Chats (phone), title, mode control, connection, Memory (up to 1100 px wide).
    assert line["count"] >= 3, line
    assert line["oneLine"], line
    assert line["overflow"] <= 0 and line["right"] <= line["headerRight"] + 1, line
    assert line["titleWidth"] > 20, line  # the title still shows, cut with an ellipsis
    # The connection state is still said, for screen readers, when it is a dot.
    expect(page.get_by_test_id("connection")).to_have_text("connected")
    if size["width"] < WIDE["width"]:
        page.get_by_role("button", name="Memory", exact=True).click()
        expect(page.locator("#inspector")).to_be_in_viewport()
