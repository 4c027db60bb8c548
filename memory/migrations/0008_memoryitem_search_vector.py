"""PostgreSQL: the recall index's full-text vector stored in a generated column with its own GIN index, so a search
reads each row's vector instead of computing ``to_tsvector`` again for it (docs/memory.md §12 "The index"). The
column is the database's: the model does not list it, inserts and updates leave it to PostgreSQL. Nothing changes
on SQLite, whose FTS5 table is already stored."""

from django.db import migrations

BODY = "CASE WHEN search_text = '' THEN text ELSE search_text END"

FORWARD = [
    "ALTER TABLE memory_memoryitem ADD COLUMN search_vector tsvector "
    f"GENERATED ALWAYS AS (to_tsvector('english', {BODY})) STORED",
    "CREATE INDEX memory_item_search_vector ON memory_memoryitem USING gin (search_vector)",
    "DROP INDEX IF EXISTS memory_item_text_tsv",
]
BACKWARD = [
    f"CREATE INDEX IF NOT EXISTS memory_item_text_tsv ON memory_memoryitem USING gin (to_tsvector('english', {BODY}))",
    "DROP INDEX IF EXISTS memory_item_search_vector",
    "ALTER TABLE memory_memoryitem DROP COLUMN IF EXISTS search_vector",
]


def _run(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for sql in statements:
                schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0007_keyfact_operations"),
    ]

    operations = [migrations.RunPython(_run(FORWARD), _run(BACKWARD))]
