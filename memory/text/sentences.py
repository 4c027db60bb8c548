"""Where sentences end (docs/memory.md F-39): one rule for the extractive summarizer and the
offline engine (the recall index keeps its own, in :mod:`memory.recall`: its pieces are verbatim
slices, so a cut there leaves nothing out). Pure functions, no I/O.

A sentence ends at ``.``, ``!`` or ``?`` (with any closing quotes or brackets) before whitespace,
so "A-1.5" or "example.com" stay whole; at the CJK full stops 。！？ and the full-width semicolon
；, which no space follows in CJK text; and at a line break. A period does not end a sentence
after a single letter (initials, "U.S.", "a.m.", "e.g."), after one of :data:`ABBREVIATIONS`
("Dr. Okonkwo", "Jan. 5", "Acme Inc. in"), or when the next word starts with a lowercase letter
or a digit ("approx. 300", "10 a.m. with Prof. Lee"): cutting there made the extractive summary
join the pieces it kept into statements nobody made.
"""

from __future__ import annotations

import re

# Words whose period is an abbreviation's, not a sentence end, even before a capitalised word:
# titles, months, weekdays, address and company words, and a few Latin ones. Not "No" ("No. I
# did not") nor "etc" ("..., etc. The next"), which end sentences too often.
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
"""Matches the end of a sentence (see the module docstring); the match is the end's punctuation,
or the line break."""


def split_sentences(text: str) -> list[str]:
    """``text`` cut into sentences by :data:`SENTENCE_END_RE`, each keeping its end punctuation.
    Pieces are stripped; empty ones are dropped."""
    pieces, start = [], 0
    for match in SENTENCE_END_RE.finditer(text):
        pieces.append(text[start : match.end()])
        start = match.end()
    pieces.append(text[start:])
    return [piece.strip() for piece in pieces if piece.strip()]
