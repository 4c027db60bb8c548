"""Running chat turns (docs/memory.md §2): :func:`chat_turn_run` is one turn end to end;
:func:`chat_turn_start` runs it in the background of this process. :func:`session_memory_compress`
is the inspector's "compress now", the same memory engine run outside a turn.

A turn outlives the socket that asked for it: a tab that reconnects mid-reply gets the rest of the
stream through the session's channel-layer group and the complete stored reply at the end (docs/memory.md
F-27). Turns are tracked per process; ``chat.stop`` reaches them on any worker through the
channel layer (:func:`chat_turn_stop_everywhere`, :mod:`chatapp.conversation.stopping`). The
events a turn sends are defined in :mod:`chatapp.realtime.protocol` (docs/protocol.md).

Within one process the started turns of a session run one after another, in the order they
were sent (a burst of sends must not run dozens of turns at once; the consumer also bounds how
many may wait, ``CHAT_MAX_PENDING_TURNS``). Turns of one session on different workers (two tabs
behind a proxy) still run concurrently, which the memory engine allows for (docs/memory.md F-26).

A turn proves it is alive, to every worker, through its lease (:class:`chatapp.models.TurnLease`):
while it waits for its turn and while it runs, a background task renews the heartbeat every
third of ``CHAT_TURN_LEASE_SECONDS``, whatever the turn is awaiting (a slow model, a long
summarization). A turn whose process died stops renewing; once its lease expires it counts as
interrupted and is closed with an error reply by the next request that looks
(:func:`chatapp.chats.leases.turns_interrupted_close`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from chatapp.chats import selectors
from chatapp.chats.memory import chat_session_scope_key, memory_engine
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


# Turns running in this process, by the id of the user message that opened them, and their tasks
# (held here so the event loop cannot garbage-collect a running turn).
_running: dict[int, Turn] = {}
_tasks: set[asyncio.Task[Message]] = set()
_session_queues: dict[int, _SessionQueue] = {}


class _SessionQueue:
    """The started turns of one session in this process: they take ``lock`` (first come, first
    served) to run; ``waiting`` counts holders and waiters so the queue can go when unused;
    ``stops`` counts the ``chat.stop`` requests that reached this process, so a turn that was
    waiting when one came knows it was stopped before it ran."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.stops = 0


async def chat_turn_run(
    *, session_id: int, user_message_id: int, stopped: Callable[[], bool] | None = None, question: str | None = None
) -> Message:
    """Answer the stored user message ``user_message_id`` of session ``session_id``.

    Runs the session's mode (``agent``: :func:`chatapp.conversation.agent.agent_turn_run`; ``quick-answer``:
    :func:`chatapp.conversation.quick_answer.quick_answer_run`), streaming events to the session's sockets and
    storing every assistant message, tool-call message and tool result as its own row. Always
    ends with a stored final assistant message, which it returns: status ``complete``,
    ``stopped`` (``chat.stop``) or ``error`` (the chat model failed with ``LLMError``, the request
    overflowed the context window, the agent hit its step limit, or a bug raised; the latter is
    logged); what was stored before a failure stays. Concurrent turns of one session (on other
    workers, or run directly) are independent (docs/memory.md F-26). The turn's lease is renewed while
    it runs, and the session's interrupted turns are closed before it starts, so its history has
    no dangling question. Raises :class:`ChatSessionDeleted` when the session was deleted before
    or while the turn ran (nothing is left to store a reply in; logged at INFO, no traceback,
    docs/memory.md F-41), and otherwise only when even the error reply cannot be stored (database
    down) and for cancellation of the calling task. ``stopped``: whether the user stopped the
    session's turns while this one waited behind another or opened (asked once the turn is
    registered, so no stop falls between); such a turn ends as ``stopped`` at once (no search, no
    context, no model call). ``question``: the user message's text when the caller has it (the
    socket that stored it), so it is not read again.
    """
    async with (
        turn_lease_kept(user_message_id=user_message_id),
        stopping.turn_stop_listening(session_id=session_id, on_stop=_stop_here),
    ):
        # Never this process's own turns: one started a moment ago may not have its lease stored yet.
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
            scope_key=chat_session_scope_key(owner_id=session.owner_id, owner_session_key=session.owner_session_key),
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
            # Off the request path (docs/memory.md §10 "when the job runs"): at once when the next
            # request may cross the trigger (pre-compression, then key-fact extraction and
            # indexing of what is about to leave the retained window); otherwise batched: when
            # the chat goes idle, or every MEMORY_JOB_BATCH_TURNS replies.
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
    """Close the session's interrupted turns but those in ``exclude``, then load the session; also
    the first turn in flight (``turns.turn_in_flight_first_id``), the chat model's estimate
    calibration (no query for the offline engine) and the text of the turn's user message (``question`` when given, else read; None
    when it is gone). One trip to the database thread instead of five. Raises
    ``ChatSession.DoesNotExist``."""
    first = leases.turns_interrupted_close_first_in_flight(session_id=session_id, exclude=exclude)
    session = selectors.chat_session_get(session_id=session_id)
    if question is None:
        try:
            question = selectors.message_content_get(message_id=user_message_id)
        except Message.DoesNotExist:
            question = None
    return session, first, engine.token_factor(), question


