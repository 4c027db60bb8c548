"""Full-text search over chunks with the database's own engine (see :mod:`chatapp.kb.search`).

SQLite: an FTS5 table (its own copy of the text, rowid = chunk id) kept in step with
``chatapp_chunk`` by triggers, so cascades and flushes that bypass the ORM's services cannot leave
it stale. PostgreSQL: a GIN index on the same ``to_tsvector('english', text)`` expression that
``kb_search`` queries. Other databases get nothing (``kb_search`` refuses them).
"""

from __future__ import annotations

from django.db import migrations

SQLITE_FORWARD = [
    "CREATE VIRTUAL TABLE chatapp_chunk_fts USING fts5(text, tokenize = 'porter unicode61 remove_diacritics 2')",
    "CREATE TRIGGER chatapp_chunk_fts_insert AFTER INSERT ON chatapp_chunk BEGIN "
    "INSERT INTO chatapp_chunk_fts(rowid, text) VALUES (new.id, new.text); END",
    "CREATE TRIGGER chatapp_chunk_fts_delete AFTER DELETE ON chatapp_chunk BEGIN "
    "DELETE FROM chatapp_chunk_fts WHERE rowid = old.id; END",
    "CREATE TRIGGER chatapp_chunk_fts_update AFTER UPDATE ON chatapp_chunk BEGIN "
    "DELETE FROM chatapp_chunk_fts WHERE rowid = old.id; "
    "INSERT INTO chatapp_chunk_fts(rowid, text) VALUES (new.id, new.text); END",
    "INSERT INTO chatapp_chunk_fts(rowid, text) SELECT id, text FROM chatapp_chunk",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS chatapp_chunk_fts_update",
    "DROP TRIGGER IF EXISTS chatapp_chunk_fts_delete",
    "DROP TRIGGER IF EXISTS chatapp_chunk_fts_insert",
    "DROP TABLE IF EXISTS chatapp_chunk_fts",
]
POSTGRESQL_FORWARD = [
    "CREATE INDEX chatapp_chunk_text_tsv ON chatapp_chunk USING gin (to_tsvector('english', text))",
]
POSTGRESQL_BACKWARD = ["DROP INDEX IF EXISTS chatapp_chunk_text_tsv"]


def _run(statements: dict[str, list[str]]):
    def run(apps, schema_editor) -> None:
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("chatapp", "0001_initial")]

    operations = [
        migrations.RunPython(
            _run({"sqlite": SQLITE_FORWARD, "postgresql": POSTGRESQL_FORWARD}),
            _run({"sqlite": SQLITE_BACKWARD, "postgresql": POSTGRESQL_BACKWARD}),
        ),
    ]
