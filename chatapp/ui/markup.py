"""Safe Markdown for chat messages: raw HTML in a message is shown as text (the parser's HTML rules are off), then
an allow-list sanitizer (nh3) keeps only the tags, classes and link schemes below, as a second line of defence.
Code blocks are highlighted on the server with CSS classes only (``static/chat/highlight.css``)."""

from __future__ import annotations

import re
from html import escape
from typing import IO, Any

import markdown
import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown.extensions import Extension
from pygments.formatters import HtmlFormatter
from pygments.style import StyleMeta
from pygments.styles import get_style_by_name
from pygments.token import STANDARD_TYPES, Token, _TokenType

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
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "abbr": {"title"},
    "th": {"align"},
    "td": {"align"},
    "button": {"type", "aria-label"},
}
URL_SCHEMES = frozenset({"http", "https", "mailto"})
# Pygments' token classes and the code block's frame; no other class survives sanitizing.
ALLOWED_CLASSES = {
    "span": frozenset(name for name in STANDARD_TYPES.values() if name) | {"code-lang"},
    "div": frozenset({"code-block", "code-head", "highlight"}),
    "button": frozenset({"copy", "copy-code"}),
}
# The Pygments styles of the two themes: every token colour at least 4.5:1 on the style's own
# background (WCAG AA for text), which the code block uses too.
LIGHT_STYLE = "xcode"
DARK_STYLE = "lightbulb"


class _RawHtmlAsText(Extension):
    """Drop Python-Markdown's raw-HTML handling, so HTML in the source is escaped as text."""

    def extendMarkdown(self, md: markdown.Markdown) -> None:
        md.preprocessors.deregister("html_block")
        md.inlinePatterns.deregister("html")


class _CodeBlockFormatter(HtmlFormatter):
    """Pygments' HTML under a head with the fence's language (``text`` without one) and a "Copy" button."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.language = str(options.get("lang_str", "")).removeprefix("language-") or "text"

    def format_unencoded(self, tokensource: Any, outfile: IO[str]) -> None:
        language = escape(self.language)
        outfile.write(
            '<div class="code-block"><div class="code-head">'
            f'<span class="code-lang">{language}</span>'
            '<button type="button" class="copy copy-code" aria-label="Copy the code">Copy</button></div>'
        )
        super().format_unencoded(tokensource, outfile)
        outfile.write("</div>")


_DIGIT_STAR = re.compile(r"(?<=\d)\*(?=\s*\d)|(?<=\d\s)\*(?=\d)")
_FENCE = ("```", "~~~")


def _multiplication_kept(text: str) -> str:
    """``text`` with every ``*`` between digits (``2*3*4``) escaped, so arithmetic is not read as emphasis; code
    blocks and spans are left alone (they show their text verbatim anyway)."""
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
    """``text`` (Markdown written by a user or a model) as sanitized HTML, safe to insert as is."""
    if not text:
        return mark_safe("")
    html = markdown.markdown(
        _multiplication_kept(text),
        extensions=["fenced_code", "codehilite", "tables", "sane_lists", _RawHtmlAsText()],
        extension_configs={
            "codehilite": {"guess_lang": False, "css_class": "highlight", "pygments_formatter": _CodeBlockFormatter}
        },
        output_format="html",
    )
    return mark_safe(
        nh3.clean(
            html,
            tags=set(ALLOWED_TAGS) | set(ALLOWED_CLASSES),
            attributes={tag: set(names) for tag, names in ALLOWED_ATTRIBUTES.items()},
            allowed_classes={tag: set(names) for tag, names in ALLOWED_CLASSES.items()},
            url_schemes=set(URL_SCHEMES),
            link_rel="noopener noreferrer nofollow",
        )
    )


def highlight_css() -> str:
    """The code blocks' colours (``static/chat/highlight.css``): per token class ``light-dark(<light>, <dark>)``, so
    the page's ``color-scheme`` picks one; bold and italic come from the light style."""
    light, dark = get_style_by_name(LIGHT_STYLE), get_style_by_name(DARK_STYLE)
    rules = [
        "/* Generated by chatapp.ui.markup.highlight_css(): code highlighting for both themes. */",
        f".highlight {{ background: light-dark({light.background_color}, {dark.background_color}); "
        f"color: light-dark({_colour(light, Token)}, {_colour(dark, Token)}); }}",
    ]
    for token, name in sorted(STANDARD_TYPES.items(), key=lambda item: item[1]):
        own = light.style_for_token(token)
        if not name or not (own["color"] or dark.style_for_token(token)["color"]):
            continue
        declarations = [f"color: light-dark({_colour(light, token)}, {_colour(dark, token)})"]
        declarations += ["font-weight: bold"] if own["bold"] else []
        declarations += ["font-style: italic"] if own["italic"] else []
        rules.append(f".highlight .{name} {{ {'; '.join(declarations)}; }}")
    return "\n".join(rules) + "\n"


def _colour(style: StyleMeta, token: _TokenType) -> str:
    """``token``'s colour in ``style``, else its text colour, else the block's own."""
    for candidate in (token, Token.Text, Token):
        if colour := style.style_for_token(candidate)["color"]:
            return f"#{colour}"
    return "currentcolor"
