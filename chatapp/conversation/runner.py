"""Running chat turns (docs/memory.md §2): :func:`chat_turn_start` runs one in the background after the session's
earlier turns in this process (F-26); a turn outlives its socket (F-27) and is stopped on any worker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from chatapp.chats import selectors
from chatapp.chats.memory import memory_engine, session_scope_key
from chatapp.conversation import leases, stopping
from chatapp.conversation.agent import agent_turn_run
from chatapp.conversation.leases import turn_lease_kept
from chatapp.conversation.quick_answer import quick_answer_run
from chatapp.conversation.turn import Turn
from chatapp.models import ChatSession, Message
from chatapp.orm_threads import orm_async
from chatapp.realtime.protocol import INTERNAL_ERROR, ChatTurnEvent
from memory.api import MemoryEngine

logger = logging.getLogger(__name__)

INTERNAL_ERROR_TEXT = "[The assistant failed with an internal error. Your message is kept; please try again.]"


# This process's turns by their user message id; their tasks are held so the loop cannot garbage-collect them.
_running: dict[int, Turn] = {}
_tasks: set[asyncio.Task[Message]] = set()
_session_queues: dict[int, _SessionQueue] = {}


class _SessionQueue:
    """One session's turns here, first come first served; ``stops`` counts ``chat.stop`` so waiting turns see it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.stops = 0


async def chat_turn_run(
    *,
    session_id: int,
    user_message_id: int,
    stopped: Callable[[], bool] | None = None,
    question: str | None = None,
    version: int = 1,
) -> Message:
    """Answer the stored user message in the session's mode; returns the final reply (complete, stopped or error),
    stored as ``version`` of the turn's reply. ``stopped()`` true ends it before any model call. Raises
    :class:`ChatSessionDeleted` (F-41), or when even the error reply cannot be stored."""
    async with (
        turn_lease_kept(user_message_id=user_message_id),
        stopping.turn_stop_listening(session_id=session_id, on_stop=_stop_here),
    ):
        # Never close this process's own turns: a new one may not have its lease stored yet.
        engine = memory_engine()
        try:
            session, in_flight_first_id, token_factor, question = await orm_async(_turn_open)(
                session_id=session_id,
                user_message_id=user_message_id,
                exclude=leases.turns_leased_here(),
                question=question,
                engine=engine,
            )
        except ChatSession.DoesNotExist:
            raise _deleted(session_id, user_message_id) from None
        engine.use_token_factor(token_factor)
        turn = Turn(
            session_id=session_id,
            user_message_id=user_message_id,
            mode=session.mode,
            engine=engine,
            in_flight_first_id=in_flight_first_id,
            question=question or "",
            scope_key=session_scope_key(session),
            version=version,
        )
        _running[user_message_id] = turn
        if stopped is not None and stopped():
            turn.stop()
        else:  # the question's embedding runs while the turn announces itself and loads its context
            turn.recall.prefetch()
        try:
            await turn.emit(ChatTurnEvent(turn_id=user_message_id, status="started", mode=session.mode))
            if turn.stop_requested():  # stopped while it waited: no search, no context, no model call
                return await turn.stopped("", step=0)
            if session.mode == ChatSession.Mode.AGENT:
                reply = await agent_turn_run(turn)
            else:
                reply = await quick_answer_run(turn)
            # Urgent or batched: docs/memory.md §10 "when the job runs".
            engine.schedule(turn.memory_key, idle=not turn.precompression_may_help(reply))
            return reply
        except Exception:
            # A write of a deleted session's turn fails (a foreign key, a row gone): not a bug.
            if not await orm_async(selectors.chat_session_exists)(session_id=session_id):
                raise _deleted(session_id, user_message_id) from None
            logger.exception("chat turn %s of session %s failed", user_message_id, session_id)
            try:
                return await turn.finish(
                    content=INTERNAL_ERROR_TEXT,
                    status=Message.Status.ERROR,
                    step=0,
                    error=(INTERNAL_ERROR, INTERNAL_ERROR_TEXT),
                )
            except Exception:
                if not await orm_async(selectors.chat_session_exists)(session_id=session_id):
                    raise _deleted(session_id, user_message_id) from None
                raise
        finally:
            _running.pop(user_message_id, None)


