"""Full-text search over what a person reads of the owner's messages (:mod:`chatapp.chats.search`): user messages and
the model's replies with text. SQLite: an external-content FTS5 table kept by triggers that ``delete`` exactly what
they indexed. PostgreSQL: a partial GIN index on the expression the search repeats, "<" read as a space (the parser
would drop what looks like markup, a ``<script>``'s text). Other databases get nothing."""

from __future__ import annotations

from typing import Any

from django.db import migrations

INDEXED = "{row}.role IN ('user', 'assistant') AND {row}.origin = 'model' AND coalesce({row}.content, '') <> ''"
_ADD = "INSERT INTO chatapp_message_fts(rowid, content) SELECT new.id, new.content WHERE " + INDEXED.format(row="new")
_REMOVE = (
    "INSERT INTO chatapp_message_fts(chatapp_message_fts, rowid, content) SELECT 'delete', old.id, old.content WHERE "
    + INDEXED.format(row="old")
)
SQLITE_FORWARD = [
    "CREATE VIRTUAL TABLE chatapp_message_fts USING fts5(content, content = 'chatapp_message', content_rowid = 'id', "
    "tokenize = 'porter unicode61 remove_diacritics 2')",
    f"CREATE TRIGGER chatapp_message_fts_insert AFTER INSERT ON chatapp_message BEGIN {_ADD}; END",
    f"CREATE TRIGGER chatapp_message_fts_delete AFTER DELETE ON chatapp_message BEGIN {_REMOVE}; END",
    "CREATE TRIGGER chatapp_message_fts_update AFTER UPDATE OF content, role, origin ON chatapp_message "
    f"BEGIN {_REMOVE}; {_ADD}; END",
    "INSERT INTO chatapp_message_fts(rowid, content) SELECT id, content FROM chatapp_message WHERE "
    + INDEXED.format(row="chatapp_message"),
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS chatapp_message_fts_update",
    "DROP TRIGGER IF EXISTS chatapp_message_fts_delete",
    "DROP TRIGGER IF EXISTS chatapp_message_fts_insert",
    "DROP TABLE IF EXISTS chatapp_message_fts",
]
POSTGRESQL_FORWARD = [
    "CREATE INDEX chatapp_message_content_tsv ON chatapp_message "
    "USING gin (to_tsvector('english', replace(content, '<', ' '))) "
    "WHERE role IN ('user', 'assistant') AND origin = 'model'",
]
POSTGRESQL_BACKWARD = ["DROP INDEX IF EXISTS chatapp_message_content_tsv"]


def _run(statements: dict[str, list[str]]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("chatapp", "0005_message_origin")]

    operations = [
        migrations.RunPython(
            _run({"sqlite": SQLITE_FORWARD, "postgresql": POSTGRESQL_FORWARD}),
            _run({"sqlite": SQLITE_BACKWARD, "postgresql": POSTGRESQL_BACKWARD}),
        ),
    ]
