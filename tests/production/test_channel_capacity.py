"""A burst to many sockets of one worker loses nothing on Redis.

channels_redis keeps the messages of every socket of a worker in one Redis key and checks the
layer's capacity on that key, dropping what does not fit without an error. With the per-socket
capacity there (1000), a worker with a hundred busy sockets lost a reply's events under load
(``bench/ws_load.py --production``); the settings give that key its own, larger capacity
(``CHANNEL_WORKER_CAPACITY``). Skipped, with a message, unless the configured layer is
channels_redis's list layer (``REDIS_URL``, ``REDIS_CHANNEL_LAYER=lists``).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

import pytest
from django.conf import settings

SOCKETS = 60
EVENTS = 20  # 1,200 messages in the worker's key: more than one socket's capacity


async def test_a_burst_to_every_socket_of_a_worker_arrives_whole_and_in_order():
    layer_settings = settings.CHANNEL_LAYERS["default"]
    if layer_settings["BACKEND"] != "channels_redis.core.RedisChannelLayer":
        pytest.skip(
            "REDIS_URL is not set (or the layer is publish/subscribe): this test needs channels_redis's list layer"
        )
    from channels_redis.core import RedisChannelLayer

    config: dict[str, Any] = {
        **cast(dict[str, Any], layer_settings["CONFIG"]),
        "prefix": f"test{uuid.uuid4().hex[:12]}",
    }
    layer = RedisChannelLayer(**config)
    assert SOCKETS * EVENTS > settings.CHANNEL_CAPACITY
    try:
        channels = [await layer.new_channel() for _ in range(SOCKETS)]
        for number, channel in enumerate(channels):
            await layer.group_add(f"burst.{number}", channel)
        for event in range(EVENTS):  # nothing is received meanwhile: a busy worker
            for number in range(SOCKETS):
                await layer.group_send(f"burst.{number}", {"type": "session.event", "event": event})

        for channel in channels:
            async with asyncio.timeout(10):
                received = [(await layer.receive(channel))["event"] for _ in range(EVENTS)]
            assert received == list(range(EVENTS))
    finally:
        await layer.flush()
