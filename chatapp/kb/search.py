"""Knowledge-base search with SQLite FTS5 (``bm25``) or PostgreSQL ``to_tsvector`` (``ts_rank_cd``), both from
migration ``0002_chunk_fulltext``; user text never reaches either query language as syntax."""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.db import connection

from memory.api import SEARCH_STOPWORDS, TokenCounter

QUERY_MAX_TOKENS = 32
WORD_MAX_CHARS = 64
SEARCH_MAX_LIMIT = 20

_WORD = re.compile(r"\w+", re.UNICODE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Function words that match nearly every passage; dropping them keeps OR-queries selective.
_STOPWORDS = SEARCH_STOPWORDS


@dataclass(frozen=True, kw_only=True)
class Passage:
    """One search hit; ``score``: higher is more relevant, within one result list."""

    chunk_id: int
    document_id: int
    title: str
    text: str
    score: float

    def as_dict(self) -> dict[str, object]:
        return {
            "chunk_id": self.chunk_id,
            "document_id": self.document_id,
            "title": self.title,
            "text": self.text,
            "score": self.score,
        }


def search_words(query: str) -> list[str]:
    """The bounded, deduplicated, lower-case words of ``query`` (stopwords only if nothing else); inner punctuation
    stays (``ks-312``) for each backend to tokenize like its documents."""
    cleaned = _CONTROL.sub(" ", query).lower().split()
    words = [word[:WORD_MAX_CHARS] for word in cleaned if _WORD.search(word)]
    content_words = [word for word in words if " ".join(_WORD.findall(word)) not in _STOPWORDS] or words
    return list(dict.fromkeys(content_words))[:QUERY_MAX_TOKENS]


def fts5_query(words: list[str]) -> str:
    """An FTS5 MATCH of any of ``words``, each a quoted phrase of its word runs, so no user syntax survives."""
    return " OR ".join(f'"{" ".join(_WORD.findall(word))}"' for word in words)


def kb_search(query: str, limit: int = 4) -> list[Passage]:
    """The ``limit`` best chunks for any word of ``query``. Raises ``NotImplementedError`` without full-text search."""
    words = search_words(query)
    limit = max(1, min(limit, SEARCH_MAX_LIMIT))
    if not words:
        return []
    if connection.vendor == "sqlite":
        sql = (
            "SELECT c.id, c.document_id, d.title, c.text, -bm25(chatapp_chunk_fts) AS score "
            "FROM chatapp_chunk_fts JOIN chatapp_chunk c ON c.id = chatapp_chunk_fts.rowid "
            "JOIN chatapp_document d ON d.id = c.document_id "
            "WHERE chatapp_chunk_fts MATCH %s ORDER BY bm25(chatapp_chunk_fts), c.id LIMIT %s"
        )
        params: list[str | int] = [fts5_query(words), limit]
    elif connection.vendor == "postgresql":
        # plainto_tsquery parses a word as to_tsvector parses the text, with no syntax to get wrong; "||" ORs them.
        any_word = " || ".join(["plainto_tsquery('english', %s)"] * len(words))
        sql = (
            "SELECT c.id, c.document_id, d.title, c.text, ts_rank_cd(to_tsvector('english', c.text), q.query) AS score "
            f"FROM chatapp_chunk c JOIN chatapp_document d ON d.id = c.document_id, (SELECT {any_word} AS query) q "
            "WHERE to_tsvector('english', c.text) @@ q.query ORDER BY score DESC, c.id LIMIT %s"
        )
        params = [*words, limit]
    else:
        raise NotImplementedError(f"kb_search needs SQLite FTS5 or PostgreSQL, not {connection.vendor}")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [
        Passage(chunk_id=row[0], document_id=row[1], title=row[2], text=row[3], score=float(row[4])) for row in rows
    ]


def passages_format(passages: list[Passage]) -> str:
    """Search hits as prompt or tool-result text: ``[n] title`` then the passage, blank-line separated."""
    return "\n\n".join(f"[{index}] {p.title}\n{p.text}" for index, p in enumerate(passages, start=1))


def passages_fit(passages: list[Passage], *, budget_tokens: int, counter: TokenCounter) -> list[Passage]:
    """The best-ranked ``passages`` that fit ``budget_tokens`` tokens; the first always, so a tiny window gets some."""
    kept: list[Passage] = []
    used = 0
    for passage in passages:
        tokens = counter.count_text(passages_format([passage]))
        if kept and used + tokens > budget_tokens:
            continue
        kept.append(passage)
        used += tokens
    return kept