def _turn_open(
    *, session_id: int, user_message_id: int, exclude: frozenset[int], engine: MemoryEngine, question: str | None = None
) -> tuple[ChatSession, int | None, float, str | None]:
    """What a turn needs as it opens, in one trip to the database thread. Raises ``ChatSession.DoesNotExist``."""
    first = leases.turns_interrupted_close_first_in_flight(session_id=session_id, exclude=exclude)
    session = selectors.chat_session_get(session_id=session_id)
    if question is None:
        try:
            question = selectors.message_content_get(message_id=user_message_id)
        except Message.DoesNotExist:
            question = None
    return session, first, engine.token_factor(), question


class ChatSessionDeleted(Exception):
    """The turn's session was deleted: no reply, nothing left behind (docs/memory.md F-41)."""

    def __init__(self, session_id: int, user_message_id: int) -> None:
        super().__init__(f"chat session {session_id} was deleted during turn {user_message_id}")
        self.session_id = session_id
        self.user_message_id = user_message_id


def _deleted(session_id: int, user_message_id: int) -> ChatSessionDeleted:
    logger.info("chat turn %s ended: its session %s was deleted", user_message_id, session_id)
    return ChatSessionDeleted(session_id, user_message_id)


def chat_turn_start(
    *,
    session_id: int,
    user_message_id: int,
    lease_fresh: bool = False,
    question: str | None = None,
    version: int = 1,
) -> asyncio.Task[Message]:
    """:func:`chat_turn_run` as a task queued behind the session's earlier turns here, keeping its lease meanwhile
    (``lease_fresh``: just stored); counts as this process's from the call on."""
    leases.turn_lease_claim(user_message_id=user_message_id)
    task = asyncio.create_task(
        _chat_turn_queued(
            session_id=session_id,
            user_message_id=user_message_id,
            lease_fresh=lease_fresh,
            question=question,
            version=version,
        )
    )
    _tasks.add(task)
    task.add_done_callback(_task_done)
    # Also when the task is cancelled before it ever ran (its ``finally`` would not run).
    task.add_done_callback(lambda _: leases.turn_lease_unclaim(user_message_id=user_message_id))
    return task


async def _chat_turn_queued(
    *, session_id: int, user_message_id: int, lease_fresh: bool = False, question: str | None = None, version: int = 1
) -> Message:
    queue = _session_queues.setdefault(session_id, _SessionQueue())
    queue.waiting += 1
    stops = queue.stops
    try:
        async with turn_lease_kept(user_message_id=user_message_id, fresh=lease_fresh), queue.lock:
            return await chat_turn_run(
                session_id=session_id,
                user_message_id=user_message_id,
                stopped=lambda: queue.stops != stops,
                question=question,
                version=version,
            )
    finally:
        queue.waiting -= 1
        if not queue.waiting:
            _session_queues.pop(session_id, None)


def _task_done(task: asyncio.Task[Message]) -> None:
    _tasks.discard(task)
    if task.cancelled() or isinstance(task.exception(), ChatSessionDeleted):  # the latter logged at INFO
        return
    if task.exception() is not None:
        logger.error("chat turn task failed", exc_info=task.exception())


def chat_turn_stop(*, session_id: int) -> int:
    """Stop the session's turns running or queued in this process; returns how many were running."""
    queue = _session_queues.get(session_id)
    if queue is not None:
        queue.stops += 1
    turns = [turn for turn in _running.values() if turn.session_id == session_id]
    for turn in turns:
        turn.stop()
    return len(turns)


def _stop_here(session_id: int) -> None:
    chat_turn_stop(session_id=session_id)


async def chat_turn_stop_everywhere(*, session_id: int) -> int:
    """Stop the session's turns here and on every other worker (:mod:`.stopping`); returns how many ran here."""
    stopped = chat_turn_stop(session_id=session_id)
    try:
        await stopping.turn_stop_broadcast(session_id=session_id)
    except Exception:
        logger.exception("could not send the stop of chat session %s to the other workers", session_id)
    return stopped


async def chat_turns_wait() -> None:
    """Wait until every background turn of this process has ended (tests, shutdown); bound it with a timeout."""
    if _tasks:
        await asyncio.wait(set(_tasks))
