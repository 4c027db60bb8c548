"""Start-up validation of the environment (chatapp/settings.py): every bad value stops start-up
with ``ImproperlyConfigured`` naming the variable, and messages state the bounds that exist."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

SETTINGS_FILE = Path(__file__).resolve().parents[2] / "chatapp" / "settings.py"
CONFIG_VARIABLES = ("REDIS_URL", "LLM_BASE_URL", "SUMMARY_BASE_URL", "FAILOVER_BASE_URL", "LLM_CONTEXT_WINDOW")


def settings_load(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict[str, Any]:
    """The settings module run afresh with ``env`` (the live ``django.conf.settings`` is untouched)."""
    for name in CONFIG_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS_FILE))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LLM_CONTEXT_WINDOW": "-5"}, "LLM_CONTEXT_WINDOW must be at least 256, got -5"),
        ({"LLM_TIMEOUT": "0"}, "LLM_TIMEOUT must be at least 1.0, got 0.0"),
        ({"SUMMARY_TEMPERATURE": "3"}, "SUMMARY_TEMPERATURE must be between 0.0 and 2.0, got 3.0"),
    ],
)
def test_out_of_range_numbers_state_only_the_bounds_that_exist(monkeypatch, env, message):
    with pytest.raises(ImproperlyConfigured) as caught:
        settings_load(monkeypatch, **env)

    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REDIS_URL", "notaurl"),
        ("REDIS_URL", "http://127.0.0.1:6379"),
        ("REDIS_URL", "redis://127.0.0.1:notaport/0"),
        ("LLM_BASE_URL", "notaurl"),
        ("LLM_BASE_URL", "redis://127.0.0.1:6379"),
        ("SUMMARY_BASE_URL", "notaurl"),
        ("FAILOVER_BASE_URL", "https://"),
    ],
)
def test_urls_that_cannot_work_stop_start_up_naming_the_variable(monkeypatch, name, value):
    with pytest.raises(ImproperlyConfigured) as caught:
        settings_load(monkeypatch, **{name: value})

    assert str(caught.value).startswith(f"{name} must be a URL starting with ")
    assert repr(value) in str(caught.value)


def test_a_url_error_does_not_repeat_the_password(monkeypatch):
    with pytest.raises(ImproperlyConfigured) as caught:
        settings_load(monkeypatch, REDIS_URL="redis://:hunter2@")

    assert "hunter2" not in str(caught.value) and "REDIS_URL" in str(caught.value)


def test_valid_urls_configure_the_channel_layer_and_endpoints(monkeypatch):
    loaded = settings_load(
        monkeypatch,
        REDIS_URL="rediss://:secret@redis.example:6380/0",
        LLM_BASE_URL="http://127.0.0.1:11434/v1",
        FAILOVER_BASE_URL="https://api.example.com/v1",
    )

    layer = loaded["CHANNEL_LAYERS"]["default"]
    assert layer["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    assert layer["CONFIG"] == {"hosts": ["rediss://:secret@redis.example:6380/0"], "capacity": 1000}
    assert loaded["LLM_CHAT_BASE_URL"] == loaded["LLM_SUMMARY_BASE_URL"] == "http://127.0.0.1:11434/v1"
    assert loaded["LLM_FAILOVER_BASE_URL"] == "https://api.example.com/v1"
    assert settings_load(monkeypatch, REDIS_URL="unix:///run/redis.sock")["CHANNEL_LAYERS"]["default"]["CONFIG"][
        "hosts"
    ]


def test_the_embedded_default_needs_no_variables_and_has_a_roomy_channel_layer(monkeypatch):
    loaded = settings_load(monkeypatch)

    assert loaded["CHANNEL_LAYERS"] == {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 1000}}
    }
    assert loaded["LLM_CHAT_BASE_URL"] == ""
