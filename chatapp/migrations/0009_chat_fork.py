"""Edited copies of a chat (docs/memory.md §8, "Edit into a new chat"): the chat a fork came from and the message
where the two diverge. Nullable columns: SQLite adds them without rebuilding the table."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("chatapp", "0008_reply_versions")]

    operations = [
        migrations.AddField(
            model_name="chatsession",
            name="forked_at_message_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="chatsession",
            name="forked_from",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="forks",
                to="chatapp.chatsession",
            ),
        ),
    ]
