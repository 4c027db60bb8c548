"""``LLM_STRICT_ALTERNATION`` (docs/configuration.md; docs/memory.md F-38): parsed at start-up
and handed to the memory engine's budget, so the wire of the live app never has two user or two
assistant messages in a row when it is on."""

from __future__ import annotations

import runpy

import pytest

from chatapp.chats.memory import memory_engine
from tests.chatapp.test_settings import SETTINGS_FILE


@pytest.mark.parametrize(("value", "expected"), [(None, False), ("true", True), ("false", False)])
def test_strict_alternation_is_read_from_the_environment(monkeypatch, value, expected):
    monkeypatch.delenv("LLM_STRICT_ALTERNATION", raising=False)
    if value is not None:
        monkeypatch.setenv("LLM_STRICT_ALTERNATION", value)
    assert runpy.run_path(str(SETTINGS_FILE))["LLM_STRICT_ALTERNATION"] is expected


@pytest.mark.parametrize("strict", [True, False])
def test_the_setting_reaches_the_memory_budget(settings, strict):
    settings.LLM_STRICT_ALTERNATION = strict
    assert memory_engine().budget.strict_alternation is strict
