"""The demo walk-through (docs/demo.md): :data:`DEMO_SCRIPT` run through the real turn runner, each step followed
by the memory job, with a summarizer outage during :data:`OUTAGE_STEPS`; it ends at the last step, Stop or delete."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from dataclasses import dataclass, field
from typing import Literal

from django.conf import settings

from chatapp.chats import selectors
from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.conversation.leases import user_message_submit
from chatapp.conversation.runner import ChatSessionDeleted, chat_turn_start
from chatapp.llm.offline.faults import OfflineOverrides, offline_overrides
from chatapp.models import ChatSession, Message
from chatapp.orm_threads import orm_async

logger = logging.getLogger(__name__)

DEMO_TITLE = "Demo: memory walk-through"
# The demo chat's mode: agent, so the knowledge-base searches show as tool calls.
DEMO_MODE = ChatSession.Mode.AGENT
THINKING_SHARE = 0.6  # of a step's DEMO_SECONDS / steps, before the reply
JOB_WAIT_SECONDS = 30.0  # for the memory job after a step; then the demo goes on
# "demo-1", "demo-2" ...: a step is stored once per chat even if a second demo runs on it elsewhere.
CLIENT_ID_PREFIX = "demo-"


@dataclass(frozen=True, kw_only=True)
class DemoStep:
    """One step of the walk-through: the user message and what it shows (for docs/demo.md and the logs)."""

    text: str
    shows: str


DEMO_SCRIPT: tuple[DemoStep, ...] = (
    DemoStep(text="Hi! My name is Ada Byron and my account id is ACC-7731.", shows="a name and an identifier"),
    DemoStep(text="I was charged 240 euros twice on my March invoice.", shows="an amount"),
    DemoStep(text="My Team plan renews on 14 March 2027.", shows="a date"),
    DemoStep(text="I prefer email over phone calls, please.", shows="a preference"),
    DemoStep(text="My shipping address is 12 Elm Road, Leeds.", shows="an address (corrected later)"),
    DemoStep(
        text="My old laptop is a ThinkPad called Falcon and it keeps the tax folder in sync.",
        shows="a detail recalled at the end",
    ),
    DemoStep(text="Search the knowledge base for API rate limits.", shows="a knowledge-base search"),
    DemoStep(text="What does the knowledge base say about encryption at rest?", shows="a knowledge-base search"),
    DemoStep(text="Calculate 240 * 2", shows="the calculator tool"),
    DemoStep(text="Search the knowledge base for deleted files in the trash.", shows="a knowledge-base search"),
    DemoStep(text="What does the knowledge base say about the Team plan price?", shows="a knowledge-base search"),
    DemoStep(text="Search the knowledge base for two-factor authentication.", shows="compression"),
    DemoStep(text="Search the knowledge base for the conflicting copy error.", shows="recent turns kept verbatim"),
    DemoStep(text="Search the knowledge base for refunds of a yearly payment.", shows="a knowledge-base search"),
    DemoStep(text="My new shipping address is 48 Birch Lane, York.", shows="a correction that supersedes a fact"),
    DemoStep(text="What does the knowledge base say about the largest file size?", shows="the summarizer outage"),
    DemoStep(text="Search the knowledge base for single sign-on.", shows="the summarizer outage"),
    DemoStep(text="Search the knowledge base for the status page.", shows="recovery"),
    DemoStep(text="What does the knowledge base say about the certificate problem error?", shows="compression"),
    DemoStep(text="Search the knowledge base for the slow first sync.", shows="a knowledge-base search"),
    DemoStep(text="What is my account id?", shows="a key fact answered after compression"),
    DemoStep(text="What is my shipping address?", shows="the corrected value"),
    DemoStep(text="Which laptop keeps the tax folder in sync?", shows="a recalled message"),
)
# Steps (1-based) during which every summarizer request of the demo chat fails.
OUTAGE_STEPS = frozenset({16, 17})
OUTAGE_TEXT = "injected summarizer outage (demo walk-through, step {step})"


DemoStatus = Literal["complete", "stopped", "deleted"]


@dataclass(kw_only=True)
class DemoOutcome:
    """How a walk-through ended; ``steps``: the 1-based steps whose turn ran; ``replies``: their final replies' ids."""

    status: DemoStatus = "complete"
    steps: list[int] = field(default_factory=list)
    replies: list[int] = field(default_factory=list)


def demo_step_seconds() -> tuple[float, float]:
    """``(thinking, pause)`` of one step in seconds: ``DEMO_SECONDS`` spread over the steps."""
    share = settings.DEMO_SECONDS / len(DEMO_SCRIPT)
    return share * THINKING_SHARE, share * (1 - THINKING_SHARE)


