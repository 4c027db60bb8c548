"""The embedded default's channel layer (chatapp/realtime/layers.py): Channels' in-memory layer
that sweeps for expired entries once a second instead of on every message."""

from __future__ import annotations

import asyncio

import pytest

from chatapp.realtime import layers
from chatapp.realtime.layers import SweepingInMemoryChannelLayer


async def test_a_group_message_reaches_every_member_once_and_a_full_channel_misses_it():
    layer = SweepingInMemoryChannelLayer(capacity=1)
    first, second, full = [await layer.new_channel() for _ in range(3)]
    for channel in (first, second, full):
        await layer.group_add("chat.session.1", channel)
    await layer.send(full, {"type": "earlier"})

    await layer.group_send("chat.session.1", {"type": "session.event", "n": 1})

    assert await layer.receive(first) == {"type": "session.event", "n": 1}
    assert await layer.receive(second) == {"type": "session.event", "n": 1}
    assert await layer.receive(full) == {"type": "earlier"}
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await layer.receive(first)


async def test_expired_messages_still_expire_within_a_sweep(monkeypatch):
    monkeypatch.setattr(layers, "SWEEP_INTERVAL_SECONDS", 0.05)
    layer = SweepingInMemoryChannelLayer(expiry=0)
    stale, fresh = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("chat.session.2", stale)
    await layer.send(stale, {"type": "too.old"})
    await asyncio.sleep(0.1)

    await layer.group_send("chat.session.2", {"type": "session.event"})  # sweeps: the stale channel goes
    await layer.group_add("chat.session.2", fresh)

    assert stale not in layer.channels and stale not in layer.groups.get("chat.session.2", {})
    await layer.flush()
    assert layer.channels == {} and layer.groups == {}
