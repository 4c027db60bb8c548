"""Where sentences end (docs/memory.md F-39), for the extractive summarizer and the offline engine. Pure."""

from __future__ import annotations

import re

# Words whose period is not a sentence end; not "No" ("No. I did not") nor "etc" ("etc. The next"), which often are.
ABBREVIATIONS = (
    *("Dr", "Mr", "Mrs", "Ms", "Mx", "Prof", "Rev", "Gen", "Col", "Capt", "Lt", "Sgt", "St", "Jr", "Sr"),
    *("Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec"),
    *("Mon", "Tue", "Tues", "Wed", "Thu", "Thur", "Thurs", "Fri", "Sat", "Sun"),
    *("Ave", "Apt", "Blvd", "Rd", "Ste", "Inc", "Ltd", "Co", "Corp", "Dept", "Ext", "Tel"),
    *("approx", "vs", "cf"),
)
_NOT_ABBREVIATED = "".join(
    rf"(?<!\b{re.escape(form)}\.)"
    for word in ABBREVIATIONS
    for form in dict.fromkeys((word, word.lower(), word.capitalize()))
)
SENTENCE_END_RE = re.compile(
    r"(?:\.(?<!\b[A-Za-z]\.)" + _NOT_ABBREVIATED + r"[.!?]*|[!?][.!?]*)[\"'”’)\]]*(?=\s)(?!\s+[a-z0-9])"
    r"|[。！？；]+[」』”’）)]*|\n"
)
"""Matches a sentence end: its punctuation (closing quotes and brackets included), or the line break."""


def split_sentences(text: str) -> list[str]:
    """``text`` cut into stripped, non-empty sentences, each keeping its end punctuation."""
    pieces, start = [], 0
    for match in SENTENCE_END_RE.finditer(text):
        pieces.append(text[start : match.end()])
        start = match.end()
    pieces.append(text[start:])
    return [piece.strip() for piece in pieces if piece.strip()]
