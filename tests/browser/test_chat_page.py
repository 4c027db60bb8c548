"""The chat page in a real browser (system Chromium, headless) against a real Daphne server:
live memory inspector updates over the socket, degradation, stop, the sidebar's htmx actions,
the knowledge-base upload, and a second visitor kept out.

``SCREENSHOT_DIR=docs pytest tests/browser -k compression`` also saves the README screenshots
(``screenshot-wide.png`` at 1440x900 and ``screenshot-narrow.png`` at 390x844).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, FilePayload, Page, expect

from tests.browser.conftest import Server

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]
FINAL_REPLIES = "#messages article.assistant:not(:has(details.tool-call))"
# Questions the offline engine answers with a kb_search call and a quote: each adds a few hundred
# tokens, so a handful pass the 2,048-token window's trigger (1,024 tokens).
QUESTIONS = [
    "search the knowledge base for Team plan price",
    "My name is Ada and my locker code is 4711.",
    "search the knowledge base for storage limits",
    "search the knowledge base for the refund policy",
    "search the knowledge base for encryption",
    "search the knowledge base for conflicting copies",
    "search the knowledge base for API rate limits",
    "search the knowledge base for support hours",
]


def htmx_idle(page: Page) -> None:
    """Wait until no htmx request, swap or settle is in progress."""
    page.wait_for_function("!document.querySelector('.htmx-request, .htmx-swapping, .htmx-settling')")


def chat_open(page: Page, server: Server, *, mode: str = "Agent") -> str:
    """Start a new chat with the start page's "New chat" button and put it in ``mode`` with the
    chat's mode control (a new chat starts in the last used mode); returns its URL once its
    socket is open."""
    page.goto(server.url + "/")
    page.get_by_test_id("start-new-chat").click()
    page.wait_for_selector("#chat-page[data-ws='open']")
    radio = page.locator("#mode-form").get_by_label(mode, exact=True)
    if not radio.is_checked():
        radio.check()
        expect(page.locator(".session-item.current .mode")).to_have_text(mode)
        htmx_idle(page)
    return page.url


def ask(page: Page, text: str) -> None:
    """Send ``text`` with the Enter key and wait until its turn has ended on the page."""
    answered = page.locator(FINAL_REPLIES).count() + 1
    page.get_by_label("Message", exact=True).fill(text)
    page.get_by_label("Message", exact=True).press("Enter")
    page.wait_for_function(
        """([selector, n]) => document.querySelectorAll(selector).length >= n
               && !document.querySelector('#live').children.length
               && !document.querySelector('#outbox').children.length
               && document.querySelector('#stop').disabled""",
        arg=[FINAL_REPLIES, answered],
    )


def summarized_count(page: Page) -> int:
    return page.locator("#messages .mark[data-mark='summarized']").count()


def test_a_compression_shows_live_in_the_inspector(small_window_server: Server, new_context: Context):
    page = new_context(viewport={"width": 1440, "height": 900}, reduced_motion="reduce").new_page()
    chat_open(page, small_window_server)
    expect(page.get_by_test_id("offline-banner")).to_be_visible()
    page.evaluate("window.__sameDocument = true")  # gone if the page were ever reloaded
    job = page.get_by_test_id("memory-job")
    for question in QUESTIONS:
        ask(page, question)
        # The memory job runs after each reply (docs/memory.md §10); the page shows when it ends.
        expect(job).to_have_text(re.compile("^(idle|failed)$"))
        if page.get_attribute("#inspector", "data-summary-version") != "0":
            break
    inspector = page.locator("#inspector")
    expect(inspector).to_have_attribute("data-summary-version", "1")
    expect(job).to_have_text("idle")
    # The job compressed ahead of the next request, which then carries the summary and a
    # retained window.
    expect(inspector.get_by_test_id("pre-compression").first).to_be_visible()
    ask(page, "search the knowledge base for support hours")
    expect(job).to_have_text(re.compile("^(idle|failed)$"))
    version = int(page.get_attribute("#inspector", "data-summary-version") or "0")
    assert version >= 1
    expect(page.get_by_test_id("memory-path")).to_have_attribute("data-path", re.compile("^(under_trigger|waited)$"))
    assert page.evaluate("window.__sameDocument") is True

    # The compression event, with its summarizer attempt.
    event = inspector.locator(".timeline li[data-kind='compression']").first
    expect(event).to_contain_text(re.compile(r"[\d,]+ → [\d,]+ tokens · \d+ messages summarized · [\d,]+\s+ms"))
    expect(event.locator(".attempt-log .step.try.ok")).to_have_count(1)
    expect(page.get_by_test_id("health")).to_have_text("ok")
    # The summary: type, count, text and its first version.
    # The offline engine writes extractive summaries: no language model wrote it, and the page says so.
    expect(page.get_by_test_id("summary-type")).to_have_text("extractive summary")
    compressed = int(page.get_by_test_id("compressed-count").inner_text())
    assert compressed > 0
    page.locator("#summary-text summary").click()
    expect(page.get_by_test_id("summary-content")).not_to_be_empty()
    expect(inspector.locator(".versions li")).to_have_count(version)
    # The transcript: the messages the last request's summary covered are "in summary", those the
    # job folded since "next request: in summary": together, exactly the covered messages.
    assert summarized_count(page) + page.locator("#messages .mark[data-mark='folded']").count() == compressed
    # (No "retained" mark is required: at this 2,048-token window the job compresses again after
    # most replies, so the last request's retained messages are usually in the summary by now.)
    expect(page.locator("#messages .mark[data-mark='current']").first).to_be_attached()
    # The gauge shows the last request against the 2,048-token window, with the engine's sections.
    expect(page.get_by_test_id("context-used")).to_have_text(re.compile(r"^[\d,]+ / 2,048$"))
    expect(inspector.locator("tr[data-section='summary'] td.num").first).not_to_have_text("0")

    screenshots = os.environ.get("SCREENSHOT_DIR")
    if screenshots:
        screenshots_save(page, Path(screenshots))


def screenshots_save(page: Page, directory: Path) -> None:
    """The chat with the inspector beside it (1440x900) and in its drawer (390x844), scrolled
    to where the summarized messages end."""
    directory.mkdir(parents=True, exist_ok=True)
    boundary = (
        "Array.from(document.querySelectorAll('#messages .mark:is([data-mark=summarized], [data-mark=folded])')).pop()"
    )
    page.evaluate(f"{boundary}.closest('article').scrollIntoView({{block: 'center'}})")
    page.locator("#summary-text").evaluate("details => details.open = false")
    page.screenshot(path=str(directory / "screenshot-wide.png"))
    page.set_viewport_size({"width": 390, "height": 844})
    page.get_by_role("button", name="Memory", exact=True).click()
    expect(page.locator("#inspector")).to_be_in_viewport()
    page.screenshot(path=str(directory / "screenshot-narrow.png"))
    page.keyboard.press("Escape")
    expect(page.get_by_role("button", name="Memory", exact=True)).to_be_focused()


def test_a_failing_summarizer_is_shown_as_raw_archive(start_server: Callable[..., Server], new_context: Context):
    server = start_server(OFFLINE_FAIL_SUMMARY="true")
    page = new_context().new_page()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    chat_open(page, server, mode="Quick answer")
    for question in ("What does the Team plan cost?", "My locker code is 4711.", "What is the largest file?"):
        ask(page, question)
    assert summarized_count(page) == 0
    page.get_by_role("button", name="Compress now").click()
    inspector = page.locator("#inspector[data-health='raw_archive']")
    expect(inspector).to_be_attached()
    htmx_idle(page)
    expect(page.get_by_test_id("health")).to_have_text("raw archive")
    expect(inspector.get_by_test_id("event-error")).to_contain_text("OFFLINE_FAIL_SUMMARY")
    expect(inspector.locator(".timeline .attempt-log .step.try.failed")).to_have_count(3)
    expect(inspector.locator(".timeline li.degraded")).to_have_count(1)
    expect(page.get_by_test_id("summary-type")).to_have_text("raw archive")
    expect(page.locator("#announce")).to_contain_text("raw archive: the summarizer failed")
    assert not [error for error in errors if "oobErrorNoTarget" in error]
    # Everything before the newest question is now covered, for the next request, and marked so
    # over the socket.
    expect(page.locator("#messages .mark[data-mark='folded']")).to_have_count(
        int(page.get_by_test_id("compressed-count").inner_text())
    )


def test_another_visitor_cannot_open_the_chat(daphne_server: Server, new_context: Context):
    owner = new_context().new_page()
    url = chat_open(owner, daphne_server)
    ask(owner, "My locker code is 4711.")
    session_path = url.removeprefix(daphne_server.url)

    stranger = new_context().new_page()
    response = stranger.goto(url)
    assert response is not None and response.status == 404
    assert "4711" not in stranger.content()
    assert stranger.request.get(daphne_server.url + session_path + "inspector/").status == 404
    stranger.goto(daphne_server.url + "/")
    close_code = stranger.evaluate(
        """path => new Promise(resolve => {
            const socket = new WebSocket("ws://" + location.host + "/ws/chat/" + path.split("/")[2] + "/?ui=html");
            socket.onclose = event => resolve(event.code);
        })""",
        session_path,
    )
    assert close_code == 4404
    expect(stranger.locator("#session-list")).not_to_contain_text("locker")


def test_stop_ends_a_slow_reply_and_keeps_it_marked_stopped(start_server: Callable[..., Server], new_context: Context):
    server = start_server(OFFLINE_DELAY="30")
    page = new_context().new_page()
    chat_open(page, server)
    composer = page.get_by_label("Message", exact=True)
    composer.fill("What does the Team plan")
    composer.press("Shift+Enter")  # a new line, not a send
    composer.press_sequentially("cost?")
    expect(composer).to_have_value("What does the Team plan\ncost?")
    expect(page.locator("#outbox article")).to_have_count(0)
    composer.press("Enter")
    expect(composer).to_have_value("")
    expect(page.locator("#live .thinking")).to_be_visible()
    expect(page.locator("#messages .empty-chat")).to_have_count(0)  # gone with the first message
    stop = page.locator("#stop")
    expect(stop).to_be_enabled()
    stop.click()
    stopped = page.locator("#messages article.status-stopped")
    expect(stopped).to_contain_text("Stopped by the user")
    expect(page.locator("#live article")).to_have_count(0)
    expect(stop).to_be_disabled()


# A keydown on the composer as an IME sends it; Playwright's keyboard cannot set keyCode.
IME_KEYDOWN = """([isComposing, keyCode]) => {
    const input = document.getElementById("composer-text");
    const event = new KeyboardEvent("keydown", {key: "Enter", isComposing, bubbles: true, cancelable: true});
    Object.defineProperty(event, "keyCode", {get: () => keyCode});
    input.dispatchEvent(event);
    return {keyCode: event.keyCode, isComposing: event.isComposing, prevented: event.defaultPrevented};
}"""


def test_f42_enter_confirming_an_ime_composition_does_not_send(daphne_server: Server, new_context: Context):
    page = new_context().new_page()
    chat_open(page, daphne_server)
    composer = page.get_by_label("Message", exact=True)
    composer.fill("你好")
    # Safari confirming a CJK composition: isComposing false, keyCode 229; then any browser's flag.
    for is_composing, key_code in ((False, 229), (True, 13)):
        seen = page.evaluate(IME_KEYDOWN, [is_composing, key_code])
        assert seen == {"keyCode": key_code, "isComposing": is_composing, "prevented": False}
        # The composer submits synchronously inside keydown, so nothing sent now means never.
        expect(page.locator("#outbox article")).to_have_count(0)
        expect(page.locator("#messages article.user")).to_have_count(0)
        expect(composer).to_have_value("你好")
    composer.press("Enter")  # a plain Enter (keyCode 13, not composing) still sends
    expect(composer).to_have_value("")
    expect(page.locator("#messages article.user")).to_have_count(1)
    expect(page.locator("#messages article.user")).to_contain_text("你好")


def test_sidebar_rename_mode_switch_and_delete(daphne_server: Server, new_context: Context):
    page = new_context().new_page()
    first_url = chat_open(page, daphne_server)
    first_id = first_url.rstrip("/").rsplit("/", 1)[1]
    chat_open(page, daphne_server)
    item = page.locator(f"#session-item-{first_id}")

    item.get_by_role("link", name="Rename").click()
    title = page.get_by_label("New title")
    expect(title).to_be_focused()
    title.fill("Trip planning")
    title.press("Enter")
    expect(item.locator(".session-link")).to_have_text("Trip planning")
    htmx_idle(page)
    # Renamed in place (htmx): still on the second chat's page, which is the one changed below.
    assert page.url.rstrip("/").rsplit("/", 1)[1] != first_id
    expect(page.locator(".session-item.current")).not_to_have_id(f"session-item-{first_id}")

    page.get_by_label("Quick answer", exact=True).check()
    expect(page.locator(".session-item.current .mode")).to_have_text("Quick answer")
    expect(page.locator("#announce")).to_contain_text("Quick answer")
    htmx_idle(page)

    page.once("dialog", lambda dialog: dialog.accept())
    item.get_by_role("button", name="Delete").click()
    expect(item).to_have_count(0)
    htmx_idle(page)
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(".session-item.current").get_by_role("button", name="Delete").click()
    page.wait_for_url(daphne_server.url + "/")
    expect(page.locator("#session-list")).to_contain_text("No chats yet.")


def test_knowledge_base_upload_lists_the_document_and_explains_errors(daphne_server: Server, new_context: Context):
    page = new_context().new_page()
    page.goto(daphne_server.url + "/kb/")
    guide: FilePayload = {
        "name": "glacier.md",
        "mimeType": "text/markdown",
        "buffer": b"# Glacier mode\n\nCold files cost less.",
    }
    page.get_by_label("File", exact=True).set_input_files(files=[guide])
    page.get_by_role("button", name="Upload").click()
    expect(page.get_by_test_id("upload-notice")).to_contain_text("Glacier mode")
    expect(page.locator("#kb-documents")).to_contain_text("upload-glacier")  # refreshed by HX-Trigger
    program: FilePayload = {"name": "tool.exe", "mimeType": "application/octet-stream", "buffer": b"MZ"}
    page.get_by_label("File", exact=True).set_input_files(files=[program])
    page.get_by_role("button", name="Upload").click()
    expect(page.get_by_label("File", exact=True)).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#kb-upload")).to_contain_text("Only text and Markdown files")


def test_phone_drawers_stay_open_while_used_inside(daphne_server: Server, new_context: Context):
    page = new_context(reduced_motion="reduce").new_page()
    chat_open(page, daphne_server)  # from the start page's sidebar, shown at this width
    page.set_viewport_size({"width": 390, "height": 844})
    expect(page.get_by_text("No messages yet. Ask something below.")).to_be_visible()
    ask(page, "What does the Team plan cost?")
    expect(page.locator("#messages .empty-chat")).to_have_count(0)
    expect(page.locator("#chat-title")).not_to_have_text(re.compile(r"^Chat \d+$"))  # titled by the question
    expect(page).to_have_title(page.locator("#chat-title").inner_text() + " · Kestrel Assistant")

    memory = page.get_by_role("button", name="Memory", exact=True)
    memory.click()
    inspector = page.locator("#inspector")
    expect(inspector).to_be_in_viewport()
    expect(memory).to_have_attribute("aria-expanded", "true")
    assert page.evaluate("document.body.getAttribute('aria-expanded')") is None
    sent = inspector.locator("details.sent").first
    sent.locator("summary").click()
    expect(sent).to_have_attribute("open", "")
    sent.get_by_role("button", name="Copy").click()
    expect(page.locator("body")).to_have_attribute("data-drawer", "inspector")
    expect(inspector).to_be_in_viewport()
    page.get_by_role("button", name="Close the memory inspector").click()
    expect(page.locator("body")).not_to_have_attribute("data-drawer", re.compile(".*"))
    expect(memory).to_be_focused()
    expect(memory).to_have_attribute("aria-expanded", "false")

    chats = page.get_by_role("button", name="Chats", exact=True)
    chats.click()
    expect(page.locator("#sidebar")).to_be_in_viewport()
    page.locator(".session-item.current").get_by_role("link", name="Rename").click()
    title = page.get_by_label("New title")
    expect(title).to_be_focused()
    expect(page.locator("body")).to_have_attribute("data-drawer", "sidebar")
    title.fill("Plans")
    title.press("Enter")
    expect(page.locator("#chat-title")).to_have_text("Plans")
    expect(page).to_have_title("Plans · Kestrel Assistant")
    expect(page.locator("body")).to_have_attribute("data-drawer", "sidebar")
    page.keyboard.press("Escape")
    expect(chats).to_be_focused()
