"""Running chat turns (SPEC.md section 2): :func:`chat_turn_run` is one turn end to end;
:func:`chat_turn_start` runs it in the background of this process. :func:`session_memory_compress`
is the inspector's "compress now", the same memory engine run outside a turn.

A turn outlives the socket that asked for it: a tab that reconnects mid-reply gets the rest of the
stream through the session's channel-layer group and the complete stored reply at the end (FAULTS
F-27). Turns are tracked per process so that ``chat.stop`` can end them. The events a turn sends
are listed in :mod:`chatapp.turn`.

Within one process the started turns of a session run one after another, in the order they
were sent (a burst of sends must not run dozens of turns at once; the consumer also bounds how
many may wait, ``CHAT_MAX_PENDING_TURNS``). Turns of one session on different workers (two tabs
behind a proxy) still run concurrently, which the memory engine allows for (FAULTS F-26).

A turn proves it is alive, to every worker, through its lease (:class:`chatapp.models.TurnLease`):
while it waits for its turn and while it runs, a background task renews the heartbeat every
third of ``CHAT_TURN_LEASE_SECONDS``, whatever the turn is awaiting (a slow model, a long
summarization). A turn whose process died stops renewing; once its lease expires it counts as
interrupted and is closed with an error reply by the next request that looks
(:func:`chatapp.services.turns_interrupted_close`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings

from chatapp import selectors, services
from chatapp.agent import AGENT_PROMPT, agent_turn_run
from chatapp.llm.clients import chat_endpoint
from chatapp.models import ChatSession, Message
from chatapp.quick_answer import QUICK_ANSWER_PROMPT, quick_answer_run
from chatapp.realtime import event_broadcast
from chatapp.tools import TOOL_SCHEMAS
from chatapp.turn import Turn, memory_engine_build

logger = logging.getLogger(__name__)

INTERNAL_ERROR_TEXT = "[The assistant failed with an internal error. Your message is kept; please try again.]"

# Heartbeats per lease period: two may be missed (a slow database write) before a live turn
# would look interrupted.
HEARTBEATS_PER_LEASE = 3

# Turns running in this process, by the id of the user message that opened them, and their tasks
# (held here so the event loop cannot garbage-collect a running turn).
_running: dict[int, Turn] = {}
_tasks: set[asyncio.Task[Message]] = set()
# The turns whose lease this process renews, and the queue of each session's started turns.
_leases_kept: set[int] = set()
_session_queues: dict[int, _SessionQueue] = {}


class _SessionQueue:
    """The started turns of one session in this process: they take ``lock`` (first come, first
    served) to run; ``waiting`` counts holders and waiters so the queue can go when unused."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0


async def chat_turn_run(*, session_id: int, user_message_id: int) -> Message:
    """Answer the stored user message ``user_message_id`` of session ``session_id``.

    Runs the session's mode (``agent``: :func:`chatapp.agent.agent_turn_run`; ``quick-answer``:
    :func:`chatapp.quick_answer.quick_answer_run`), streaming events to the session's sockets and
    storing every assistant message, tool-call message and tool result as its own row. Always
    ends with a stored final assistant message, which it returns: status ``complete``,
    ``stopped`` (``chat.stop``) or ``error`` (the chat model failed with ``LLMError``, the request
    overflowed the context window, the agent hit its step limit, or a bug raised; the latter is
    logged); what was stored before a failure stays. Concurrent turns of one session (on other
    workers, or run directly) are independent (FAULTS F-26). The turn's lease is renewed while
    it runs, and the session's interrupted turns are closed before it starts, so its history has
    no dangling question. Raises only when even the error reply cannot be stored (database
    down) and for cancellation of the calling task.
    """
    async with turn_lease_kept(user_message_id=user_message_id):
        await database_sync_to_async(services.turns_interrupted_close)(session_id=session_id)
        session = await database_sync_to_async(selectors.chat_session_get)(session_id=session_id)
        turn = Turn(session_id=session_id, user_message_id=user_message_id, mode=session.mode)
        _running[user_message_id] = turn
        try:
            await turn.emit("chat.turn", status="started", mode=session.mode)
            if session.mode == ChatSession.Mode.AGENT:
                return await agent_turn_run(turn)
            return await quick_answer_run(turn)
        except Exception:
            logger.exception("chat turn %s of session %s failed", user_message_id, session_id)
            return await turn.finish(
                content=INTERNAL_ERROR_TEXT,
                status=Message.Status.ERROR,
                step=0,
                error=("internal_error", INTERNAL_ERROR_TEXT),
            )
        finally:
            _running.pop(user_message_id, None)


def chat_turn_start(*, session_id: int, user_message_id: int) -> asyncio.Task[Message]:
    """Run :func:`chat_turn_run` as a background task of the running event loop, after the
    session's turns started earlier in this process have ended; returns the task. The turn's
    lease is renewed while it waits."""
    task = asyncio.create_task(_chat_turn_queued(session_id=session_id, user_message_id=user_message_id))
    _tasks.add(task)
    task.add_done_callback(_task_done)
    return task


