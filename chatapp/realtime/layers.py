"""The embedded default's channel layer: Channels' in-memory one, sweeping expired entries once a
:data:`SWEEP_INTERVAL_SECONDS` (so they may expire that late) and sending group messages without a task each."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

SWEEP_INTERVAL_SECONDS = 1.0


class SweepingInMemoryChannelLayer(InMemoryChannelLayer):
    """:class:`channels.layers.InMemoryChannelLayer` with the sweep above; configured like it."""

    _last_sweep = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < SWEEP_INTERVAL_SECONDS:
            return
        self._last_sweep = now
        super()._clean_expired()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        for channel in list(self.groups.get(group, {})):
            with contextlib.suppress(ChannelFull):  # like Channels' layer: a full channel misses it
                await self.send(channel, message)

    async def flush(self) -> None:
        await super().flush()
        self._last_sweep = 0.0
