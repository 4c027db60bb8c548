"""Safe Markdown for chat messages: Markdown to HTML, then an allow-list sanitizer (nh3).

Raw HTML written in a message is shown as text, never interpreted: the Markdown parser's HTML
block and inline-HTML rules are switched off, so ``<script>`` arrives as ``&lt;script&gt;``. The
sanitizer then keeps only the tags and attributes below and only ``http``, ``https`` and
``mailto`` links (a ``[x](javascript:...)`` link loses its ``href``), as a second line of defence.
"""

from __future__ import annotations

import re

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


_DIGIT_STAR = re.compile(r"(?<=\d)\*(?=\s*\d)|(?<=\d\s)\*(?=\d)")
_FENCE = ("```", "~~~")


def _multiplication_kept(text: str) -> str:
    """``text`` with every ``*`` between digits (``2*3*4``, ``3 *4``) escaped, so Markdown shows
    arithmetic as written instead of reading it as emphasis (a newcomer saw "Calculate 2*3*4"
    shown as "Calculate 234"). Fenced and indented code blocks and code spans are left alone:
    they show their text verbatim anyway."""
    lines: list[str] = []
    fenced = False
    for line in text.split("\n"):
        if line.lstrip().startswith(_FENCE):
            fenced = not fenced
        elif not fenced and not line.startswith(("    ", "\t")):
            spans = line.split("`")  # even positions are outside code spans
            line = "`".join(_DIGIT_STAR.sub(r"\\*", span) if i % 2 == 0 else span for i, span in enumerate(spans))
        lines.append(line)
    return "\n".join(lines)


def markdown_render(text: str | None) -> SafeString:
    """``text`` (Markdown written by a user or a model) as sanitized HTML, safe to insert as is.

    Supports paragraphs, emphasis, lists, links, tables, block quotes and fenced code blocks
    (code keeps its line breaks and is escaped). ``None`` or empty text gives an empty string.
    """
    if not text:
        return mark_safe("")
    html = markdown.markdown(
        _multiplication_kept(text),
        extensions=["fenced_code", "tables", "sane_lists", _RawHtmlAsText()],
        output_format="html",
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
