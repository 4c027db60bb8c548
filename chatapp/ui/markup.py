"""Safe Markdown for chat messages: Markdown to HTML, then an allow-list sanitizer (nh3).

Raw HTML written in a message is shown as text, never interpreted: the Markdown parser's HTML
block and inline-HTML rules are switched off, so ``<script>`` arrives as ``&lt;script&gt;``. The
sanitizer then keeps only the tags and attributes below and only ``http``, ``https`` and
``mailto`` links (a ``[x](javascript:...)`` link loses its ``href``), as a second line of defence.
"""

from __future__ import annotations

import markdown
import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown.extensions import Extension

ALLOWED_TAGS = frozenset(
    [
        "a",
        "abbr",
        "b",
        "blockquote",
        "br",
        "code",
        "del",
        "em",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "hr",
        "i",
        "li",
        "ol",
        "p",
        "pre",
        "strong",
        "sub",
        "sup",
        "table",
        "tbody",
        "td",
        "th",
        "thead",
        "tr",
        "ul",
    ]
)
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "abbr": {"title"}, "th": {"align"}, "td": {"align"}}
URL_SCHEMES = frozenset({"http", "https", "mailto"})


class _RawHtmlAsText(Extension):
    """Drop Python-Markdown's raw-HTML handling, so HTML in the source is escaped as text."""

    def extendMarkdown(self, md: markdown.Markdown) -> None:
        md.preprocessors.deregister("html_block")
        md.inlinePatterns.deregister("html")


def markdown_render(text: str | None) -> SafeString:
    """``text`` (Markdown written by a user or a model) as sanitized HTML, safe to insert as is.

    Supports paragraphs, emphasis, lists, links, tables, block quotes and fenced code blocks
    (code keeps its line breaks and is escaped). ``None`` or empty text gives an empty string.
    """
    if not text:
        return mark_safe("")
    html = markdown.markdown(
        text, extensions=["fenced_code", "tables", "sane_lists", _RawHtmlAsText()], output_format="html"
    )
    return mark_safe(
        nh3.clean(
            html,
            tags=set(ALLOWED_TAGS),
            attributes={tag: set(names) for tag, names in ALLOWED_ATTRIBUTES.items()},
            url_schemes=set(URL_SCHEMES),
            link_rel="noopener noreferrer nofollow",
        )
    )
