"""``session_key`` becomes ``memory_key`` (it never was Django's session key), and elisions get a
column of their own instead of a dict inside ``notes`` (which now holds sentences only)."""

from django.db import migrations, models


def elisions_out_of_notes(apps, schema_editor):
    CompressionEvent = apps.get_model("memory", "CompressionEvent")
    for event in CompressionEvent.objects.filter(kind="overflow"):
        notes = [note for note in event.notes or [] if isinstance(note, str)]
        elisions = [item for note in event.notes or [] if isinstance(note, dict) for item in note.get("elisions", [])]
        if elisions or len(notes) != len(event.notes or []):
            event.notes, event.elisions = notes, elisions
            event.save(update_fields=["notes", "elisions"])


class Migration(migrations.Migration):
    dependencies = [("memory", "0001_initial")]

    operations = [
        migrations.RenameField("sessionsummary", "session_key", "memory_key"),
        migrations.RemoveIndex("compressionevent", name="memory_comp_session_60f825_idx"),
        migrations.RenameField("compressionevent", "session_key", "memory_key"),
        migrations.AddIndex("compressionevent", models.Index(fields=["memory_key", "id"], name="memory_comp_memory__idx")),
        migrations.AddField("compressionevent", "elisions", models.JSONField(default=list)),
        migrations.RunPython(elisions_out_of_notes, migrations.RunPython.noop),
    ]
