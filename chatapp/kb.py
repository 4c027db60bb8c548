"""The knowledge base: documents cut into chunks, searched with the database's own full-text search.

SQLite (the embedded default) indexes chunks in the FTS5 table ``chatapp_chunk_fts`` (porter
stemming, ranked with ``bm25``); PostgreSQL uses ``to_tsvector('english', text)`` with a GIN
index, ranked with ``ts_rank_cd``. Both are created by migration ``0002_chunk_fulltext``. On
SQLite, triggers on ``chatapp_chunk`` keep the FTS table in step with every write of a chunk row,
including cascades and flushes that never pass through :func:`document_upsert`.

User text never reaches either query language as syntax (:func:`fts5_query` quotes each word's
letters and digits; PostgreSQL gets each word through ``plainto_tsquery``), so a question such as
``"what's NEAR(a b) OR *?"`` cannot be a syntax error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from django.db import connection, transaction
from django.db.models import Count
from django.utils.text import slugify

from chatapp.models import Chunk, Document
from memory.tokens import TokenCounter

DEMO_KB_DIR = Path(__file__).resolve().parent / "demo_kb"
UPLOAD_SLUG_PREFIX = "upload-"

# Chunks stay small so that a few of them fit the offline engine's small context window.
CHUNK_MAX_CHARS = 600
# Words of a query kept for the search; the rest of a very long question adds nothing.
QUERY_MAX_TOKENS = 32
WORD_MAX_CHARS = 64
SEARCH_MAX_LIMIT = 20

_WORD = re.compile(r"\w+", re.UNICODE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$")
# Function words that match nearly every passage; dropping them keeps OR-queries selective.
_STOPWORDS = frozenset(
    "a an and are as at be by can do does for from how i in is it me my of on or our please "
    "tell that the their there this to was we what when where which who why will with you your".split()
)


@dataclass(frozen=True, kw_only=True)
class Passage:
    """One search hit: a chunk's text with its document. ``score``: higher is more relevant
    (comparable only within one result list)."""

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


def chunk_text(body: str, *, max_chars: int = CHUNK_MAX_CHARS) -> list[str]:
    """Cut a Markdown/plain-text ``body`` into passages of at most about ``max_chars`` characters.

    Paragraphs are packed together up to the limit; a paragraph longer than the limit is cut at
    word boundaries. Each passage starts with the nearest preceding Markdown heading, so a hit
    says what it is about. Empty bodies give no chunks.
    """
    chunks: list[str] = []
    heading = ""
    current: list[str] = []

    def flush() -> None:
        if current:
            chunks.append("\n\n".join([heading, *current] if heading else current))
            current.clear()

    for paragraph in (p.strip() for p in re.split(r"\n\s*\n", body)):
        lines = paragraph.splitlines()
        match = _HEADING.match(lines[0]) if lines else None
        if match:
            flush()
            heading = match.group("title")
            paragraph = "\n".join(lines[1:]).strip()
        if not paragraph:
            continue
        budget = max(max_chars // 2, max_chars - len(heading))
        for piece in _split_long(paragraph, budget):
            if current and sum(len(p) + 2 for p in current) + len(piece) > budget:
                flush()
            current.append(piece)
    flush()
    return chunks


def _split_long(paragraph: str, max_chars: int) -> list[str]:
    if len(paragraph) <= max_chars:
        return [paragraph]
    pieces: list[str] = []
    words: list[str] = []
    size = 0
    for word in paragraph.split():
        if words and size + len(word) + 1 > max_chars:
            pieces.append(" ".join(words))
            words, size = [], 0
        words.append(word)
        size += len(word) + 1
    if words:
        pieces.append(" ".join(words))
    return pieces


@transaction.atomic
def document_upsert(*, slug: str, title: str, body: str) -> tuple[Document, bool]:
    """Create or replace the document ``slug`` and its chunks; returns ``(document, changed)``.

    Idempotent: an unchanged title and body write nothing (``changed`` is False). A changed
    document gets all its chunks rewritten; the full-text index follows the chunk rows.
    """
    document = Document.objects.select_for_update().filter(slug=slug).first()
    if document is not None and document.title == title and document.body == body:
        return document, False
    if document is None:
        document = Document.objects.create(slug=slug, title=title, body=body)
    else:
        document.title, document.body = title, body
        document.save(update_fields=["title", "body", "updated"])
        document.chunks.all().delete()
    Chunk.objects.bulk_create(
        Chunk(document=document, ord=index, text=text) for index, text in enumerate(chunk_text(body))
    )
    return document, True


def document_title(body: str, *, fallback: str) -> str:
    """A document's title: its first Markdown heading, else ``fallback`` (at most 200 characters)."""
    heading = next((m.group("title") for line in body.splitlines() if (m := _HEADING.match(line))), fallback)
    return heading[:200]


