"""The embedded default's channel layer: Channels' in-memory layer without its per-message sweep.

``channels.layers.InMemoryChannelLayer`` looks through every channel's queue and every group's
members for expired entries on each ``receive`` and each ``group_send``: with 200 open sockets
that sweep was 10-15% of a worker's CPU under load (``bench/ws_load.py``). This layer sweeps at
most once every :data:`SWEEP_INTERVAL_SECONDS`, so messages and group memberships expire up to
that much later than their ``expiry`` / ``group_expiry`` (60 s and a day by default), and sends a
group message to its members one after another instead of through one task each. Everything
else, including the copy of each message per receiver, is Channels' own.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

# Seconds between two sweeps for expired messages and group memberships.
SWEEP_INTERVAL_SECONDS = 1.0


class SweepingInMemoryChannelLayer(InMemoryChannelLayer):
    """:class:`channels.layers.InMemoryChannelLayer` sweeping expired entries at most once every
    :data:`SWEEP_INTERVAL_SECONDS` (see the module docstring); configured like it."""

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
