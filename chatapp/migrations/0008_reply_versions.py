"""Regenerated replies (docs/memory.md §8, "Regenerate"): ``Message.version`` and the earlier versions' rows kept as
``ReplyVersion``. SQLite adds the column by rebuilding the message table, which drops its full-text triggers
(migration 0006): they are created again, and the index, whose row ids the rebuild keeps, stays as it was."""

from __future__ import annotations

import importlib
from typing import Any

import django.db.models.deletion
from django.db import migrations, models

fulltext = importlib.import_module("chatapp.migrations.0006_message_fulltext")
SQLITE_TRIGGERS = [statement for statement in fulltext.SQLITE_FORWARD if statement.startswith("CREATE TRIGGER")]


def triggers_restore(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "sqlite":
        return
    for statement in fulltext.SQLITE_BACKWARD[:3]:  # the triggers, should any have survived
        schema_editor.execute(statement)
    for statement in SQLITE_TRIGGERS:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("chatapp", "0007_message_status_cut_off")]

    operations = [
        # Undone last: removing the column rebuilds the table again.
        migrations.RunPython(migrations.RunPython.noop, triggers_restore),
        migrations.AddField(
            model_name="message",
            name="version",
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.RunPython(triggers_restore, migrations.RunPython.noop),
        migrations.CreateModel(
            name="ReplyVersion",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("number", models.PositiveSmallIntegerField()),
                ("messages", models.JSONField()),
                ("created", models.DateTimeField(auto_now_add=True)),
                (
                    "turn",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="reply_versions",
                        to="chatapp.message",
                    ),
                ),
            ],
            options={
                "ordering": ["turn", "number"],
                "constraints": [models.UniqueConstraint(fields=("turn", "number"), name="reply_version_unique_per_turn")],
            },
        ),
    ]
