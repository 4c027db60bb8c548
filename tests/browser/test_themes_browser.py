"""Light and dark themes, in a real browser against a real Daphne server with the offline engine:
the page follows the system's ``prefers-color-scheme``; the sidebar's toggle (light / dark /
system) overrides it, persists in localStorage and is applied before the first paint; and the
main pairs of text and background keep WCAG AA contrast in both themes (4.5:1 for text, 3:1 for
large text and the edges of controls), computed from the browser's computed styles.

``SCREENSHOT_DIR=docs pytest tests/browser -k dark`` also saves ``screenshot-dark.png``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import ask, chat_open, htmx_idle

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]
DESKTOP = {"width": 1440, "height": 900}

# Relative luminance of a CSS colour, and the first opaque background at or above an element.
COLOUR_HELPERS = """
    const rgb = (value) => value.match(/[\\d.]+/g).map(Number);
    const channel = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    const luminance = ([r, g, b]) => 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b);
    const ratio = (a, b) => { const [x, y] = [luminance(a), luminance(b)]; return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
    const backdrop = (element) => {
        for (let node = element; node; node = node.parentElement) {
            const colour = rgb(getComputedStyle(node).backgroundColor);
            if (colour.length < 4 || colour[3] === 1) return colour;
        }
        return [255, 255, 255];
    };
"""

# [selector, kind] -> the contrast of each element found: "text" (its colour on its background,
# 4.5:1; 3:1 when large: 24px, or 18.66px bold) or "edge" (its border against the background
# around it, 3:1).
CONTRASTS = (
    """(checks) => {"""
    + COLOUR_HELPERS
    + """
    return checks.map(([selector, kind]) => {
        const element = document.querySelector(selector);
        if (!element) return {selector, missing: true};
        const style = getComputedStyle(element);
        if (kind === "edge") {
            return {selector, kind, needed: 3, ratio: ratio(rgb(style.borderTopColor), backdrop(element.parentElement))};
        }
        const size = parseFloat(style.fontSize), bold = Number(style.fontWeight) >= 700;
        const large = size >= 24 || (bold && size >= 18.66);
        return {selector, kind, needed: large ? 3 : 4.5, ratio: ratio(rgb(style.color), backdrop(element))};
    });
}"""
)
CHECKS = [
    ["#chat-title", "text"],
    ["#messages article.user .content p", "text"],
    ["#messages article.assistant .content", "text"],
    ["#messages .message-meta .role", "text"],
    ["#messages .msg-id", "text"],
    ["#messages .copy-message", "text"],
    ["#messages .code-lang", "text"],
    ["#messages .highlight .k", "text"],
    ["#messages .highlight .c1", "text"],
    ["#messages .highlight .n", "text"],
    ["#messages .mark:not(:empty)", "text"],
    ["#send", "text"],
    ["#composer-text", "text"],
    ["#composer-count", "text"],
    ["#composer-hint", "text"],
    [".connection", "text"],
    ["#inspector h2", "text"],
    ["#inspector .panel h3", "text"],
    ["#inspector .meta", "text"],
    ["[data-testid=gauge-level]", "text"],
    ["[data-testid=summary-type]", "text"],
    ["[data-testid=health]", "text"],
    [".session-link", "text"],
    [".sidebar-foot a", "text"],
    ["#theme-choice", "text"],
    [".banner", "text"],
    ["#composer-text", "edge"],
    ["#compress-now", "edge"],
    ["#theme-choice", "edge"],
]


def theme_of(page: Page) -> str:
    """``dark`` or ``light``: what the page's background looks like."""
    return str(
        page.evaluate(
            "() => {"
            + COLOUR_HELPERS
            + "return luminance(rgb(getComputedStyle(document.body).backgroundColor)) < 0.2 ? 'dark' : 'light'; }"
        )
    )


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_page_follows_the_system_and_keeps_aa_contrast(daphne_server: Server, new_context: Context, scheme: str):
    page = new_context(viewport=DESKTOP, color_scheme=scheme, reduced_motion="reduce").new_page()
    chat_open(page, daphne_server, mode="Quick answer")
    assert theme_of(page) == scheme
    ask(page, "Is this right?\n\n```python\ndef total(items):\n    return sum(items)  # all of them\n```")
    ask(page, "What does the Team plan cost?")
    htmx_idle(page)
    results = page.evaluate(CONTRASTS, CHECKS)
    failing = [r for r in results if not r.get("missing") and r["ratio"] < r["needed"]]
    assert not failing, failing
    assert not [r for r in results if r.get("missing")], results
    expect(page.get_by_label("Theme")).to_have_value("system")
    if scheme == "dark" and (directory := os.environ.get("SCREENSHOT_DIR")):
        page.screenshot(path=str(Path(directory) / "screenshot-dark.png"))


# Records, when <body> is first added to the document, the theme <html> has then: what the first
# paint of the page uses.
THEME_AT_FIRST_BODY = """() => {
    new MutationObserver((changes, observer) => {
        if (!document.body) return;
        window.__themeAtBody = document.documentElement.dataset.theme || "none";
        observer.disconnect();
    }).observe(document, {childList: true, subtree: true});
}"""


def test_the_theme_toggle_overrides_the_system_persists_and_applies_before_the_first_paint(
    daphne_server: Server, new_context: Context
):
    page = new_context(viewport=DESKTOP, color_scheme="light").new_page()
    page.add_init_script(f"({THEME_AT_FIRST_BODY})()")
    chat_open(page, daphne_server)
    choice = page.get_by_label("Theme")
    choice.select_option("dark")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    assert theme_of(page) == "dark"

    # Kept across pages and reloads, and on <html> before <body> exists: no flash of light.
    page.reload()
    page.wait_for_selector("#chat-page[data-ws='open']")
    assert page.evaluate("window.__themeAtBody") == "dark"
    expect(page.get_by_label("Theme")).to_have_value("dark")
    assert theme_of(page) == "dark"
    page.goto(daphne_server.url + "/kb/")
    assert page.evaluate("window.__themeAtBody") == "dark" and theme_of(page) == "dark"

    # Light wins over a dark system; "System" gives the choice back to the system.
    page.emulate_media(color_scheme="dark")
    page.get_by_label("Theme").select_option("light")
    assert theme_of(page) == "light"
    page.get_by_label("Theme").select_option("system")
    expect(page.locator("html")).not_to_have_attribute("data-theme", "light")
    assert theme_of(page) == "dark"
    assert page.evaluate("localStorage.getItem('kestrel.theme')") is None
    page.reload()
    assert page.evaluate("window.__themeAtBody") == "none" and theme_of(page) == "dark"
