"""Start-up validation of the environment (chatapp/settings.py): every bad value stops start-up
with ``ImproperlyConfigured`` naming the variable, and messages state the bounds that exist."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

SETTINGS_FILE = Path(__file__).resolve().parents[2] / "chatapp" / "settings.py"
CONFIG_VARIABLES = (
    "REDIS_URL",
    "LLM_BASE_URL",
    "LLM_MAX_CONCURRENCY",
    "SUMMARY_BASE_URL",
    "FAILOVER_BASE_URL",
    "LLM_CONTEXT_WINDOW",
    "DATABASE_URL",
    "DATABASE_TEST_NAME",
    "DB_CONN_MAX_AGE",
    "DB_THREADS",
    "REDIS_SOCKET_TIMEOUT",
    "REDIS_MAX_CONNECTIONS",
    "CHANNEL_LAYER_PREFIX",
    "CHANNEL_GROUP_EXPIRY",
    "KB_EDITORS",
    "MEMORY_JOB_QUEUE",
    "DJANGO_HTTPS",
    "RATE_LIMIT_SEND_OWNER",
    "RATE_LIMIT_SEND_ADDRESS",
    "RATE_LIMIT_UPLOAD_OWNER",
    "RATE_LIMIT_UPLOAD_ADDRESS",
    "REDIS_CHANNEL_LAYER",
    "SQLITE_JOURNAL_MODE",
)


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
    assert layer["CONFIG"] == {
        "hosts": [
            {
                "address": "rediss://:secret@redis.example:6380/0",
                # Longer than channels_redis's 5-second blocking receive (redis-py 8 defaults to 5).
                "socket_timeout": 30.0,
                "socket_connect_timeout": 10.0,
                "socket_keepalive": True,
                "max_connections": 1000,
            }
        ],
        "capacity": 1000,
        # Every socket of a worker shares one Redis key: its capacity is the worker's backlog.
        "channel_capacity": {"specific.*": 100_000},
        # A dead worker's sockets leave their groups within half an hour, not Channels' default day.
        "group_expiry": 1800,
        "prefix": "asgi",
    }
    assert loaded["LLM_CHAT_BASE_URL"] == loaded["LLM_SUMMARY_BASE_URL"] == "http://127.0.0.1:11434/v1"
    assert loaded["LLM_FAILOVER_BASE_URL"] == "https://api.example.com/v1"
    assert settings_load(monkeypatch, REDIS_URL="unix:///run/redis.sock")["CHANNEL_LAYERS"]["default"]["CONFIG"][
        "hosts"
    ]


def test_the_embedded_default_needs_no_variables_and_has_a_roomy_channel_layer(monkeypatch):
    loaded = settings_load(monkeypatch)

    assert loaded["CHANNEL_LAYERS"] == {
        "default": {
            "BACKEND": "chatapp.realtime.layers.SweepingInMemoryChannelLayer",
            "CONFIG": {"capacity": 1000, "group_expiry": 1800},
        }
    }
    assert loaded["LLM_CHAT_BASE_URL"] == ""


def test_several_redis_urls_shard_the_channel_layer_and_each_is_checked(monkeypatch):
    layer = settings_load(monkeypatch, REDIS_URL="redis://10.0.0.1:6379/0, redis://10.0.0.2:6379/0")["CHANNEL_LAYERS"]
    hosts = layer["default"]["CONFIG"]["hosts"]

    assert [host["address"] for host in hosts] == ["redis://10.0.0.1:6379/0", "redis://10.0.0.2:6379/0"]
    assert all(host["max_connections"] == 1000 for host in hosts)
    with pytest.raises(ImproperlyConfigured) as caught:
        settings_load(monkeypatch, REDIS_URL="redis://10.0.0.1:6379/0,http://10.0.0.2")
    assert "'http://10.0.0.2'" in str(caught.value)


def test_redis_publish_subscribe_is_a_choice_with_the_same_connection_settings(monkeypatch):
    layer = settings_load(monkeypatch, REDIS_URL="redis://127.0.0.1:6379/0", REDIS_CHANNEL_LAYER="pubsub")[
        "CHANNEL_LAYERS"
    ]["default"]

    assert layer["BACKEND"] == "channels_redis.pubsub.RedisPubSubChannelLayer"
    assert layer["CONFIG"]["hosts"][0]["socket_timeout"] == 30.0 and layer["CONFIG"]["prefix"] == "asgi"


def test_the_embedded_sqlite_file_is_written_ahead_unless_asked_otherwise(monkeypatch):
    wal = settings_load(monkeypatch)["DATABASES"]["default"]["OPTIONS"]
    delete = settings_load(monkeypatch, SQLITE_JOURNAL_MODE="delete")["DATABASES"]["default"]["OPTIONS"]

    assert wal["init_command"] == "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"
    assert delete["init_command"] == "" and delete["transaction_mode"] == "IMMEDIATE"


def test_database_connections_are_kept_and_checked_before_reuse(monkeypatch):
    sqlite = settings_load(monkeypatch)["DATABASES"]["default"]
    postgres = settings_load(
        monkeypatch, DATABASE_URL="postgres://chat@127.0.0.1:5432/chat", DB_CONN_MAX_AGE="15", DATABASE_TEST_NAME="t2"
    )["DATABASES"]["default"]

    assert (sqlite["CONN_MAX_AGE"], sqlite["CONN_HEALTH_CHECKS"]) == (60, True)
    assert (postgres["CONN_MAX_AGE"], postgres["CONN_HEALTH_CHECKS"], postgres["TEST"]["NAME"]) == (15, True, "t2")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DB_CONN_MAX_AGE": "-1"}, "DB_CONN_MAX_AGE must be between 0 and 3600, got -1"),
        ({"DB_CONN_MAX_AGE": "soon"}, "DB_CONN_MAX_AGE must be an integer, got 'soon'"),
        ({"DB_THREADS": "0"}, "DB_THREADS must be between 1 and 64, got 0"),
        # A socket timeout at or under the layer's 5-second blocking receive closes idle sockets.
        ({"REDIS_SOCKET_TIMEOUT": "5"}, "REDIS_SOCKET_TIMEOUT must be between 10.0 and 3600.0, got 5.0"),
        ({"REDIS_MAX_CONNECTIONS": "5"}, "REDIS_MAX_CONNECTIONS must be between 10 and 100000, got 5"),
        ({"CHANNEL_LAYER_PREFIX": "a b"}, "CHANNEL_LAYER_PREFIX must be 1-64 letters, digits or _ . : -, got 'a b'"),
        ({"REDIS_CHANNEL_LAYER": "streams"}, "REDIS_CHANNEL_LAYER must be one of lists, pubsub, got 'streams'"),
        ({"SQLITE_JOURNAL_MODE": "memory"}, "SQLITE_JOURNAL_MODE must be one of wal, delete, got 'memory'"),
    ],
)
def test_connection_settings_are_parsed_strictly(monkeypatch, env, message):
    with pytest.raises(ImproperlyConfigured) as caught:
        settings_load(monkeypatch, **env)

    assert str(caught.value) == message


def test_the_knowledge_base_is_open_on_the_embedded_default_and_staff_only_in_the_production_shape(monkeypatch):
    assert settings_load(monkeypatch)["KB_EDITORS"] == "anyone"
    assert settings_load(monkeypatch, DATABASE_URL="postgres://u@db.example:5432/chat")["KB_EDITORS"] == "staff"
    production = settings_load(monkeypatch, DATABASE_URL="postgres://u@db.example:5432/chat", KB_EDITORS="anyone")
    assert production["KB_EDITORS"] == "anyone"  # a single-user install may keep it open


@pytest.mark.parametrize("value", ["30", "30/0", "many/60", "-1/60"])
def test_a_rate_limit_is_count_per_seconds_or_off(monkeypatch, value):
    loaded = settings_load(monkeypatch, RATE_LIMIT_SEND_OWNER="5/10", RATE_LIMIT_UPLOAD_ADDRESS="off")
    assert loaded["RATE_LIMITS"]["send"]["owner"] == {"count": 5, "seconds": 10}
    assert loaded["RATE_LIMITS"]["upload"]["address"] is None
    assert settings_load(monkeypatch)["RATE_LIMITS"]["send"] == {
        "owner": {"count": 30, "seconds": 60},
        "address": {"count": 120, "seconds": 60},
    }
    with pytest.raises(ImproperlyConfigured) as caught:
        settings_load(monkeypatch, RATE_LIMIT_SEND_ADDRESS=value)
    assert str(caught.value).startswith("RATE_LIMIT_SEND_ADDRESS must be COUNT/SECONDS such as 30/60, or off")


def test_check_deploy_is_clean_under_the_production_settings():
    """The production shape of docs/deploy.md (PostgreSQL, Redis, HTTPS behind a proxy, a real secret): Django's
    deployment checks find nothing (no connection is made)."""
    env = {name: value for name, value in os.environ.items() if name not in CONFIG_VARIABLES}
    env.update(
        DJANGO_SETTINGS_MODULE="chatapp.settings",
        DATABASE_URL="postgres://chat@127.0.0.1:9/chat",
        REDIS_URL="redis://127.0.0.1:9/0",
        DJANGO_HTTPS="true",
        DJANGO_SECRET_KEY="k7#Qz" * 12,
        DJANGO_ALLOWED_HOSTS="chat.example.com",
    )
    root = SETTINGS_FILE.parents[1]
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout


def test_the_durable_job_queue_needs_postgresql_whose_tables_exist_there(monkeypatch):
    with pytest.raises(ImproperlyConfigured) as caught:
        settings_load(monkeypatch, MEMORY_JOB_QUEUE="procrastinate")
    assert str(caught.value).startswith("MEMORY_JOB_QUEUE=procrastinate needs PostgreSQL")
    assert "procrastinate.contrib.django" not in settings_load(monkeypatch)["INSTALLED_APPS"]
    production = settings_load(monkeypatch, DATABASE_URL="postgres://u@db.example:5432/chat")
    assert (
        "procrastinate.contrib.django" in production["INSTALLED_APPS"] and production["MEMORY_JOB_QUEUE"] == "process"
    )
