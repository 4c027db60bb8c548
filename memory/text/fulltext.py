"""Full-text search terms for the recall index (docs/memory.md §12, "the index"); pure.

The database's own full-text search indexes each item (SQLite FTS5 with the ``porter unicode61``
tokenizer, PostgreSQL ``to_tsvector('english', …)``, as the knowledge base does). Neither splits
CJK text into words: a run of Chinese or Japanese characters would be one token, found only by a
query holding exactly that run. So an item's CJK characters are indexed one by one
(:func:`search_text` puts spaces around each), and a query's CJK runs become phrases of two
adjacent characters (bigrams, :func:`query_terms`): "东京的酒店" finds "我们住在东京" through the
phrase "东 京". Latin words are matched like the knowledge base matches them (stemmed, stopwords
dropped).

User text never reaches a query language as syntax: SQLite gets each term as a double-quoted
phrase of its letter and digit runs (:func:`fts5_match`), PostgreSQL gets each term as a
parameter of ``phraseto_tsquery``.
"""

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
# An English possessive at the end of a word ("Ingeborg's", "James’"): searched without it, so
# "Ingeborg's wedding" finds "Ingeborg is getting married" (as a phrase, "ingeborg s" would not).
_POSSESSIVE = re.compile(r"(?<=\w)['’]s?(?=\W*$)")
# Function words that match nearly every passage or item; dropping them keeps OR-queries
# selective. The knowledge base's search uses this list (chatapp.kb.search); recall adds the
# auxiliaries and pronouns of conversation.
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
    """What the full-text index holds for ``text`` when it differs from ``text``: every CJK
    character with a space on each side (so each is one token); ``""`` when ``text`` has no CJK
    character (the index then reads ``text`` itself)."""
    if not _CJK.search(text):
        return ""
    return _CJK.sub(lambda match: f" {match.group()} ", text)


def query_terms(query: str) -> list[str]:
    """The search terms of ``query``, each to be matched as a phrase, any of them sufficing.

    Words are whitespace-separated, lower-cased, with control characters removed; only words with
    a letter or digit count; stopwords are dropped (unless nothing else is left). A word's Latin
    part stays whole (``zx-88213``: each backend tokenizes it as it tokenized the items); each CJK
    run becomes its bigrams, spaced (``东京的`` → ``东 京``, ``京 的``), a lone CJK character
    itself. A possessive ending (``'s``, ``’s``, a trailing apostrophe) is dropped: ``Ingeborg's``
    searches for ``ingeborg``. Duplicates are removed; at most :data:`QUERY_MAX_TERMS` terms, in
    order. ``[]`` for a query with nothing searchable."""
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
    """An FTS5 MATCH expression matching any of ``terms``: each becomes a double-quoted phrase of
    its letter/digit runs (``zx-88213`` → ``"zx 88213"``), so no operator, column filter, prefix
    or quote from user text survives. ``""`` when no term has a letter or digit."""
    phrases = [" ".join(_WORD.findall(term)) for term in terms]
    return " OR ".join(f'"{phrase}"' for phrase in phrases if phrase)
