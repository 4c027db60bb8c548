"""Memory jobs of this worker process (docs/memory.md §10, "memory job" and "pre-compression").

After every turn the session's memory job is scheduled (:func:`memory_job_schedule`): a
:class:`memory.api.MemoryJobRunner` per event loop runs it as an asyncio task, debounced and
coalescing, holding the session's lease in the database (:class:`memory.api.OrmJobStore`) so
that one job per session runs at a time across all workers. Its pipeline today is one step,
:class:`PreCompression`: it plans the session's next request as if a user message of
``MEMORY_PRECOMPRESS_TOKENS`` arrived and compresses now when that request would cross the
trigger, so the next turn finds itself under it and makes no summarizer call before its first
token. Fact extraction and indexing for recall join the pipeline as further steps.

The request path reads only (``MEMORY_COMPRESSION=background``, the default): a request still
over the trigger waits at most ``MEMORY_SYNC_WAIT_MS`` for the session's job, then goes on with
the degraded context and schedules the job (:class:`memory.api.MemoryEngine`). With
``MEMORY_COMPRESSION=sync`` the request compresses itself, as earlier versions did, and the
pre-compression step does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, cast

from django.conf import settings

from chatapp.chats import selectors
from chatapp.conversation import leases
from chatapp.conversation.agent import AGENT_PROMPT
from chatapp.conversation.quick_answer import quick_answer_system_prompt
from chatapp.conversation.tools import TOOL_SCHEMAS
from chatapp.conversation.turn import PASSAGES_TARGET_SHARE, memory_engine_build
from chatapp.llm.clients import chat_endpoint
from chatapp.models import ChatSession
from chatapp.orm_threads import orm_async
from chatapp.realtime.broadcast import event_broadcast
from chatapp.realtime.protocol import MemoryCompressionEvent, MemorySummaryEvent
from memory.api import (
    ContextRequest,
    JobRun,
    MemoryEngine,
    MemoryJobRunner,
    Mode,
    OrmJobStore,
    session_memory_delete,
    session_summary_get,
)

logger = logging.getLogger(__name__)

# This process's name in job leases: host, process id and a random part (a restarted process
# with the same pid must not inherit a lease).
WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

_runners: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, MemoryJobRunner] = weakref.WeakKeyDictionary()
# Broadcasts after jobs, held so the event loop cannot garbage-collect them mid-way.
_telling: set[asyncio.Task[None]] = set()


NextRequest = tuple[str, list[dict[str, Any]] | None, int]
"""What the session's next request will carry besides its history: the system prompt, the tool
schemas (None for none) and an allowance in tokens for what is not known yet (passages)."""


def next_request_of_mode(mode: str, engine: MemoryEngine) -> NextRequest:
    """The live app's next request in ``mode``: the agent's prompt and tools, or the quick-answer
    prompt with room for the next question's passages (at most a share of the target)."""
    if mode == ChatSession.Mode.AGENT:
        return AGENT_PROMPT, TOOL_SCHEMAS, 0
    return quick_answer_system_prompt([]), None, int(engine.budget.target_tokens * PASSAGES_TARGET_SHARE)


def live_engine() -> MemoryEngine:
    """The engine a live turn uses (no jobs: a job never hands work to itself)."""
    return memory_engine_build(chat_endpoint())


