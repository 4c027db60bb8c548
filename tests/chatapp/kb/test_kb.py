"""The knowledge base: chunking, idempotent loading, and full-text search that user text can
never break (SQLite FTS5 here; PostgreSQL when DATABASE_URL points at one)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import connection

from chatapp.kb.documents import (
    CHUNK_MAX_CHARS,
    DEMO_KB_DIR,
    chunk_text,
    document_load_directory,
    document_upsert,
)
from chatapp.kb.search import fts5_query, kb_search, passages_fit, search_words
from chatapp.models import Chunk, Document
from memory.tokens.counter import get_counter

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "query",
    [
        'NEAR(plan price) OR "',
        "Team AND OR NOT *",
        'price"',
        "^plan",
        "col:umn price",
        "(((",
        "*",
        "-plan +price",
        "plan* NOT",
        "'; DROP TABLE chatapp_chunk; --",
        "\x00\x01 plan",
        "価格 プラン Team",
        "price " * 500,
        "",
        "   ",
        "?!.,;",
        "& | ! <-> :*",
    ],
)
def test_any_user_text_is_a_valid_query(demo_kb, query):
    passages = kb_search(query)
    assert isinstance(passages, list) and len(passages) <= 4


def test_search_ranks_the_passage_that_answers_first(demo_kb):
    passages = kb_search("What is the Team plan price?")
    assert passages[0].title == "Kestrel Sync plans and pricing"
    assert "Team plan price: 12 euros per user per month" in passages[0].text
    assert [p.score for p in passages] == sorted((p.score for p in passages), reverse=True)
    assert kb_search("error KS-312")[0].text.startswith("Error KS-312: certificate problem")


def test_search_stems_words_and_honours_the_limit(demo_kb):
    assert any("encrypted" in p.text for p in kb_search("encryption"))
    assert len(kb_search("plan", limit=2)) == 2
    assert len(kb_search("plan", limit=1000)) <= 20
    assert kb_search("zzzyzzy qqqxq") == []


def test_user_text_becomes_plain_words_and_quoted_phrases():
    words = search_words('What is "NEAR(team plan)" OR price*? KS-312\x00')
    assert words == ['"near(team', 'plan)"', "price*?", "ks-312"]
    assert fts5_query(words) == '"near team" OR "plan" OR "price" OR "ks 312"'
    assert search_words("what is it") == ["what", "is", "it"]  # only stopwords: keep them
    assert search_words("?! ... --") == []
    assert len(search_words(" ".join(f"w{i}" for i in range(100)))) == 32


def test_chunks_are_bounded_and_carry_their_heading():
    body = "# Title\n\nIntro paragraph.\n\n## Section A\n\n" + ("word " * 400) + "\n\n## Section B\nShort text."
    chunks = chunk_text(body)
    assert chunks[0] == "Title\n\nIntro paragraph."
    assert all(len(c) <= CHUNK_MAX_CHARS + 20 for c in chunks)
    assert all(c.startswith("Section A\n\n") for c in chunks[1:-1])
    assert chunks[-1] == "Section B\n\nShort text."
    assert chunk_text("") == []


def test_loading_the_demo_kb_is_idempotent(db):
    out = io.StringIO()
    call_command("load_demo_kb", stdout=out)
    assert out.getvalue() == "demo knowledge base: 6 loaded or updated, 0 unchanged\n"
    documents, chunks = Document.objects.count(), list(Chunk.objects.values_list("id", flat=True))
    assert documents == 6 and chunks
    assert document_load_directory(DEMO_KB_DIR, slug_prefix="demo-") == {"changed": 0, "unchanged": 6}
    assert list(Chunk.objects.values_list("id", flat=True)) == chunks


def test_changed_and_deleted_documents_leave_no_stale_index_entries(db):
    document, changed = document_upsert(slug="notes", title="Notes", body="The walrus count is 17.")
    assert changed and kb_search("walrus")[0].text == "The walrus count is 17."
    document_upsert(slug="notes", title="Notes", body="The penguin count is 23.")
    assert kb_search("walrus") == [] and kb_search("penguin")[0].document_id == document.pk
    Document.objects.filter(pk=document.pk).delete()
    assert kb_search("penguin") == []
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM chatapp_chunk_fts")
            assert cursor.fetchone()[0] == 0


def test_passages_fit_a_token_budget_keeping_at_least_the_best(demo_kb):
    counter = get_counter("gpt-4o-mini")
    passages = kb_search("plan storage price", limit=4)
    assert len(passages) == 4
    assert passages_fit(passages, budget_tokens=1, counter=counter) == passages[:1]
    assert passages_fit(passages, budget_tokens=10_000, counter=counter) == passages
