"""Search across one owner's chats with the database's own full-text search (migration ``0006_message_fulltext``):
SQLite FTS5 (``bm25``, ``snippet``) or PostgreSQL ``to_tsvector`` (``ts_rank_cd``, ``ts_headline``). User text never
reaches either query language as syntax; snippets come back as plain runs for the template to escape."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from chatapp.chats.access import Owner, session_queryset_for_owner
from memory.api import SEARCH_STOPWORDS

SEARCH_MAX_CHARS = 200
SEARCH_MAX_TERMS = 8
SEARCH_LIMIT = 20
WORD_MAX_CHARS = 64
SNIPPET_TOKENS = 16

# Private-use characters around a match in a snippet, and for "<", which ts_headline would drop as the start of a tag.
_START, _STOP, _LT = "\ue000", "\ue001", "\ue002"
_HEADLINE = f"StartSel={_START}, StopSel={_STOP}, MaxWords=24, MinWords=10, MaxFragments=1, FragmentDelimiter=…"
# Letters and digits: what both full-text engines make words of.
_WORD = re.compile(r"[^\W_]+")
_EDGES = re.compile(r"^[\W_]+|[\W_]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MARKS = re.compile(f"([{_START}{_STOP}])")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class SearchTerms:
    """Content words, all required: ``exact`` matched as words (stemmed), ``prefix`` as the start of one."""

    exact: tuple[str, ...] = ()
    prefix: str = ""


@dataclass(frozen=True, kw_only=True)
class MessageHit:
    """One matching message; ``snippet``: ``(text, matched)`` runs around the match."""

    message_id: int
    session_id: int
    title: str
    role: str
    snippet: tuple[tuple[str, bool], ...]


@dataclass(frozen=True, kw_only=True)
class MessageSearch:
    """``status``: ``empty``, ``too_long``, ``no_words``, ``common_words``, ``unavailable`` (nothing searched), else
    ``found`` or ``none``; ``more``: further matches were left out."""

    query: str
    status: str
    hits: list[MessageHit] = field(default_factory=list)
    more: bool = False


def search_terms(query: str) -> SearchTerms | str:
    """The terms of ``query``, or the status saying why there are none; the last word is a prefix while it is typed."""
    if not query.strip():
        return "empty"
    if len(query) > SEARCH_MAX_CHARS:
        return "too_long"
    words = [_EDGES.sub("", chunk)[:WORD_MAX_CHARS] for chunk in _CONTROL.sub(" ", query).lower().split()]
    words = [word for word in words if _WORD.search(word)]
    if not words:
        return "no_words"
    typing = bool(_WORD.fullmatch(query[-1]))
    content = [word for word in words if " ".join(_WORD.findall(word)) not in SEARCH_STOPWORDS]
    if not content:
        return "common_words"
    terms = list(dict.fromkeys(content))[:SEARCH_MAX_TERMS]
    last = terms[-1]
    if typing and last == content[-1] == words[-1] and len(last) > 1 and _WORD.fullmatch(last):
        return SearchTerms(exact=tuple(terms[:-1]), prefix=last)
    return SearchTerms(exact=tuple(terms))


def message_search_for_owner(*, owner: Owner, query: str, limit: int = SEARCH_LIMIT) -> MessageSearch:
    """The owner's messages (theirs only) holding every term of ``query``, best first, at most ``limit``."""
    terms = search_terms(query)
    if isinstance(terms, str):
        return MessageSearch(query=query, status=terms)
    if owner.user_id is None and not owner.session_key:
        return MessageSearch(query=query, status="none")
    owned, owned_params = session_queryset_for_owner(owner).values("pk").query.sql_with_params()
    if connection.vendor == "sqlite":
        sql, params = _sqlite_sql(terms, owned, [*owned_params], limit + 1)
    elif connection.vendor == "postgresql":
        sql, params = _postgresql_sql(terms, owned, [*owned_params], limit + 1)
    else:
        return MessageSearch(query=query, status="unavailable")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    more, rows = len(rows) > limit, rows[:limit]
    titles = {s.pk: str(s) for s in session_queryset_for_owner(owner).filter(pk__in={row[1] for row in rows})}
    hits = [
        MessageHit(message_id=row[0], session_id=row[1], title=titles[row[1]], role=row[2], snippet=_runs(row[3]))
        for row in rows
        if row[1] in titles
    ]
    return MessageSearch(query=query, status="found" if hits else "none", hits=hits, more=more)


def _fts5_phrase(term: str) -> str:
    return '"' + " ".join(_WORD.findall(term)) + '"'


def _sqlite_sql(terms: SearchTerms, owned: str, owned_params: list[Any], limit: int) -> tuple[str, list[Any]]:
    match = " ".join([*map(_fts5_phrase, terms.exact), *([_fts5_phrase(terms.prefix) + "*"] if terms.prefix else [])])
    sql = (
        "SELECT m.id, m.session_id, m.role, snippet(chatapp_message_fts, 0, %s, %s, '…', %s) "
        "FROM chatapp_message_fts JOIN chatapp_message m ON m.id = chatapp_message_fts.rowid "
        f"WHERE chatapp_message_fts MATCH %s AND m.session_id IN ({owned}) "
        "ORDER BY bm25(chatapp_message_fts), m.id DESC LIMIT %s"
    )
    return sql, [_START, _STOP, SNIPPET_TOKENS, match, *owned_params, limit]


def _postgresql_sql(terms: SearchTerms, owned: str, owned_params: list[Any], limit: int) -> tuple[str, list[Any]]:
    # phraseto_tsquery parses text as to_tsvector does, without syntax; a prefix is one word run, so "word:*" is safe.
    parts = ["phraseto_tsquery('english', %s)"] * len(terms.exact)
    params: list[Any] = [*terms.exact]
    if terms.prefix:
        parts.append("to_tsquery('english', %s)")
        params.append(f"{terms.prefix}:*")
    # The expression and condition of the partial index, repeated so that PostgreSQL uses it.
    body = "to_tsvector('english', replace(m.content, '<', ' '))"
    sql = (
        "SELECT h.id, h.session_id, h.role, "
        "ts_headline('english', replace(h.content, '<', %s), h.query, %s) FROM ("
        f"SELECT m.id, m.session_id, m.role, m.content, q.query, ts_rank_cd({body}, q.query) AS rank "
        f"FROM chatapp_message m, (SELECT {' && '.join(parts)} AS query) q "
        f"WHERE {body} @@ q.query AND m.role IN ('user', 'assistant') AND m.origin = 'model' "
        f"AND m.session_id IN ({owned}) ORDER BY rank DESC, m.id DESC LIMIT %s"
        ") h ORDER BY h.rank DESC, h.id DESC"
    )
    return sql, [_LT, _HEADLINE, *params, *owned_params, limit]


def _runs(marked: str) -> tuple[tuple[str, bool], ...]:
    """A snippet with match markers as ``(text, matched)`` runs, whitespace collapsed; stray markers only toggle."""
    text = _SPACE.sub(" ", marked.replace(_LT, "<")).strip()
    runs: list[tuple[str, bool]] = []
    matched = False
    for part in _MARKS.split(text):
        if part in (_START, _STOP):
            matched = part == _START
        elif part:
            runs.append((part, matched))
    return tuple(runs)