class PreCompression:
    """The pipeline step that compresses ahead of the next request (docs/memory.md §10,
    "pre-compression"). Its watermark is the id of the newest message it planned with.

    ``engine_build`` makes the engine to compress with (the live app's by default);
    ``next_request`` says what the next request carries (:func:`next_request_of_mode` by default;
    the replay command passes its recorded system prompt); ``orm`` turns the synchronous ORM
    functions it calls into awaitables (:func:`chatapp.orm_threads.orm_async` by default; the
    replay command, whose caller holds the database connection, passes ``sync_to_async``).
    ``last_events``: the compression events its last run recorded (their JSON form).
    """

    name = "precompress"

    def __init__(
        self,
        *,
        engine_build: Callable[[], MemoryEngine] = live_engine,
        next_request: Callable[[str, MemoryEngine], NextRequest] = next_request_of_mode,
        orm: Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]] = orm_async,
    ) -> None:
        self.engine_build = engine_build
        self.next_request = next_request
        self.orm = orm
        self.last_events: list[dict[str, Any]] = []

    async def due(self, memory_key: str) -> bool:
        """Whether the session's next request would cross the trigger now (reads only); never in
        ``MEMORY_COMPRESSION=sync`` mode, nor for a session that is gone or empty."""
        planned = await self._next_request(memory_key)
        if planned is None:
            return False
        engine, request, tokens, _ = planned
        return await engine.precompress_due(request, next_message_tokens=tokens)

    async def run(self, memory_key: str, watermark: int | None) -> int | None:
        """Plan the next request of the session named ``memory_key`` and compress when it would
        cross the trigger (through the summarizer chain and compare-and-set, like a request).
        Returns the newest message id it planned with. When the session is gone (deleted while
        this ran), its memory state is deleted, job state included, so nothing of it remains
        (docs/memory.md F-41). Storage errors propagate (the attempt fails)."""
        self.last_events = []
        planned = await self._next_request(memory_key)
        if planned is None:
            await self.orm(session_memory_delete)(memory_key=memory_key)
            return watermark
        engine, request, tokens, last_id = planned
        context = await engine.precompress(request, next_message_tokens=tokens)
        self.last_events = context.events if context is not None else []
        session_id = ChatSession.session_id_for(memory_key)
        if not await self.orm(selectors.chat_session_exists)(session_id=session_id):
            await self.orm(session_memory_delete)(memory_key=memory_key)
        elif context is not None:
            for event in context.events:
                await event_broadcast(session_id, MemoryCompressionEvent(turn_id=None, step=0, event=event))
        return last_id

    async def _next_request(self, memory_key: str) -> tuple[MemoryEngine, ContextRequest, int, int] | None:
        """The engine, the imagined next request, its next-message tokens and the session's
        newest message id; None in sync mode or when the session is gone or empty."""
        if settings.MEMORY_COMPRESSION != "background":
            return None
        session_id = ChatSession.session_id_for(memory_key)
        subject = await self.orm(selectors.memory_job_subject_get)(session_id=session_id)
        if subject is None:
            return None
        mode, last_id = subject
        engine = self.engine_build()
        system_prompt, tools, allowance = self.next_request(mode, engine)

        async def load_increment(boundary: int | None) -> list[dict[str, Any]]:
            return await self.orm(selectors.message_list_for_context)(
                session_id=session_id, boundary=boundary, turn_message_id=last_id
            )

        request = ContextRequest(
            memory_key=memory_key,
            system_prompt=system_prompt,
            load_increment=load_increment,
            mode=cast(Mode, mode),
            tools=tools,
            summarize_below=await self.orm(leases.turn_in_flight_first_id)(session_id=session_id),
            origin="job",
        )
        return engine, request, settings.MEMORY_PRECOMPRESS_TOKENS + allowance, last_id


def memory_job_runner() -> MemoryJobRunner:
    """This process's job runner for the running event loop (created on first use)."""
    loop = asyncio.get_running_loop()
    runner = _runners.get(loop)
    if runner is None:
        runner = MemoryJobRunner(
            store=OrmJobStore(),
            steps=[PreCompression()],
            owner=WORKER_NAME,
            debounce_seconds=settings.MEMORY_JOB_DEBOUNCE_MS / 1000,
            lease_seconds=settings.MEMORY_JOB_LEASE_SECONDS,
            on_done=_job_done,
        )
        _runners[loop] = runner
    return runner


def _job_done(run: JobRun) -> None:
    """After each job, tell the session's sockets (``memory.summary``), so that the inspector
    shows the summary and the job as they are now."""
    if not run.lost_lease:
        task = asyncio.get_running_loop().create_task(_job_tell(ChatSession.session_id_for(run.memory_key)))
        _telling.add(task)
        task.add_done_callback(_telling.discard)


async def _job_tell(session_id: int) -> None:
    try:
        summary = await orm_async(session_summary_get)(memory_key=ChatSession.memory_key_for(session_id))
        await event_broadcast(session_id, MemorySummaryEvent(turn_id=None, step=0, summary=summary.as_dict()))
    except Exception:
        logger.exception("could not tell chat session %s that its memory job ended", session_id)


def memory_job_local_status(*, session_id: int) -> str | None:
    """``running`` or ``queued`` while a job of this process is running or pending for session
    ``session_id`` (any event loop), else None. Safe to call from the database threads."""
    memory_key = ChatSession.memory_key_for(session_id)
    statuses = {runner.status(memory_key) for runner in list(_runners.values())} - {None}
    return "running" if "running" in statuses else next(iter(statuses), None)


def memory_job_schedule(*, session_id: int) -> None:
    """Queue the memory job of session ``session_id`` in this process (returns at once)."""
    memory_job_runner().schedule(ChatSession.memory_key_for(session_id))


async def memory_job_run_now(*, session_id: int) -> None:
    """Run the memory job of session ``session_id`` to completion (after one already pending or
    running here), e.g. between the turns of a replay so that it is deterministic."""
    await memory_job_runner().run_now(ChatSession.memory_key_for(session_id))