async def _chat_turn_queued(*, session_id: int, user_message_id: int) -> Message:
    queue = _session_queues.setdefault(session_id, _SessionQueue())
    queue.waiting += 1
    try:
        async with turn_lease_kept(user_message_id=user_message_id), queue.lock:
            return await chat_turn_run(session_id=session_id, user_message_id=user_message_id)
    finally:
        queue.waiting -= 1
        if not queue.waiting:
            _session_queues.pop(session_id, None)


@contextlib.asynccontextmanager
async def turn_lease_kept(*, user_message_id: int) -> AsyncIterator[None]:
    """Keep the lease of the turn opened by ``user_message_id`` fresh for the duration of the
    block: renewed once on entry, then every ``CHAT_TURN_LEASE_SECONDS / HEARTBEATS_PER_LEASE``
    seconds by a background task until the block exits. Re-entrant (an inner block for a lease
    this process already keeps does nothing). A failed renewal is logged and retried on the next
    beat; it never breaks the turn."""
    if user_message_id in _leases_kept:
        yield
        return
    _leases_kept.add(user_message_id)
    try:
        await _lease_renew(user_message_id)
        heartbeat = asyncio.create_task(_heartbeat(user_message_id))
        try:
            yield
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
    finally:
        _leases_kept.discard(user_message_id)


async def _heartbeat(user_message_id: int) -> None:
    while True:
        await asyncio.sleep(settings.CHAT_TURN_LEASE_SECONDS / HEARTBEATS_PER_LEASE)
        await _lease_renew(user_message_id)


async def _lease_renew(user_message_id: int) -> None:
    try:
        await database_sync_to_async(services.turn_lease_renew)(user_message_id=user_message_id)
    except Exception:
        logger.exception("could not renew the lease of chat turn %s", user_message_id)


def _task_done(task: asyncio.Task[Message]) -> None:
    _tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("chat turn task failed", exc_info=task.exception())


def turns_leased_here() -> frozenset[int]:
    """Ids of the turns (their user messages) this process runs or queues and keeps the lease of."""
    return frozenset(_leases_kept)


def chat_turn_stop(*, session_id: int) -> int:
    """Ask every turn of session ``session_id`` running in this process to stop; returns how many."""
    turns = [turn for turn in _running.values() if turn.session_id == session_id]
    for turn in turns:
        turn.stop()
    return len(turns)


async def chat_turns_wait(*, timeout: float) -> None:
    """Wait until every background turn of this process has ended (tests, graceful shutdown).
    Raises ``TimeoutError`` when some are still running after ``timeout`` seconds."""
    if not _tasks:
        return
    _, pending = await asyncio.wait(set(_tasks), timeout=timeout)
    if pending:
        raise TimeoutError(f"{len(pending)} chat turn(s) still running after {timeout} s")


async def session_memory_compress(*, session_id: int) -> list[dict[str, Any]]:
    """"Compress now" (the inspector's one action): fold every message of session ``session_id``
    before its newest user message into the summary, with the live chat endpoint's memory engine
    and the session's mode (its system prompt and, in agent mode, tool schemas); returns the
    compression events recorded (``CompressionEvent.as_dict()``; empty when the session has no
    user message yet).

    Turns still running are never summarized (``summarize_below``, FAULTS F-26); interrupted
    turns are closed first and pin nothing. A failing summarizer degrades to the raw archive
    like in a turn. The session's sockets get one ``memory.compression`` per event and then
    ``memory.summary {summary}`` (both with ``turn_id`` None and ``step`` 0). Raises
    ``ChatSession.DoesNotExist``; database errors propagate. Called from an HTTP view, so its ORM calls go through plain ``sync_to_async``
    (the request owns connection handling).
    """
    session = await sync_to_async(selectors.chat_session_get)(session_id=session_id)
    last_user_id = await sync_to_async(selectors.message_last_user_id)(session_id=session_id)
    if last_user_id is None:
        return []

    async def load_increment(boundary: int | None) -> list[dict[str, Any]]:
        return await sync_to_async(selectors.message_list_for_context)(
            session_id=session_id, boundary=boundary, turn_message_id=last_user_id
        )

    agent = session.mode == ChatSession.Mode.AGENT
    await sync_to_async(services.turns_interrupted_close)(session_id=session_id)
    summarize_below = await sync_to_async(selectors.turn_in_flight_first_id)(session_id=session_id)
    context = await memory_engine_build(chat_endpoint()).build_context(
        session_key=str(session_id),
        system_prompt=AGENT_PROMPT if agent else QUICK_ANSWER_PROMPT,
        load_increment=load_increment,
        mode=session.mode,
        tools=TOOL_SCHEMAS if agent else None,
        summarize_below=summarize_below,
        force=True,
    )
    for event in context.events:
        await event_broadcast(session_id, {"type": "memory.compression", "turn_id": None, "step": 0, "event": event})
    await event_broadcast(session_id, {"type": "memory.summary", "turn_id": None, "step": 0, "summary": context.summary})
    return context.events
