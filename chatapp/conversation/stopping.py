"""``chat.stop`` reaching a turn on whichever worker runs it.

A turn runs on the worker whose socket sent it, and outlives that socket (docs/memory.md F-27),
so a stop sent later, from another tab or after a reconnect that landed on another worker, must
find it through the channel layer rather than through the session's sockets. Each worker process
(each event loop) opens one process channel (``layer.new_channel()``) with a listener task the
first time it runs a turn. While the worker runs turns of session S, that channel is in the group
:func:`turns_group_name` ``chat.turns.S``; :func:`turn_stop_broadcast` sends ``turn.stop`` to
the group, and each listener stops the session's turns it runs. The stop itself is the runner's
(:func:`chatapp.conversation.runner.chat_turn_stop_everywhere`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from channels.layers import BaseChannelLayer, get_channel_layer

logger = logging.getLogger(__name__)

# The channel-layer message a listener acts on: ``{"type": TURN_STOP_TYPE, "session_id": S}``.
TURN_STOP_TYPE = "turn.stop"
# Seconds a listener waits before receiving again after the layer failed (Redis down).
LISTEN_RETRY_SECONDS = 1.0

StopHandler = Callable[[int], object]


def turns_group_name(session_id: int) -> str:
    """The channel-layer group of the workers running turns of chat session ``session_id``."""
    return f"chat.turns.{session_id}"


class _Listener:
    """This event loop's process channel, its listener task, and how many turns of each session
    it runs (the channel is in the session's group while that count is above zero)."""

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
            # The default prefix: channels_redis receives every process channel of one prefix
            # through a single blocking read, shared with the sockets' channels; a channel of
            # another prefix would hold that read for 5 s at a time and starve the sockets.
            listener = _Listener(layer, await layer.new_channel(), on_stop)
            _listeners[loop] = listener
    return listener


@contextlib.asynccontextmanager
async def turn_stop_listening(*, session_id: int, on_stop: StopHandler) -> AsyncIterator[None]:
    """While the block runs, a ``turn.stop`` for session ``session_id`` sent from any worker
    (:func:`turn_stop_broadcast`) calls ``on_stop(session_id)`` in this process. Joining and
    leaving the group cost one channel-layer call each for the first and last turn of a session
    running here at once; a layer that fails is logged and the turn runs on (only a stop from
    another worker is lost)."""
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
    """Send ``turn.stop`` for session ``session_id`` to every worker running turns of it.
    Raises what the channel layer raises (e.g. Redis unreachable)."""
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
