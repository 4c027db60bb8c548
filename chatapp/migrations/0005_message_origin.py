"""``Message.origin``: who wrote a row, the model (``model``) or the app in the model's place
(``app``), so app-written notes are shown but never sent to the model (docs/memory.md F-37).

Existing rows are backfilled where it can be told: every ``error`` reply was written by the app
(error notes, "too large" refusals, interrupted turns, the step limit), and so was a ``stopped``
reply holding only the placeholder stored when the user stopped before any text arrived.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models
from django.db.models import Q

# The placeholder of a reply stopped before any text (chatapp.conversation.turn, until F-37).
STOPPED_PLACEHOLDER = "[stopped by the user]"


def backfill(apps: Any, schema_editor: Any) -> None:
    message = apps.get_model("chatapp", "Message")
    message.objects.filter(
        Q(status="error") | Q(status="stopped", content=STOPPED_PLACEHOLDER), role="assistant"
    ).update(origin="app")


class Migration(migrations.Migration):
    dependencies = [
        ("chatapp", "0004_turnlease_prune"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="origin",
            field=models.CharField(choices=[("model", "Model"), ("app", "App")], default="model", max_length=8),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop, elidable=True),
    ]
