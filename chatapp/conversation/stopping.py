"""``chat.stop`` reaching a turn on any worker (turns outlive sockets, F-27): each event loop listens on one channel,
in the group ``chat.turns.S`` while it runs turns of session S, where :func:`turn_stop_broadcast` sends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from channels.layers import BaseChannelLayer, get_channel_layer

logger = logging.getLogger(__name__)

TURN_STOP_TYPE = "turn.stop"  # {"type": TURN_STOP_TYPE, "session_id": S}
LISTEN_RETRY_SECONDS = 1.0  # after the layer failed (Redis down)

StopHandler = Callable[[int], object]


def turns_group_name(session_id: int) -> str:
    return f"chat.turns.{session_id}"


class _Listener:
    """This event loop's process channel and listener task; ``sessions``: turns run here per session (the channel
    is in the session's group while above zero)."""

    def __init__(self, layer: BaseChannelLayer, channel: str, on_stop: StopHandler) -> None:
        self.layer = layer
        self.channel = channel
        self.on_stop = on_stop
        self.sessions: dict[int, int] = {}
        self.lock = asyncio.Lock()
        self.task = asyncio.create_task(self._listen(), name=f"turn-stop-listener {channel}")

    async def _listen(self) -> None:
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("the turn-stop listener could not receive; retrying")
                await asyncio.sleep(LISTEN_RETRY_SECONDS)
                continue
            if message.get("type") != TURN_STOP_TYPE:
                continue
            try:
                self.on_stop(int(message["session_id"]))
            except Exception:
                logger.exception("a turn stop failed: %r", message)


_listeners: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Listener] = weakref.WeakKeyDictionary()
_listeners_opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def _listener(on_stop: StopHandler) -> _Listener | None:
    """The running loop's listener, opened on first use; None without a channel layer."""
    layer = get_channel_layer()
    if layer is None:
        return None
    loop = asyncio.get_running_loop()
    listener = _listeners.get(loop)
    if listener is not None and listener.layer is layer and not listener.task.done():
        return listener
    async with _listeners_opening.setdefault(loop, asyncio.Lock()):
        listener = _listeners.get(loop)
        if listener is None or listener.layer is not layer or listener.task.done():
            if listener is not None:
                listener.task.cancel()
            # The default prefix: channels_redis reads all of a prefix's process channels in one blocking read,
            # shared with the sockets; another prefix would hold that read for 5 s at a time and starve them.
            listener = _Listener(layer, await layer.new_channel(), on_stop)
            _listeners[loop] = listener
    return listener


@contextlib.asynccontextmanager
async def turn_stop_listening(*, session_id: int, on_stop: StopHandler) -> AsyncIterator[None]:
    """While the block runs, a ``turn.stop`` for the session from any worker calls ``on_stop(session_id)`` here.
    A failing layer is logged and the turn runs on (only a stop from another worker is lost)."""
    listener = None
    try:
        listener = await _listener(on_stop)
        if listener is not None:
            async with listener.lock:
                listener.sessions[session_id] = listener.sessions.get(session_id, 0) + 1
                if listener.sessions[session_id] == 1:
                    await listener.layer.group_add(turns_group_name(session_id), listener.channel)
    except Exception:
        logger.exception("could not listen for stops of chat session %s", session_id)
    try:
        yield
    finally:
        if listener is not None:
            with contextlib.suppress(Exception):
                async with listener.lock:
                    count = listener.sessions.get(session_id, 0) - 1
                    if count > 0:
                        listener.sessions[session_id] = count
                    else:
                        listener.sessions.pop(session_id, None)
                        await listener.layer.group_discard(turns_group_name(session_id), listener.channel)


async def turn_stop_broadcast(*, session_id: int) -> None:
    """Send ``turn.stop`` to every worker running the session's turns; raises what the channel layer raises."""
    layer = get_channel_layer()
    if layer is not None:
        message: dict[str, Any] = {"type": TURN_STOP_TYPE, "session_id": session_id}
        await layer.group_send(turns_group_name(session_id), message)


async def turn_stop_listener_close() -> None:
    """Stop the running loop's listener (tests, graceful shutdown); a later turn opens a new one."""
    listener = _listeners.pop(asyncio.get_running_loop(), None)
    if listener is not None:
        listener.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener.task