class ChatSessionDeleted(Exception):
    """The chat session of a turn was deleted before or while the turn ran: the turn ended
    without a reply and left nothing behind (docs/memory.md F-41). Its sockets were closed with
    code 4404 by the delete."""

    def __init__(self, session_id: int, user_message_id: int) -> None:
        super().__init__(f"chat session {session_id} was deleted during turn {user_message_id}")
        self.session_id = session_id
        self.user_message_id = user_message_id


def _deleted(session_id: int, user_message_id: int) -> ChatSessionDeleted:
    logger.info("chat turn %s ended: its session %s was deleted", user_message_id, session_id)
    return ChatSessionDeleted(session_id, user_message_id)


def chat_turn_start(
    *, session_id: int, user_message_id: int, lease_fresh: bool = False, question: str | None = None
) -> asyncio.Task[Message]:
    """Run :func:`chat_turn_run` as a background task of the running event loop, after the
    session's turns started earlier in this process have ended; returns the task. The turn's
    lease is renewed while it waits; ``lease_fresh``: it was stored a moment ago (by
    :func:`chatapp.conversation.leases.user_message_submit`), so the first renewal waits a beat.
    From the call on, the turn counts as this process's (``leases.turns_leased_here``).
    ``question``: the user message's text, when the caller has it (:func:`chat_turn_run`)."""
    leases.turn_lease_claim(user_message_id=user_message_id)
    task = asyncio.create_task(
        _chat_turn_queued(
            session_id=session_id, user_message_id=user_message_id, lease_fresh=lease_fresh, question=question
        )
    )
    _tasks.add(task)
    task.add_done_callback(_task_done)
    # Also when the task is cancelled before it ever ran (its ``finally`` would not run).
    task.add_done_callback(lambda _: leases.turn_lease_unclaim(user_message_id=user_message_id))
    return task


async def _chat_turn_queued(
    *, session_id: int, user_message_id: int, lease_fresh: bool = False, question: str | None = None
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
    """Ask every turn of session ``session_id`` running in this process to stop, and those started
    here and still waiting behind one (each ends as ``stopped`` when its time comes, without
    calling the model: a user who presses Stop stops what they have in flight); returns how many
    were running."""
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
    """Ask every running turn of session ``session_id`` to stop, on whichever worker it runs
    (:mod:`chatapp.conversation.stopping`): those of this process at once, the others when their
    worker's listener gets the channel layer's ``turn.stop`` (milliseconds). Returns how many
    were running in this process; turns queued behind them are stopped too
    (:func:`chat_turn_stop`). A channel layer that fails is logged: the local turns are stopped all
    the same."""
    stopped = chat_turn_stop(session_id=session_id)
    try:
        await stopping.turn_stop_broadcast(session_id=session_id)
    except Exception:
        logger.exception("could not send the stop of chat session %s to the other workers", session_id)
    return stopped


async def chat_turns_wait() -> None:
    """Wait until every background turn of this process has ended (tests, graceful shutdown);
    bound it with ``asyncio.timeout``."""
    if _tasks:
        await asyncio.wait(set(_tasks))
