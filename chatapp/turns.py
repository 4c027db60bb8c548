"""Running chat turns (SPEC.md section 2): :func:`chat_turn_run` is one turn end to end;
:func:`chat_turn_start` runs it in the background of this process.

A turn outlives the socket that asked for it: a tab that reconnects mid-reply gets the rest of the
stream through the session's channel-layer group and the complete stored reply at the end (FAULTS
F-27). Turns are tracked per process so that ``chat.stop`` can end them. The events a turn sends
are listed in :mod:`chatapp.turn`.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async

from chatapp import selectors
from chatapp.agent import agent_turn_run
from chatapp.models import ChatSession, Message
from chatapp.quick_answer import quick_answer_run
from chatapp.turn import Turn

logger = logging.getLogger(__name__)

INTERNAL_ERROR_TEXT = "[The assistant failed with an internal error. Your message is kept; please try again.]"

# Turns running in this process, by the id of the user message that opened them, and their tasks
# (held here so the event loop cannot garbage-collect a running turn).
_running: dict[int, Turn] = {}
_tasks: set[asyncio.Task[Message]] = set()


async def chat_turn_run(*, session_id: int, user_message_id: int) -> Message:
    """Answer the stored user message ``user_message_id`` of session ``session_id``.

    Runs the session's mode (``agent``: :func:`chatapp.agent.agent_turn_run`; ``quick-answer``:
    :func:`chatapp.quick_answer.quick_answer_run`), streaming events to the session's sockets and
    storing every assistant message, tool-call message and tool result as its own row. Always
    ends with a stored final assistant message, which it returns: status ``complete``,
    ``stopped`` (``chat.stop``) or ``error`` (the chat model failed with ``LLMError``, the request
    overflowed the context window, the agent hit its step limit, or a bug raised; the latter is
    logged); what was stored before a failure stays. Concurrent turns of one session are
    independent (FAULTS F-26). Raises only when even the error reply cannot be stored (database
    down) and for cancellation of the calling task.
    """
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
    """Run :func:`chat_turn_run` as a background task of the running event loop; returns the task."""
    task = asyncio.create_task(chat_turn_run(session_id=session_id, user_message_id=user_message_id))
    _tasks.add(task)
    task.add_done_callback(_task_done)
    return task


def _task_done(task: asyncio.Task[Message]) -> None:
    _tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("chat turn task failed", exc_info=task.exception())


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