async def demo_run(*, session_id: int, script: tuple[DemoStep, ...] = DEMO_SCRIPT) -> DemoOutcome:
    """Walk the chat through ``script``; returns how it ended. A step already stored (by a demo on another worker)
    is skipped. Raises only what storing a user message raises when the database fails."""
    thinking, pause = demo_step_seconds()
    memory_key = memory_key_of(session_id)
    outcome = DemoOutcome()
    _cancelled.discard(session_id)
    for number, step in enumerate(script, 1):
        if session_id in _cancelled:
            raise asyncio.CancelledError
        try:
            session = await orm_async(selectors.chat_session_get)(session_id=session_id)
        except ChatSession.DoesNotExist:
            outcome.status = "deleted"
            break
        outage = OUTAGE_TEXT.format(step=number) if number in OUTAGE_STEPS else ""
        logger.info("demo of chat session %s, step %s: %s", session_id, number, step.shows)
        with offline_overrides(OfflineOverrides(chat_delay_seconds=thinking, summary_outage=outage)):
            try:
                message, created = await orm_async(user_message_submit)(
                    session=session, client_message_id=f"{CLIENT_ID_PREFIX}{number}", text=step.text
                )
            except Exception:
                # Deleted since it was loaded (the message's foreign key fails): not an error.
                if await orm_async(selectors.chat_session_exists)(session_id=session_id):
                    raise
                outcome.status = "deleted"
                break
            if not created:
                continue  # another run of the demo in this chat stored (and answers) this step
            try:
                reply = await chat_turn_start(session_id=session_id, user_message_id=message.pk, lease_fresh=True)
            except ChatSessionDeleted:
                outcome.status = "deleted"
                break
            outcome.steps.append(number)
            outcome.replies.append(reply.pk)
            if reply.status == Message.Status.STOPPED:
                outcome.status = "stopped"
                break
            await _memory_job_run(memory_key, number)
        if pause > 0 and number < len(script):
            await asyncio.sleep(pause)
    logger.info("demo of chat session %s ended (%s) after %s steps", session_id, outcome.status, len(outcome.steps))
    return outcome


async def _memory_job_run(memory_key: str, number: int) -> None:
    """Run the memory job in this context (so the step's outage holds), waiting at most :data:`JOB_WAIT_SECONDS`."""
    job = asyncio.ensure_future(memory_engine().run_jobs(memory_key))
    done, _ = await asyncio.wait({job}, timeout=JOB_WAIT_SECONDS)
    if not done:
        logger.warning("demo of %s: the memory job outlasted step %s", memory_key, number)
    elif job.exception() is not None:
        logger.error("demo of %s: the memory job of step %s failed", memory_key, number, exc_info=job.exception())


# By chat session id; held so the loop cannot collect them.
_demos: dict[int, asyncio.Task[DemoOutcome]] = {}
_cancelled: set[int] = set()


def demo_start(*, session_id: int) -> asyncio.Task[DemoOutcome] | None:
    """Start :func:`demo_run` as a task in a context of its own; None when the chat's demo already runs here."""
    running = _demos.get(session_id)
    if running is not None and not running.done():
        return None
    # Nothing of the caller's context (an HTTP request's ends with its response) reaches the demo's turns and jobs.
    task = asyncio.get_running_loop().create_task(
        demo_run(session_id=session_id), name=f"demo:{session_id}", context=contextvars.Context()
    )
    _demos[session_id] = task
    task.add_done_callback(lambda done: _demo_done(session_id, done))
    return task


def _demo_done(session_id: int, task: asyncio.Task[DemoOutcome]) -> None:
    if _demos.get(session_id) is task:
        del _demos[session_id]
    if not task.cancelled() and task.exception() is not None:
        logger.error("demo of chat session %s failed", session_id, exc_info=task.exception())


def demo_running_sessions() -> frozenset[int]:
    return frozenset(session_id for session_id, task in _demos.items() if not task.done())


async def demos_cancel() -> int:
    """Cancel every demo of this process and its running turn, and wait for them (tests, shutdown); returns how many
    ran. A cancelled turn's user message is closed later as interrupted."""
    tasks = [task for task in _demos.values() if not task.done()]
    _cancelled.update(session_id for session_id, task in _demos.items() if not task.done())
    # A streaming turn takes a cancellation as a stop, so its awaiter gets a result, not the cancellation:
    # cancel again until every demo has ended (demo_run also checks _cancelled before each step).
    while pending := [task for task in tasks if not task.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=0.5)
    return len(tasks)


async def demos_wait() -> None:
    """Wait for every demo of this process to end (tests, shutdown); bound it with a timeout."""
    tasks = [task for task in _demos.values() if not task.done()]
    if tasks:
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
