"""docs/protocol.md is generated from chatapp/realtime/protocol.py and cannot drift from it."""

from __future__ import annotations

import dataclasses

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from chatapp.realtime import protocol
from chatapp.realtime.protocol_docs import DOCS_PATH, protocol_markdown


def test_docs_protocol_md_is_the_generated_reference():
    assert DOCS_PATH.read_text(encoding="utf-8") == protocol_markdown(), (
        "docs/protocol.md is stale: run `python manage.py protocol_docs`"
    )


def test_the_reference_names_every_event_field_and_code():
    text = protocol_markdown()
    classes: list[type[protocol.ClientEventBase] | type[protocol.ServerEvent]] = [
        *protocol.CLIENT_EVENTS,
        *protocol.SERVER_EVENTS,
    ]
    for cls in classes:
        assert f"### `{cls.type}`" in text
        for item in dataclasses.fields(cls):
            assert f"| `{item.name}` |" in text
    for code in protocol.ERROR_CODES:
        assert f"| `{code}` |" in text
    assert "| 4404 |" in text


def test_the_command_writes_the_file_and_checks_it(tmp_path):
    target = tmp_path / "protocol.md"
    call_command("protocol_docs", path=target)
    assert target.read_text(encoding="utf-8") == protocol_markdown()
    call_command("protocol_docs", path=target, check=True)  # up to date: no error
    target.write_text("stale", encoding="utf-8")
    with pytest.raises(CommandError, match="stale"):
        call_command("protocol_docs", path=target, check=True)
