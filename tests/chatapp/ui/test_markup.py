"""Safe Markdown of chat messages (Markdown, then the nh3 allow-list)."""

from __future__ import annotations

import re
from pathlib import Path

import nh3
import pytest
from django.conf import settings
from pygments.styles import get_style_by_name
from pygments.token import STANDARD_TYPES, Token

from chatapp.ui.markup import (
    ALLOWED_ATTRIBUTES,
    ALLOWED_CLASSES,
    ALLOWED_TAGS,
    DARK_STYLE,
    LIGHT_STYLE,
    highlight_css,
    markdown_render,
)


def contrast(first: str, second: str) -> float:
    """WCAG's contrast ratio of two ``#rrggbb`` colours."""

    def luminance(colour: str) -> float:
        channels = [int(colour.lstrip("#")[i : i + 2], 16) / 255 for i in (0, 2, 4)]
        r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    high, low = sorted((luminance(first), luminance(second)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@pytest.mark.parametrize(
    ("source", "forbidden"),
    [
        ("<script>alert(1)</script>", "<script"),
        ("<img src=x onerror=alert(1)>", "<img"),
        ("[click](javascript:alert(1))", "javascript:"),
        ('<a href="https://x" onclick="steal()">x</a>', "<a "),
        ("<iframe src=https://evil></iframe>", "<iframe"),
        ("![x](https://tracker.example/pixel.png)", "<img"),
    ],
)
def test_html_and_dangerous_links_never_survive(source: str, forbidden: str):
    assert forbidden not in markdown_render(source)


def test_raw_html_is_shown_as_text():
    assert markdown_render("<b>hi</b> & <i>") == "<p>&lt;b&gt;hi&lt;/b&gt; &amp; &lt;i&gt;</p>"


def test_markdown_features_render():
    html = markdown_render(
        "**bold** and `code`\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n[site](https://example.com)"
    )
    assert "<strong>bold</strong>" in html and "<code>code</code>" in html and "<li>one</li>" in html
    assert "<table>" in html and "<td>1</td>" in html
    assert '<a href="https://example.com" rel="noopener noreferrer nofollow">site</a>' in html


def test_code_blocks_keep_their_lines_and_are_escaped():
    html = markdown_render("```\nif a < b:\n    print('<x>')\n```")
    assert "<pre><span></span><code>if a &lt; b:\n    print('&lt;x&gt;')\n</code></pre>" in html


def test_fenced_code_is_highlighted_with_classes_under_a_head_naming_its_language():
    html = markdown_render("```python\ndef f(x):\n    return '<x>'  # note\n```")
    assert html.startswith('<div class="code-block"><div class="code-head"><span class="code-lang">python</span>')
    assert '<button type="button" class="copy copy-code" aria-label="Copy the code">Copy</button>' in html
    assert '<span class="k">def</span>' in html and '<span class="c1"># note</span>' in html
    assert "&lt;x&gt;" in html and "style=" not in html
    # Without a language the block is plain text, still with its head and button.
    assert '<span class="code-lang">text</span>' in markdown_render("```\nplain\n```")


def test_a_language_name_cannot_inject_markup():
    html = markdown_render('```python{onclick=x}\nx = 1\n```\n\n```"><b>x\ny\n```')
    assert not re.search(r"<[^>]*\bonclick", html) and "<b>" not in html
    assert '<span class="code-lang">c++</span>' in markdown_render("```c++\nint x;\n```")


@pytest.mark.parametrize(
    "source",
    [
        '<div class="code-block" onclick="x">a</div>',
        '<span class="evil k">a</span>',
        '<button type="submit" formaction="https://evil">go</button>',
    ],
)
def test_the_code_block_allowances_let_nothing_else_through(source: str):
    # Raw HTML is text anyway; the sanitizer alone must drop what the allowances do not name.
    cleaned = nh3.clean(
        source,
        tags=set(ALLOWED_TAGS) | set(ALLOWED_CLASSES),
        attributes={tag: set(names) for tag, names in ALLOWED_ATTRIBUTES.items()},
        allowed_classes={tag: set(names) for tag, names in ALLOWED_CLASSES.items()},
    )
    assert "onclick" not in cleaned and "evil" not in cleaned and "formaction" not in cleaned


def test_the_highlight_stylesheet_is_the_generated_one():
    assert (Path(settings.BASE_DIR) / "static/chat/highlight.css").read_text() == highlight_css()


def test_every_token_colour_has_aa_contrast_on_its_theme_background():
    for name in (LIGHT_STYLE, DARK_STYLE):
        style = get_style_by_name(name)
        for token in STANDARD_TYPES:
            colour = style.style_for_token(token)["color"]
            if colour and token not in (Token.Error, Token.Generic.Error):
                assert contrast(f"#{colour}", style.background_color) >= 4.5, (name, token, colour)


def test_empty_text_is_empty():
    assert markdown_render(None) == "" and markdown_render("") == ""


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        ("Calculate 2*3*4", "<p>Calculate 2*3*4</p>"),
        ("The calculator says 2*3*4 = 24.", "<p>The calculator says 2*3*4 = 24.</p>"),
        ("What is 3 * 3?", "<p>What is 3 * 3?</p>"),
        ("*emphasis* stays, 2*3 too", "<p><em>emphasis</em> stays, 2*3 too</p>"),
        ("`2*3*4`", "<p><code>2*3*4</code></p>"),
    ],
)
def test_arithmetic_is_shown_as_written_not_as_emphasis(source: str, shown: str):
    # A newcomer's "Calculate 2*3*4" was shown as "Calculate 234", and the reply "2*3*4 = 24" as "234 = 24".
    assert markdown_render(source) == shown
