"""``manage.py protocol_docs [--check]``: write ``docs/protocol.md`` from :mod:`chatapp.realtime.protocol`; with
``--check``, write nothing and fail when the file is stale."""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from chatapp.realtime.protocol_docs import DOCS_PATH, protocol_docs_write, protocol_markdown


class Command(BaseCommand):
    help = "Generate docs/protocol.md from chatapp/realtime/protocol.py."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--path", type=Path, default=DOCS_PATH, help="where to write (default: docs/protocol.md)")
        parser.add_argument("--check", action="store_true", help="only check that the file is up to date")

    def handle(self, *args: object, path: Path, check: bool, **options: object) -> None:
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != protocol_markdown():
                raise CommandError(f"{path} is stale: run `python manage.py protocol_docs`.")
            self.stdout.write(f"{path} is up to date.")
            return
        changed = protocol_docs_write(path)
        self.stdout.write(f"{'Wrote' if changed else 'Unchanged:'} {path}")
