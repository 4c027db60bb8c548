"""Knowledge-base documents: upload, load, list, delete, and cutting each into chunks for full-text search. On SQLite,
triggers on ``chatapp_chunk`` keep the FTS5 table in step with every chunk write, cascades and flushes included."""

from __future__ import annotations

import re
from pathlib import Path

from django.db import transaction
from django.db.models import Count
from django.utils.text import slugify

from chatapp.models import Chunk, Document

DEMO_KB_DIR = Path(__file__).resolve().parent / "demo_kb"
UPLOAD_SLUG_PREFIX = "upload-"

# Chunks stay small so that a few of them fit the offline engine's small context window.
CHUNK_MAX_CHARS = 600

_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$")


def chunk_text(body: str, *, max_chars: int = CHUNK_MAX_CHARS) -> list[str]:
    """Cut a Markdown or plain-text ``body`` into passages of about ``max_chars`` at most: paragraphs packed, long ones
    cut at words, each led by its nearest heading so that a hit says what it is about."""
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
    """Create or replace document ``slug`` and its chunks; returns ``(document, changed)``. Unchanged writes nothing."""
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
    """Store an uploaded document as ``upload-<file name>`` (the same name again replaces it); returns ``(document,
    changed)``. The caller validates size and encoding (:class:`chatapp.ui.forms.DocumentUploadForm`)."""
    stem = Path(filename).stem
    slug = f"{UPLOAD_SLUG_PREFIX}{slugify(stem) or 'document'}"[:100]
    return document_upsert(slug=slug, title=(title.strip() or document_title(body, fallback=stem))[:200], body=body)


def document_list() -> list[Document]:
    """Every document by title, annotated with ``chunk_count``."""
    return list(Document.objects.annotate(chunk_count=Count("chunks")).order_by("title", "id"))


def document_delete(*, document_id: int) -> bool:
    deleted, _ = Document.objects.filter(pk=document_id).delete()
    return deleted > 0


def document_load_directory(directory: Path, *, slug_prefix: str = "") -> dict[str, int]:
    """Upsert every ``*.md`` and ``*.txt`` of ``directory`` (slug: ``slug_prefix`` + stem); returns
    ``{"changed": n, "unchanged": m}``."""
    counts = {"changed": 0, "unchanged": 0}
    for path in sorted([*directory.glob("*.md"), *directory.glob("*.txt")]):
        body = path.read_text(encoding="utf-8")
        _, changed = document_upsert(
            slug=f"{slug_prefix}{path.stem}"[:100], title=document_title(body, fallback=path.stem), body=body
        )
        counts["changed" if changed else "unchanged"] += 1
    return counts
