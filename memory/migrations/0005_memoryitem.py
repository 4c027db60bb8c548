"""The recall index (docs/memory.md §12): :class:`memory.models.MemoryItem` and its full-text search.

SQLite: a contentless FTS5 table (rowid = item id; it stores only the index, the text stays in
``memory_memoryitem``) kept in step by triggers, so cascades and flushes that bypass the services
cannot leave it stale; filling an embedding does not touch it. PostgreSQL: a GIN index on the same
``to_tsvector('english', …)`` expression that :func:`memory.services.recall_candidates` queries.
Both read ``search_text`` when it is set (CJK characters spaced out, :mod:`memory.fulltext`), else
``text``. Other databases get no full-text search (recall is then dense-only).
"""

from django.db import migrations, models

BODY = "CASE WHEN {row}search_text = '' THEN {row}text ELSE {row}search_text END"
FTS_INSERT = "INSERT INTO memory_memoryitem_fts(rowid, body) VALUES (new.id, " + BODY.format(row="new.") + "); "
FTS_DELETE = (
    "INSERT INTO memory_memoryitem_fts(memory_memoryitem_fts, rowid, body) VALUES ('delete', old.id, "
    + BODY.format(row="old.")
    + "); "
)
SQLITE_FORWARD = [
    "CREATE VIRTUAL TABLE memory_memoryitem_fts USING fts5(body, content = '', "
    "tokenize = 'porter unicode61 remove_diacritics 2')",
    f"CREATE TRIGGER memory_memoryitem_fts_insert AFTER INSERT ON memory_memoryitem BEGIN {FTS_INSERT}END",
    f"CREATE TRIGGER memory_memoryitem_fts_delete AFTER DELETE ON memory_memoryitem BEGIN {FTS_DELETE}END",
    "CREATE TRIGGER memory_memoryitem_fts_update AFTER UPDATE OF text, search_text ON memory_memoryitem "
    f"BEGIN {FTS_DELETE}{FTS_INSERT}END",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS memory_memoryitem_fts_update",
    "DROP TRIGGER IF EXISTS memory_memoryitem_fts_delete",
    "DROP TRIGGER IF EXISTS memory_memoryitem_fts_insert",
    "DROP TABLE IF EXISTS memory_memoryitem_fts",
]
POSTGRESQL_FORWARD = [
    "CREATE INDEX memory_item_text_tsv ON memory_memoryitem USING gin "
    "(to_tsvector('english', " + BODY.format(row="") + "))",
]
POSTGRESQL_BACKWARD = ["DROP INDEX IF EXISTS memory_item_text_tsv"]


def _run(statements):
    def run(apps, schema_editor):
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ('memory', '0004_keyfact'),
    ]

    operations = [
        migrations.CreateModel(
            name='MemoryItem',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('scope_key', models.CharField(max_length=128)),
                ('memory_key', models.CharField(max_length=64)),
                ('message_ids', models.JSONField(default=list)),
                ('last_message_id', models.BigIntegerField()),
                ('piece', models.PositiveSmallIntegerField(default=0)),
                ('role', models.CharField(max_length=16)),
                ('text', models.TextField()),
                ('search_text', models.TextField(blank=True, default='')),
                ('token_count', models.PositiveIntegerField(default=0)),
                ('created_at', models.DateTimeField()),
                ('embedding', models.BinaryField(blank=True, null=True)),
                ('embedding_model', models.CharField(blank=True, default='', max_length=128)),
                ('embedding_dim', models.PositiveIntegerField(default=0)),
            ],
            options={
                'ordering': ('id',),
                'indexes': [models.Index(fields=['scope_key', 'id'], name='memory_item_scope_idx')],
                'constraints': [models.UniqueConstraint(fields=('memory_key', 'last_message_id', 'piece'), name='memory_memoryitem_one_per_piece')],
            },
        ),
        migrations.RunPython(
            _run({"sqlite": SQLITE_FORWARD, "postgresql": POSTGRESQL_FORWARD}),
            _run({"sqlite": SQLITE_BACKWARD, "postgresql": POSTGRESQL_BACKWARD}),
        ),
    ]
