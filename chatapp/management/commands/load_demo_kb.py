"""``manage.py load_demo_kb``: load the demo knowledge base (``chatapp/demo_kb``); idempotent."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from chatapp.kb.documents import DEMO_KB_DIR, document_load_directory


class Command(BaseCommand):
    help = "Load (or update) the demo knowledge base documents; unchanged documents are left alone."

    def handle(self, *args: Any, **options: Any) -> None:
        counts = document_load_directory(DEMO_KB_DIR, slug_prefix="demo-")
        self.stdout.write(
            f"demo knowledge base: {counts['changed']} loaded or updated, {counts['unchanged']} unchanged"
        )