def document_upload(*, filename: str, body: str, title: str = "") -> tuple[Document, bool]:
    """Store an uploaded text/Markdown document; returns ``(document, changed)`` like
    :func:`document_upsert`. Its slug is ``upload-`` plus the slugified file name (so uploading a
    file of the same name again replaces it); ``title`` defaults to :func:`document_title`.
    The caller validates size and encoding (:class:`chatapp.forms.DocumentUploadForm`)."""
    stem = Path(filename).stem
    slug = f"{UPLOAD_SLUG_PREFIX}{slugify(stem) or 'document'}"[:100]
    return document_upsert(slug=slug, title=(title.strip() or document_title(body, fallback=stem))[:200], body=body)


def document_list() -> list[Document]:
    """Every document of the knowledge base by title, each annotated with ``chunk_count``."""
    return list(Document.objects.annotate(chunk_count=Count("chunks")).order_by("title", "id"))


def document_delete(*, document_id: int) -> bool:
    """Delete document ``document_id`` and its chunks (the full-text index follows); returns
    whether it existed."""
    deleted, _ = Document.objects.filter(pk=document_id).delete()
    return deleted > 0


def document_load_directory(directory: Path, *, slug_prefix: str = "") -> dict[str, int]:
    """Upsert every ``*.md`` and ``*.txt`` file of ``directory`` (slug: ``slug_prefix`` + file stem,
    title: the first Markdown heading, else the stem); returns ``{"changed": n, "unchanged": m}``.
    Idempotent: loading the same files twice changes nothing the second time."""
    counts = {"changed": 0, "unchanged": 0}
    for path in sorted([*directory.glob("*.md"), *directory.glob("*.txt")]):
        body = path.read_text(encoding="utf-8")
        _, changed = document_upsert(
            slug=f"{slug_prefix}{path.stem}"[:100], title=document_title(body, fallback=path.stem), body=body
        )
        counts["changed" if changed else "unchanged"] += 1
    return counts


def search_words(query: str) -> list[str]:
    """The words of ``query`` a search uses: whitespace-separated, lower-cased, control characters
    removed, only words with a letter or digit, stopwords dropped (unless nothing else is left),
    duplicates removed, at most ``QUERY_MAX_TOKENS`` of at most ``WORD_MAX_CHARS`` characters.
    Punctuation inside a word stays (``ks-312``): each backend tokenizes it like its documents."""
    cleaned = _CONTROL.sub(" ", query).lower().split()
    words = [word[:WORD_MAX_CHARS] for word in cleaned if _WORD.search(word)]
    content_words = [word for word in words if " ".join(_WORD.findall(word)) not in _STOPWORDS] or words
    return list(dict.fromkeys(content_words))[:QUERY_MAX_TOKENS]


def fts5_query(words: list[str]) -> str:
    """An FTS5 MATCH expression matching any of ``words``: each word becomes a double-quoted
    phrase of its letter/digit runs (``ks-312`` -> ``"ks 312"``), so no operator, column filter,
    prefix or quote from user text survives."""
    return " OR ".join(f'"{" ".join(_WORD.findall(word))}"' for word in words)


def kb_search(query: str, limit: int = 4) -> list[Passage]:
    """The ``limit`` (1..20) chunks most relevant to ``query``, best first.

    Matches any of the query's words (an OR query: natural-language questions rarely share every
    word with the answer), ranked by ``bm25`` (SQLite FTS5) or ``ts_rank_cd`` (PostgreSQL).
    Arbitrary user text is safe: an empty or punctuation-only query returns ``[]``, never a
    database error. Raises ``NotImplementedError`` on a database without full-text search.
    """
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
        params: list[object] = [fts5_query(words), limit]
    elif connection.vendor == "postgresql":
        # plainto_tsquery parses a word like to_tsvector parses the text and has no syntax to get
        # wrong; "||" ORs the words together.
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
    """The best-ranked ``passages`` whose formatted texts together fit ``budget_tokens`` tokens,
    in rank order; the first one is always kept so that even a tiny window gets some knowledge."""
    kept: list[Passage] = []
    used = 0
    for passage in passages:
        tokens = counter.count_text(passages_format([passage]))
        if kept and used + tokens > budget_tokens:
            continue
        kept.append(passage)
        used += tokens
    return kept
