"""How many requests each OpenAI-compatible server gets at once (docs/memory.md §6 "Concurrency"). A single-slot
server (llama.cpp's, by default) cuts off a running stream when another request arrives: chat turns and memory
jobs share one limiter per server (host and port), and a waiting turn goes before any waiting memory job."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import weakref
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from django.conf import settings

from memory.api import in_memory_job


class SlotLimiter:
    """At most ``slots`` requests at once; a free slot goes to a waiting foreground request (a user's turn) before
    any background one (a memory job). Belongs to one event loop."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.busy = 0
        self.foreground_waiting = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def slot(self, *, background: bool) -> AsyncIterator[None]:
        """Hold one slot for the block; waits (cancellably) until one is free and, for ``background``, until no
        foreground request waits."""
        async with self._changed:
            if not background:
                self.foreground_waiting += 1
            try:
                await self._changed.wait_for(
                    lambda: self.busy < self.slots and (not background or not self.foreground_waiting)
                )
            finally:
                if not background:
                    self.foreground_waiting -= 1
                    self._changed.notify_all()
            self.busy += 1
        try:
            yield
        finally:
            async with self._changed:
                self.busy -= 1
                self._changed.notify_all()


def is_local(base_url: str) -> bool:
    """Whether ``base_url`` names this machine, a private address or a bare or ``.local``/``.internal`` host name:
    where a self-hosted server (llama.cpp, Ollama, vLLM) usually runs."""
    host = (urlsplit(base_url).hostname or "").lower()
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or "." not in host or host.endswith((".local", ".internal", ".localhost"))
    return address.is_loopback or address.is_private or address.is_unspecified


_LOOPBACK_NAMES = frozenset({"localhost", "0.0.0.0", "::"})


def server_key(base_url: str) -> str:
    """The server ``base_url`` reaches, as ``host:port``: one key for every spelling of this machine
    (``localhost``, ``127.0.0.1``, ``::1``) and for any path, so the chat and summary URLs of one server
    share its slots."""
    parts = urlsplit(base_url)
    host = (parts.hostname or "").lower()
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback or host in _LOOPBACK_NAMES:
        host = "loopback"
    return f"{host}:{port}"


def max_concurrency(base_url: str) -> int | None:
    """Requests the server at ``base_url`` gets at once, None for no limit: ``LLM_MAX_CONCURRENCY``, or by default
    1 for a local server and no limit elsewhere; the in-process offline engine (empty URL) has none."""
    if not base_url:
        return None
    configured = settings.LLM_MAX_CONCURRENCY
    if configured is None:
        return 1 if is_local(base_url) else None
    return configured or None


# Per event loop: (server_key, slots) -> its limiter.
_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, int], SlotLimiter]] = (
    weakref.WeakKeyDictionary()
)


@contextlib.asynccontextmanager
async def server_slot(base_url: str) -> AsyncIterator[None]:
    """Hold a slot of ``base_url``'s server for the block (a whole stream, or one request); a memory job's
    request (:func:`memory.api.in_memory_job`) lets waiting turns go first. No wait without a limit."""
    slots = max_concurrency(base_url)
    if slots is None:
        yield
        return
    per_loop = _limiters.setdefault(asyncio.get_running_loop(), {})
    limiter = per_loop.setdefault((server_key(base_url), slots), SlotLimiter(slots))
    async with limiter.slot(background=in_memory_job()):
        yield
