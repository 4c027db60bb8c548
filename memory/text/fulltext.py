"""Full-text search terms for the recall index (docs/memory.md §12 "The index"), pure. Neither FTS5 nor ``to_tsvector``
splits CJK text into words, so an item's CJK characters are indexed one by one and a query's CJK runs become
two-character phrases. User text never reaches a query language as syntax."""

from __future__ import annotations

import itertools
import re

# Terms of one query kept for the search; the rest of a very long question adds nothing.
QUERY_MAX_TERMS = 32
WORD_MAX_CHARS = 64

# Han, kana, Hangul and compatibility ideographs: scripts written without spaces between words.
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_CJK_RUN = re.compile(_CJK.pattern + "+")
_WORD = re.compile(r"\w+", re.UNICODE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# A final English possessive ("Ingeborg's", "James’") is not searched: the phrase "ingeborg s" misses "Ingeborg is".
_POSSESSIVE = re.compile(r"(?<=\w)['’]s?(?=\W*$)")
# Words matching nearly every passage; dropping them keeps OR-queries selective. The knowledge base uses this list,
# recall adds the auxiliaries and pronouns of conversation.
SEARCH_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "do",
        "does",
        "for",
        "from",
        "how",
        "i",
        "in",
        "is",
        "it",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "please",
        "tell",
        "that",
        "the",
        "their",
        "there",
        "this",
        "to",
        "was",
        "we",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)
STOPWORDS = SEARCH_STOPWORDS | frozenset(
    [
        "did",
        "done",
        "has",
        "have",
        "had",
        "been",
        "were",
        "would",
        "could",
        "should",
        "about",
        "any",
        "some",
        "just",
        "also",
        "than",
        "then",
        "them",
        "they",
        "he",
        "she",
        "his",
        "her",
        "him",
        "its",
        "us",
        "am",
        "so",
        "if",
        "but",
        "not",
    ]
)


def search_text(text: str) -> str:
    """``text`` with a space on each side of every CJK character, so each is one token; ``""`` without CJK (the index
    then reads ``text`` itself)."""
    if not _CJK.search(text):
        return ""
    return _CJK.sub(lambda match: f" {match.group()} ", text)


def query_terms(query: str) -> list[str]:
    """The terms of ``query``, each matched as a phrase, any sufficing: lower-cased words with a letter or digit,
    stopwords dropped unless nothing else is left, Latin parts whole (``zx-88213``: each backend tokenizes it like the
    items), CJK runs as spaced bigrams (``东京的`` → ``东 京``, ``京 的``); deduplicated, in order, bounded."""
    cleaned = _CONTROL.sub(" ", query).lower().split()
    latin: list[str] = []
    cjk: list[str] = []
    for word in cleaned:
        for run in _CJK_RUN.findall(word):
            cjk.extend([f"{a} {b}" for a, b in itertools.pairwise(run)] if len(run) > 1 else [run])
        rest = _POSSESSIVE.sub("", _CJK_RUN.sub(" ", word))
        latin.extend(part[:WORD_MAX_CHARS] for part in rest.split() if _WORD.search(part))
    content = [word for word in latin if " ".join(_WORD.findall(word)) not in STOPWORDS]
    terms = (content or ([] if cjk else latin)) + cjk
    return list(dict.fromkeys(terms))[:QUERY_MAX_TERMS]


def fts5_match(terms: list[str]) -> str:
    """An FTS5 MATCH of any of ``terms``, each a quoted phrase of its letter/digit runs (``zx-88213`` → ``"zx 88213"``),
    so no operator, column filter, prefix or quote of user text survives."""
    phrases = [" ".join(_WORD.findall(term)) for term in terms]
    return " OR ".join(f'"{phrase}"' for phrase in phrases if phrase)
