"""Safe Markdown of chat messages (Markdown, then the nh3 allow-list)."""

from __future__ import annotations

import pytest

from chatapp.ui.markup import markdown_render


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
    html = markdown_render("```python\nif a < b:\n    print('<x>')\n```")
    assert html == "<pre><code>if a &lt; b:\n    print('&lt;x&gt;')\n</code></pre>"


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
