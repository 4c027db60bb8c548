"""Delete the leases of turns that already have their final reply.

Leases are deleted with a turn's final reply from now on (``chatapp.chats.services.reply_message_store``);
this removes those that earlier versions left behind. A turn still in flight or interrupted keeps
its lease, so what counts as in flight or interrupted does not change.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations
from django.db.models import Exists, OuterRef


def prune(apps: Any, schema_editor: Any) -> None:
    message = apps.get_model("chatapp", "Message")
    lease = apps.get_model("chatapp", "TurnLease")
    final_reply = message.objects.filter(
        reply_to=OuterRef("user_message_id"), role="assistant", tool_calls__isnull=True
    )
    lease.objects.filter(Exists(final_reply)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("chatapp", "0003_turnlease"),
    ]

    operations = [
        migrations.RunPython(prune, migrations.RunPython.noop, elidable=True),
    ]
