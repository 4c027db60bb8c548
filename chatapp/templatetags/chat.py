"""Template filters of the chat pages: ``markdown``, ``pretty_json``, ``mark_label``, ``tokens``, ``ms``."""

from __future__ import annotations

import json
from typing import Any

from django import template
from django.utils.safestring import SafeString

from chatapp.ui.inspector.marks import MARK_LABELS
from chatapp.ui.markup import markdown_render

register = template.Library()


@register.filter
def markdown(text: str | None) -> SafeString:
    return markdown_render(text)


@register.filter
def pretty_json(value: Any) -> str:
    """A JSON string (or value) indented for reading; text that is not JSON comes back as is."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, ensure_ascii=False, indent=2)


@register.filter
def mark_label(mark: str) -> str:
    return MARK_LABELS.get(mark, "")


@register.filter
def tokens(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


@register.filter
def ms(value: int | None) -> str:
    """``1,509\u00a0ms`` (a no-break space keeps the unit with the figure); ``—`` for None."""
    return "—" if value is None else f"{value:,}\u00a0ms"
