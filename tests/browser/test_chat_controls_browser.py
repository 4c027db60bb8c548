"""The chat page's controls, in a real browser against a real Daphne server with the offline
engine: the export menu (in the flow, closed by a click outside or Escape), the contrast of the
memory marks and the health pill, the character limit that disables Send instead of cutting the
text, "Compress now" only with something to fold, the announcement cleared by the next turn,
and on a phone the start page, the composer's hint and the inspector drawer's sticky header."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import ask, chat_open, htmx_idle

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1440, "height": 900}

# WCAG's contrast ratio of an element's text against its own background, or the first opaque
# background among its ancestors; and the product of the opacities up the tree.
CONTRAST = """(element) => {
    const rgb = (value) => value.match(/[\\d.]+/g).map(Number);
    const channel = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    const luminance = ([r, g, b]) => 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b);
    let back = null, opacity = 1;
    for (let node = element; node; node = node.parentElement) {
        const style = getComputedStyle(node);
        opacity *= Number(style.opacity);
        const colour = rgb(style.backgroundColor);
        if (!back && (colour.length < 4 || colour[3] === 1)) back = colour;
    }
    const [a, b] = [luminance(rgb(getComputedStyle(element).color)), luminance(back || [255, 255, 255])];
    return {ratio: (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05), opacity};
}"""


def overlaps(page: Page, first: str, second: str) -> bool:
    boxes = [page.locator(selector).first.bounding_box() for selector in (first, second)]
    a, b = boxes
    assert a and b, boxes
    return not (
        a["x"] + a["width"] <= b["x"]
        or b["x"] + b["width"] <= a["x"]
        or a["y"] + a["height"] <= b["y"]
        or b["y"] + b["height"] <= a["y"]
    )


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_the_export_menu_covers_nothing_and_closes_on_a_click_outside_or_escape(
    daphne_server: Server, new_context: Context, viewport: dict[str, int]
):
    # No drawer animation: a click while the drawer slides in scrolls it (Playwright's own
    # scrolling into view), which would put the panels under the sticky header.
    page = new_context(viewport=viewport, reduced_motion="reduce").new_page()
    chat_open(page, daphne_server)
    ask(page, "What does the Team plan cost?")
    phone = viewport is PHONE
    if phone:
        page.get_by_role("button", name="Memory", exact=True).click()
    menu = page.locator("#export-menu")
    summary = menu.locator("summary")
    summary.click()
    expect(menu.get_by_test_id("export-md")).to_be_visible()
    # The links push the panels down: the Last request heading and its Model call line stay visible.
    for selector in ("#ins-request", "#ins-request-panel .meta"):
        expect(page.locator(selector).first).to_be_visible()
        assert not overlaps(page, ".export-links", selector), selector
    page.locator("#ins-request").click()  # anywhere outside the menu
    expect(menu).not_to_have_attribute("open", "")
    summary.click()
    expect(menu).to_have_attribute("open", "")
    page.keyboard.press("Escape")
    expect(menu).not_to_have_attribute("open", "")
    expect(summary).to_be_focused()
    if phone:  # the first Escape closed the menu only; the next one closes the drawer
        expect(page.locator("body")).to_have_attribute("data-drawer", "inspector")
        page.keyboard.press("Escape")
        expect(page.locator("body")).not_to_have_attribute("data-drawer", "inspector")


def test_memory_marks_and_the_health_pill_have_aa_contrast_and_summarized_messages_are_not_faded(
    daphne_server: Server, new_context: Context
):
    page = new_context(viewport=DESKTOP).new_page()
    chat_open(page, daphne_server, mode="Quick answer")
    for question in ("What does the Team plan cost?", "My locker code is 4711.", "What is the largest file?"):
        ask(page, question)
    marks = page.locator("#messages .mark:not(:empty)")
    seen = {marks.nth(i).get_attribute("data-mark") for i in range(marks.count())}
    assert {"retained", "current"} <= seen, seen
    page.get_by_role("button", name="Compress now").click()
    expect(page.locator("#messages .mark[data-mark='folded']").first).to_be_visible()
    htmx_idle(page)
    ask(page, "And the Business plan?")  # the next request sends that summary: "in summary"
    expect(page.locator("#messages .mark[data-mark='summarized']").first).to_be_visible()
    htmx_idle(page)
    expect(page.get_by_test_id("health")).to_have_text("ok")
    checked = [
        *(marks.nth(i) for i in range(marks.count())),
        page.get_by_test_id("health"),
        page.locator("#messages .message:has(.mark[data-mark='summarized']) .message-meta .role").first,
        page.locator("#messages .message:has(.mark[data-mark='summarized']) .content").first,
    ]
    # A mark that left the page since is probed from a copy of a bubble with that mark.
    page.evaluate(
        """() => {
            for (const mark of ["summarized", "retained", "current", "folded"]) {
                const probe = document.createElement("article");
                probe.className = "message assistant probe";
                probe.innerHTML = '<header class="message-meta"><span class="role">Assistant</span>'
                    + '<span class="mark" data-mark="' + mark + '">' + mark + '</span></header>';
                document.getElementById("messages").append(probe);
            }
        }"""
    )
    probes = page.locator("#messages .probe .mark")
    checked += [probes.nth(i) for i in range(4)]
    for element in checked:
        seen_contrast = element.evaluate(CONTRAST)
        label = element.evaluate("e => e.outerHTML.slice(0, 80)")
        assert seen_contrast["ratio"] >= 4.5, (label, seen_contrast)
        assert seen_contrast["opacity"] == 1, (label, seen_contrast)


def test_a_text_over_the_character_limit_is_kept_whole_and_send_is_disabled(
    daphne_server: Server, new_context: Context
):
    page = new_context(viewport=DESKTOP).new_page()
    chat_open(page, daphne_server)
    limit = int(page.locator("#composer").get_attribute("data-max-chars") or 0)
    assert limit > 0
    composer = page.get_by_label("Message", exact=True)
    send = page.locator("#send")
    composer.fill("word " * (limit // 5) + "overflowing")
    assert len(composer.input_value()) > limit  # not cut at the limit
    expect(send).to_be_disabled()
    count = page.get_by_test_id("composer-count")
    expect(count).to_have_attribute("data-state", "over_chars")
    expect(count).to_contain_text("characters a message may have. Shorten it to send it.")
    composer.press("Enter")  # refused on the page as well: nothing is sent
    expect(page.locator("#outbox article")).to_have_count(0)
    assert composer.input_value().endswith("overflowing")
    composer.fill("What does the Team plan cost?")
    expect(send).to_be_enabled()
    expect(count).to_have_attribute("data-state", "ok")


def test_the_page_counts_characters_as_the_server_does_an_emoji_is_one(daphne_server: Server, new_context: Context):
    page = new_context(viewport=DESKTOP).new_page()
    chat_open(page, daphne_server)
    limit = int(page.locator("#composer").get_attribute("data-max-chars") or 0)
    composer = page.get_by_label("Message", exact=True)
    send = page.locator("#send")
    count = page.get_by_test_id("composer-count")
    composer.fill("😀" * limit)  # twice as many UTF-16 units as the limit, and within it
    expect(count).not_to_have_attribute("data-state", "over_chars")
    expect(send).to_be_enabled()
    composer.fill("😀" * (limit + 1))
    expect(count).to_have_attribute("data-state", "over_chars")
    expect(send).to_be_disabled()


def test_compress_now_waits_for_history_and_the_next_turn_clears_the_announcement(
    daphne_server: Server, new_context: Context
):
    page = new_context(viewport=DESKTOP).new_page()
    chat_open(page, daphne_server, mode="Quick answer")
    button = page.get_by_role("button", name="Compress now")
    expect(button).to_be_disabled()  # an empty chat: nothing to fold
    ask(page, "What does the Team plan cost?")
    expect(button).to_be_disabled()  # nothing before the newest question yet
    ask(page, "And the Business plan?")
    expect(button).to_be_enabled()
    button.click()
    announce = page.locator("#announce")
    expect(announce).to_contain_text("Memory compressed:")
    htmx_idle(page)
    expect(page.get_by_role("button", name="Compress now")).to_be_disabled()  # all folded
    ask(page, "What is the largest file?")
    expect(announce).to_be_empty()  # that turn compressed nothing


def test_on_a_phone_the_start_page_names_the_app_once_and_the_drawer_header_stays(
    daphne_server: Server, new_context: Context
):
    page = new_context(viewport=PHONE).new_page()
    page.goto(daphne_server.url + "/")
    visible = page.evaluate(
        """() => Array.from(document.querySelectorAll("body *"))
            .filter((e) => e.children.length === 0 && e.textContent.trim() === "Kestrel Assistant")
            .filter((e) => e.checkVisibility({visibilityProperty: true})).length"""
    )
    assert visible == 1
    expect(page.locator(".welcome")).to_contain_text("behind its Memory button on a small screen")

    chat_open(page, daphne_server)
    expect(page.locator("#composer-hint")).to_be_hidden()  # no Shift+Enter on a phone keyboard
    ask(page, "What does the Team plan cost?")
    page.get_by_role("button", name="Memory", exact=True).click()
    inspector = page.locator("#inspector")
    inspector.evaluate("element => { element.scrollTop = element.scrollHeight; }")
    assert inspector.evaluate("element => element.scrollTop") > 0
    close = page.get_by_role("button", name="Close the memory inspector")
    expect(close).to_be_in_viewport()
    expect(page.locator("#inspector-title")).to_be_in_viewport()
    close.click()
    expect(page.locator("body")).not_to_have_attribute("data-drawer", "inspector")
