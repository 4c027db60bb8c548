"""The chat page's memory marks, gauge and counts, in a real browser
against a real Daphne server with the offline engine: the newest reply's memory mark, the gauge's
words and colours, the degraded state's attempt list, the summary type, and the composer's token
count from the server."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import BrowserContext, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import FINAL_REPLIES, ask, chat_open, htmx_idle

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]

# The computed fill of a gauge at each level, and the flat colour of each section of the request,
# read from the page's own stylesheet.
GAUGE_AND_SECTION_COLOURS = """() => {
    const probe = (className, child) => {
        const outer = document.createElement("div");
        outer.className = className;
        const inner = document.createElement("span");
        if (child) { inner.className = child; outer.append(inner); }
        document.body.append(outer);
        const style = getComputedStyle(child ? inner : outer);
        const seen = {color: style.backgroundColor, image: style.backgroundImage};
        outer.remove();
        return seen;
    };
    const levels = {};
    for (const level of ["low", "mid", "high", "over"]) levels[level] = probe("gauge level-" + level, "gauge-fill");
    const sections = {};
    for (const key of ["system", "facts", "summary", "recall", "retained", "current", "tools", "overhead", "free"]) {
        sections[key] = probe("seg sec-" + key, null).color;
    }
    return {levels, sections};
}"""


def test_the_newest_reply_has_its_memory_mark_live_and_after_a_reload(daphne_server: Server, new_context: Context):
    page = new_context().new_page()
    chat_open(page, daphne_server, mode="Quick answer")
    ask(page, "What does the Team plan cost?")
    reply = page.locator(FINAL_REPLIES).last
    # Arrived over the socket, the reply says where it stands: the next request carries it.
    expect(reply.locator(".mark")).to_have_text("next request")
    expect(reply.locator(".mark")).to_be_visible()
    expect(page.locator("#messages article.user .mark")).to_have_text("current turn")
    ask(page, "And the Business plan?")
    # Every bubble has a visible mark, the newest reply included.
    marks = page.locator("#messages article .mark")
    expect(marks).to_have_count(page.locator("#messages article").count())
    for index in range(marks.count()):
        expect(marks.nth(index)).to_be_visible()
        expect(marks.nth(index)).not_to_be_empty()
    expect(page.locator(FINAL_REPLIES).first.locator(".mark")).to_have_text(
        re.compile("^(retained window|in summary)$")
    )
    expect(page.locator(FINAL_REPLIES).last.locator(".mark")).to_have_text("next request")
    page.reload()
    page.wait_for_selector("#chat-page[data-ws='open']")
    expect(page.locator(FINAL_REPLIES).last.locator(".mark")).to_have_text("next request")


def test_the_gauge_says_its_level_and_marks_in_words_and_its_colours_are_its_own(
    daphne_server: Server, new_context: Context
):
    page = new_context(viewport={"width": 1440, "height": 900}).new_page()
    chat_open(page, daphne_server)
    ask(page, "search the knowledge base for Team plan price")
    gauge = page.get_by_test_id("gauge")
    level = page.get_by_test_id("gauge-level")
    expect(level).to_have_text(re.compile("^(under the target|over the target|over the trigger)$"))
    expect(gauge).to_have_attribute(
        "aria-valuetext",
        re.compile(r"^[\d,]+ of 4,096 tokens, (under|over) the \w+; target 1,228, trigger 2,048, window 4,096$"),
    )
    # The marks are labelled in words under the bar, each where its mark is, and in the legend.
    scale = page.get_by_test_id("gauge-scale")
    for word in ("target", "trigger", "window"):
        expect(scale.get_by_text(word, exact=True)).to_be_visible()
    boxes = [scale.get_by_text(word, exact=True).bounding_box() for word in ("target", "trigger", "window")]
    assert all(boxes) and boxes[0]["x"] < boxes[1]["x"] < boxes[2]["x"]  # type: ignore[index]
    for mark in ("target", "trigger"):
        bar = page.locator(f".gauge-mark.{mark}").bounding_box()
        label = scale.get_by_text(mark, exact=True).bounding_box()
        assert bar and label and abs(label["x"] + label["width"] / 2 - bar["x"]) < 4
    legend = page.get_by_test_id("gauge-marks")
    expect(legend).to_contain_text("target 1,228: compression aims below it")
    expect(legend).to_contain_text("trigger 2,048: compression starts above it")
    expect(legend).to_contain_text("window 4,096: the model's limit")

    colours = page.evaluate(GAUGE_AND_SECTION_COLOURS)
    levels, sections = colours["levels"], colours["sections"]
    fills = [levels[name]["color"] + levels[name]["image"] for name in ("low", "mid", "high", "over")]
    assert len(set(fills)) == 4, levels  # each level looks different
    for name in ("mid", "high", "over"):  # past the target: a pattern, not only a hue
        assert levels[name]["image"].startswith("repeating-linear-gradient"), levels[name]
        assert not any(colour in levels[name]["image"] for colour in sections.values()), (name, levels[name])
    assert levels["low"]["color"] not in sections.values()
    assert len(set(sections.values())) == len(sections), sections  # the sections are told apart too


def test_a_degraded_compression_lists_its_attempts_and_waits_with_the_error_once(
    start_server: Callable[..., Server], new_context: Context
):
    server = start_server(OFFLINE_FAIL_SUMMARY="true")
    page = new_context().new_page()
    chat_open(page, server, mode="Quick answer")
    for question in ("What does the Team plan cost?", "My locker code is 4711.", "What is the largest file?"):
        ask(page, question)
    page.get_by_role("button", name="Compress now").click()
    inspector = page.locator("#inspector[data-health='raw_archive']")
    expect(inspector).to_be_attached()
    htmx_idle(page)
    error = inspector.get_by_test_id("event-error")
    expect(error).to_have_text(re.compile(r"^All 3 attempts failed with: .*OFFLINE_FAIL_SUMMARY"))
    # The engine is named once, not again by the provider's own message.
    expect(error).to_contain_text("The offline engine failed with HTTP 500: summaries are switched to fail")
    text = error.inner_text().split("failed with: ", 1)[1]
    assert page.locator("body").inner_text().count(text) == 1  # the error, once on the page
    # The health panel points at the event instead of repeating it.
    page.get_by_test_id("health-event").click()
    event = inspector.locator(".timeline li[data-kind='compression']").first
    expect(event).to_be_in_viewport()
    log = event.get_by_test_id("attempt-log")
    expect(log.locator(".step.try.failed")).to_have_count(3)
    # The live app's backoff: 0.5 s before the second try, 1 s before the third.
    waits = [int(re.sub(r"\D", "", w)) for w in log.locator(".step.wait").all_inner_texts()]
    assert len(waits) == 2 and 500 <= waits[0] < 1000 <= waits[1] < 1500, waits
    # Durations have thousands separators, and a no-break space keeps each figure with its unit.
    tries = [
        int(re.search(r"([\d,]+)\u00a0ms", t).group(1).replace(",", ""))  # type: ignore[union-attr]
        for t in log.locator(".step.try").all_text_contents()
    ]
    total = log.get_by_test_id("attempt-total").text_content() or ""
    parts = re.match(
        r"([\d,]+)\u00a0ms = ([\d,]+)\u00a0ms in 3 attempts \+ ([\d,]+)\u00a0ms of backoff waits "
        r"\+ ([\d,]+)\u00a0ms of other work",
        total,
    )
    assert parts, total
    whole, tried, waited, other = (int(n.replace(",", "")) for n in parts.groups())
    assert tried == sum(tries) and waited == sum(waits) and whole == tried + waited + other
    assert waits[1] >= 1000 and f"wait {waits[1]:,}\u00a0ms" in log.locator(".step.wait").all_text_contents()
    # Nothing was summarized: the entry says the messages were archived verbatim.
    line = event.locator("p").nth(1).text_content() or ""
    assert re.fullmatch(
        rf"[\d,]+ → [\d,]+ tokens · \d+ messages archived verbatim \(raw archive\) · {whole:,}\u00a0ms", line
    ), line
    expect(page.get_by_test_id("summary-type")).to_have_text("raw archive")


def test_the_summary_type_says_extractive_when_the_offline_engine_wrote_it(daphne_server: Server, new_context: Context):
    page = new_context().new_page()
    chat_open(page, daphne_server, mode="Quick answer")
    for question in ("What does the Team plan cost?", "My locker code is 4711."):
        ask(page, question)
    page.get_by_role("button", name="Compress now").click()
    expect(page.locator("#inspector")).not_to_have_attribute("data-summary-version", "0")
    htmx_idle(page)
    expect(page.get_by_test_id("summary-type")).to_have_text("extractive summary")
    expect(page.get_by_test_id("event-result").first).to_have_text("extractive summary")
    expect(page.locator("#announce")).to_contain_text("(extractive summary)")


def test_the_composer_shows_the_servers_token_count_against_the_room(daphne_server: Server, new_context: Context):
    page = new_context().new_page()
    chat_open(page, daphne_server, mode="Quick answer")
    count = page.get_by_test_id("composer-count")
    expect(count).to_have_attribute("data-state", "empty")
    expect(count).to_contain_text("Room for one message: up to")
    room = int(count.get_by_test_id("composer-room").inner_text().replace(",", ""))
    assert 0 < room < 4096
    composer = page.get_by_label("Message", exact=True)

    with page.expect_response(re.compile(r"/composer/count/$")) as answered:
        composer.press_sequentially("What does the Team plan cost?")
    assert answered.value.request.method == "POST" and answered.value.status == 200
    expect(count).to_have_attribute("data-state", "ok")
    expect(count).to_contain_text(re.compile(rf"^\s*\d+ of {room:,} tokens"))
    small = int(count.get_by_test_id("composer-tokens").inner_text())
    assert 5 < small < 30

    composer.fill("团" * (room + 5))  # at least a token a character: over the room
    expect(count).to_have_attribute("data-state", "over_window")
    expect(count).to_contain_text(
        re.compile(
            rf"^\s*[\d,]+\stokens: more than the {room:,} tokens this chat's context window leaves for a message, so it would probably be refused"
        )
    )
    # The message would be refused: Send is disabled until the text fits again.
    expect(page.locator("#send")).to_be_disabled()
    composer.fill("And the Business plan?")
    expect(count).to_have_attribute("data-state", "ok")
    expect(page.locator("#send")).to_be_enabled()
    typed = count.get_by_test_id("composer-tokens").inner_text()
    # The room depends on the mode (tool schemas in agent mode, passages in quick-answer): a mode
    # switch recounts what is typed, untouched.
    page.locator("#mode-form").get_by_label("Agent", exact=True).check()
    expect(count.get_by_test_id("composer-room")).not_to_have_text(f"{room:,}")
    agent_room = int(count.get_by_test_id("composer-room").inner_text().replace(",", ""))
    assert 0 < agent_room != room
    expect(count.get_by_test_id("composer-tokens")).to_have_text(typed)
    htmx_idle(page)
    composer.press("Enter")
    # Sent: the count goes back to the room, which the server recounts once the reply ends.
    expect(count).to_have_attribute("data-state", "empty")
    expect(page.locator(FINAL_REPLIES)).to_have_count(1)
    expect(count.get_by_test_id("composer-room")).to_have_text(re.compile(r"^[\d,]+$"))
