"""axe-core (vendored in ``static/vendor/axe-core``, never fetched) on the pages, in a real browser
against a real Daphne server with the offline engine: the chat page with the memory inspector
open and filled (a compression, key facts, a code block), on a desktop and in the phone's drawer,
and the knowledge-base page, each in the light and the dark theme. Any ``serious`` or
``critical`` violation fails the test, listed with its rule and elements."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Page, ViewportSize, expect

from tests.browser.conftest import Server
from tests.browser.test_chat_page import ask, chat_open, htmx_idle

pytestmark = pytest.mark.browser

Context = Callable[..., BrowserContext]
AXE = Path(__file__).resolve().parents[2] / "static/vendor/axe-core/axe.min.js"
AXE_VERSION = "4.14.1"
BLOCKING = {"serious", "critical"}
DESKTOP: ViewportSize = {"width": 1440, "height": 900}
PHONE: ViewportSize = {"width": 390, "height": 844}


def axe_violations(page: Page) -> list[dict[str, Any]]:
    """The serious and critical violations axe finds on ``page`` (WCAG 2.x A and AA rules and
    axe's best practices), each as ``{id, impact, help, targets}``."""
    if not page.evaluate("Boolean(window.axe)"):
        page.add_script_tag(path=str(AXE))
    assert page.evaluate("axe.version") == AXE_VERSION
    results = page.evaluate(
        """async () => {
            const results = await axe.run(document, {resultTypes: ["violations"]});
            return results.violations.map((v) => ({
                id: v.id, impact: v.impact, help: v.help,
                targets: v.nodes.map((node) => node.target.join(" ") + " :: " + node.failureSummary),
            }));
        }"""
    )
    return [violation for violation in results if violation["impact"] in BLOCKING]


def theme_set(page: Page, theme: str) -> None:
    """``theme`` with the sidebar's toggle, or as the toggle sets it when the sidebar is a closed drawer."""
    choice = page.get_by_label("Theme")
    if choice.is_visible():
        choice.select_option(theme)
    else:
        page.evaluate("theme => { document.documentElement.dataset.theme = theme; }", theme)
    expect(page.locator("html")).to_have_attribute("data-theme", theme)


def test_the_chat_page_with_its_inspector_and_the_knowledge_base_have_no_serious_violation(
    daphne_server: Server, new_context: Context
):
    page = new_context(viewport=DESKTOP, reduced_motion="reduce").new_page()
    chat_open(page, daphne_server, mode="Quick answer")
    for question in (
        "My locker code is 4711 and my email is ada@example.org.",
        "Is this right?\n\n```python\ndef total(items):\n    return sum(items)\n```",
        "What does the Team plan cost?",
    ):
        ask(page, question)
    page.get_by_role("button", name="Compress now").click()
    expect(page.locator("#messages .mark[data-mark='folded']").first).to_be_visible()
    htmx_idle(page)
    ask(page, "And the Business plan?")  # the next request sends that summary: "in summary"
    expect(page.locator("#messages .mark[data-mark='summarized']").first).to_be_visible()
    htmx_idle(page)
    # The inspector open: its sections, the exact texts sent and the summary's text unfolded.
    page.evaluate("document.querySelectorAll('#inspector details').forEach((d) => { d.open = true; })")
    found: dict[str, list[dict[str, Any]]] = {}
    for theme in ("light", "dark"):
        theme_set(page, theme)
        found[f"chat, {theme}"] = axe_violations(page)
    page.set_viewport_size(PHONE)
    page.get_by_role("button", name="Memory", exact=True).click()
    expect(page.locator("#inspector")).to_be_in_viewport()
    for theme in ("light", "dark"):
        theme_set(page, theme)
        found[f"chat on a phone, inspector drawer, {theme}"] = axe_violations(page)

    kb = new_context(viewport=DESKTOP).new_page()
    kb.goto(daphne_server.url + "/kb/")
    for theme in ("light", "dark"):
        theme_set(kb, theme)
        found[f"knowledge base, {theme}"] = axe_violations(kb)
    assert not any(found.values()), {where: violations for where, violations in found.items() if violations}
