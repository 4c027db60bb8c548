"""The machinery both modes share within one turn: reaching the memory engine and the chat model,
streaming the reply as events, storing reply messages, ending the turn.

A turn tells the session's sockets what happens with the typed events of
:mod:`chatapp.realtime.protocol` (docs/protocol.md), each carrying ``turn_id`` (the id of the user
message that opened it): ``chat.turn``, ``chat.retrieval`` (quick-answer), ``memory.compression``
and ``memory.context`` before each model call, ``chat.delta``, ``chat.message`` (stored replies,
after commit), ``error`` when it failed, and ``chat.done``. ``step`` numbers the model calls of a
turn from 1.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from chatapp.chats import selectors, services, turns
from chatapp.chats.memory import memory_key_of
from chatapp.llm.calibration import calibration_report
from chatapp.llm.clients import LLMError, chat_endpoint, chat_stream
from chatapp.llm.prompts import PASSAGES_TARGET_SHARE
from chatapp.models import ChatSession, Message
from chatapp.orm_threads import orm_async
from chatapp.realtime.broadcast import event_broadcast
from chatapp.realtime.protocol import (
    CONTEXT_OVERFLOW,
    ChatDeltaEvent,
    ChatDoneEvent,
    ErrorEvent,
    MemoryCompressionEvent,
    MemoryContextEvent,
    ServerEvent,
    llm_error_code,
)
from memory.api import ContextRequest, MemoryContext, MemoryEngine

logger = logging.getLogger(__name__)

# Streamed text is sent at most this often (seconds), in pieces, to keep channel traffic bounded:
# each chat.delta costs every socket of the session a channel-layer message and a frame, and on a
# busy worker the model's chunks arrive further apart than a shorter interval (bench/ws_load.py).
DELTA_FLUSH_SECONDS = 0.1
# The stored reply of a turn stopped before the model sent any text (app-written, docs/memory.md F-37).
STOPPED_PLACEHOLDER = "[stopped by the user]"


@dataclass(kw_only=True)
class ModelReply:
    """What one streamed model call produced so far: text, tool calls (OpenAI format), provider
    usage (tokens, None when not reported) and the finish reason."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str = ""


class TurnStopped(Exception):
    """The user stopped the turn (``chat.stop``) while the model was answering; ``partial`` is
    what had been streamed."""

    def __init__(self, partial: ModelReply) -> None:
        super().__init__("stopped by the user")
        self.partial = partial


class ModelCallFailed(Exception):
    """The chat model failed (``error``, an ``LLMError``) after streaming ``partial``."""

    def __init__(self, error: LLMError, partial: ModelReply) -> None:
        super().__init__(error.message)
        self.error = error
        self.partial = partial

    @property
    def reply_text(self) -> str:
        """The stored content of the failed reply: the partial text (if any) and why it ended."""
        note = f"[The assistant could not answer: {self.error.message}]"
        return f"{self.partial.text}\n\n{note}" if self.partial.text else note


class Turn:
    """One running turn: its session, the user message that opened it, the chat model and memory
    engine it uses, and whether the user asked it to stop. ``engine``: the memory engine (its
    calibration read as the turn opened); ``question`` and ``scope_key``: the user message's text
    and the owner's scope key (the turn's recall searches with them)."""

    def __init__(
        self,
        *,
        session_id: int,
        user_message_id: int,
        mode: str,
        engine: MemoryEngine,
        question: str,
        scope_key: str,
        in_flight_first_id: int | None = None,
    ) -> None:
        self.session_id = session_id
        self.user_message_id = user_message_id
        self.mode = mode
        # The user message's text and the owner's scope key when the opener read them (queries
        # saved: quick-answer's search and recall use them); None: read when needed.
        self.question = question
        # The first in-flight id read when the turn opened (a query saved for the first context).
        self._in_flight_first_id = in_flight_first_id
        self.endpoint = chat_endpoint()
        self.engine = engine
        self.memory_key = memory_key_of(session_id)
        self._stop = asyncio.Event()
        self._stream_task: asyncio.Task[None] | None = None
        # The estimated size of this turn's last request (tokens), 0 before the first.
        self.last_request_tokens = 0
        # What the provider reported for the last model call, until the message it produced is
        # stored with it (:meth:`store`: the same transaction).
        self._usage: services.ModelCallUsage | None = None
        # Recall for this turn's question, searched once (docs/memory.md §12).
        self.recall = engine.recall(memory_key=self.memory_key, scope_key=scope_key, question=question)

    async def context_request(self, *, system_prompt: str, tools: list[dict[str, Any]] | None = None) -> ContextRequest:
        """The memory engine's request for this turn's next model call: this session's history
        up to this turn (:meth:`load_increment`), and the turns in flight as they are now
        (:meth:`summarize_below`), so call it again before every model call; recalled messages
        come from :attr:`recall`."""
        return ContextRequest(
            memory_key=self.memory_key,
            system_prompt=system_prompt,
            load_increment=self.load_increment,
            load_recall=self.recall,
            mode="agent" if self.mode == ChatSession.Mode.AGENT else "quick-answer",
            tools=tools,
            summarize_below=await self.summarize_below(),
            now=timezone.localtime(),
        )

    def precompression_may_help(self, final_reply: Message) -> bool:
        """Whether the session's next request could cross the trigger (docs/memory.md §10):
        background mode, and this turn's last request plus its final reply, a next message of
        ``MEMORY_PRECOMPRESS_TOKENS`` and (quick-answer) the most passages reach the trigger.
        When not, the memory job is not even scheduled: it would find nothing to do. A wrong
        "no" costs nothing worse than the next request handing the work to the job itself."""
        if settings.MEMORY_COMPRESSION != "background" or not self.last_request_tokens:
            return settings.MEMORY_COMPRESSION == "background"
        allowance = self.passages_max_tokens if self.mode == "quick-answer" else 0
        planned = (
            self.last_request_tokens + (final_reply.token_count or 0) + settings.MEMORY_PRECOMPRESS_TOKENS + allowance
        )
        return planned > self.engine.budget.trigger_tokens

    @property
    def passages_max_tokens(self) -> int:
        """Tokens the knowledge-base passages of one prompt or tool result may take."""
        return int(self.engine.budget.target_tokens * PASSAGES_TARGET_SHARE)

    def stop_requested(self) -> bool:
        """Whether the user asked this turn to stop (a method, not a flag: another task sets it
        while this one awaits)."""
        return self._stop.is_set()

    def stop(self) -> None:
        """Ask the turn to stop: a reply being streamed ends at once, no further step runs."""
        self._stop.set()
        if self._stream_task is not None:
            self._stream_task.cancel()

    async def load_increment(self, boundary: int | None) -> list[dict[str, Any]]:
        """The memory engine's loader (see :func:`chatapp.chats.selectors.message_list_for_context`)."""
        return await orm_async(selectors.message_list_for_context)(
            session_id=self.session_id, boundary=boundary, turn_message_id=self.user_message_id
        )

    async def summarize_below(self) -> int | None:
        """The memory engine's ``summarize_below`` for the next context: the first user message
        of the session's turns in flight (this one included), so that no concurrent turn's
        question is summarized while it runs (docs/memory.md F-26). Interrupted turns (their lease
        expired) pin nothing. The first call returns ``in_flight_first_id`` when the turn was
        given one (read as it opened: turns in flight since then are newer, so it is never too high)."""
        if self._in_flight_first_id is not None:
            first, self._in_flight_first_id = self._in_flight_first_id, None
            return first
        return await orm_async(turns.turn_in_flight_first_id)(session_id=self.session_id)

    async def emit(self, event: ServerEvent) -> None:
        """Broadcast a server event of this turn to every socket of the session, now."""
        await event_broadcast(self.session_id, event)

    async def store(self, **fields: Any) -> Message:
        """Store a reply message of this turn (see :func:`chatapp.chats.services.reply_message_store`),
        with the usage of the model call it came from when that is not stored yet."""
        usage = self._usage
        message = await orm_async(services.reply_message_store)(
            session_id=self.session_id, reply_to_id=self.user_message_id, usage=usage, **fields
        )
        if self._usage is usage:
            self._usage = None
        return message

    async def model_call(self, ctx: MemoryContext, *, step: int, tools: list[dict[str, Any]] | None) -> ModelReply:
        """Record the request (a ``ModelCall`` row), emit the memory events of ``ctx``, and stream
        the reply to the sockets as ``chat.delta`` events.

        ``ctx`` must not be an overflow (see :meth:`overflow`). Raises :class:`TurnStopped` when
        the user stopped the turn and :class:`ModelCallFailed` when the model failed; either
        carries the partial reply. Stores no message: the caller does (:meth:`store`), and the
        provider's usage figures go to the call's record with it.
        """
        if self._usage is not None:  # the previous call's message was never stored: save it alone
            await orm_async(services.model_call_usage_save)(self._usage)
            self._usage = None
        if self.stop_requested():  # asked while the context was being built: do not call the model
            raise TurnStopped(ModelReply())
        self.last_request_tokens = ctx.tokens
        record = await orm_async(services.model_call_record)(
            session_id=self.session_id,
            reply_to_id=self.user_message_id,
            mode=self.mode,
            step=step,
            model=self.endpoint.model,
            context={**ctx.as_dict(), "tools": tools or [], "calibration": self.calibration(ctx)},
            estimated_tokens=ctx.tokens,
        )
        await self.context_emit(ctx, step=step, model_call_id=record.pk)
        reply = ModelReply()
        self._stream_task = asyncio.ensure_future(self._stream(ctx.messages, tools, step, reply))
        if self.stop_requested():  # asked while the call was recorded and announced
            self._stream_task.cancel()
        try:
            await self._stream_task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.stop_requested() and not (current is not None and current.cancelling()):
                raise TurnStopped(reply) from None
            raise
        except LLMError as exc:
            raise ModelCallFailed(exc, reply) from exc
        finally:
            self._stream_task = None
            self._usage = services.ModelCallUsage(
                model_call_id=record.pk,
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                finish_reason=reply.finish_reason or ("stopped" if self.stop_requested() else ""),
            )
        await self.calibrate(estimated_tokens=ctx.tokens, prompt_tokens=reply.prompt_tokens)
        return reply

    def calibration(self, ctx: MemoryContext) -> dict[str, Any]:
        """The calibration ``ctx`` was budgeted with (see :func:`chatapp.llm.calibration.calibration_report`)."""
        return calibration_report(self.endpoint, token_factor=ctx.token_factor, window_tokens=ctx.window_tokens)

    async def calibrate(self, *, estimated_tokens: int, prompt_tokens: int | None) -> None:
        """Count a finished call in the chat model's estimate calibration (docs/memory.md §5);
        the engine budgets this turn's next call with the new factor. A lost sample is logged."""
        try:
            await self.engine.calibrate(estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens)
        except DatabaseError:  # a lost sample is no reason to fail a reply that arrived
            logger.warning("token calibration of %s not stored", self.endpoint.model, exc_info=True)

    async def context_emit(self, ctx: MemoryContext, *, step: int, model_call_id: int | None) -> None:
        """Emit ``memory.compression`` for each compression event of ``ctx``, then ``memory.context``
        (everything the engine reports except the message texts, which stay on the ModelCall)."""
        turn_id = self.user_message_id
        for event in ctx.events:
            await self.emit(MemoryCompressionEvent.from_record(event, turn_id=turn_id, step=step))
        await self.emit(
            MemoryContextEvent.from_context(
                ctx, turn_id=turn_id, step=step, model_call_id=model_call_id, calibration=self.calibration(ctx)
            )
        )

    async def _stream(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, step: int, reply: ModelReply
    ) -> None:
        loop = asyncio.get_running_loop()
        pending: list[str] = []
        last_flush = -math.inf
        async for event in chat_stream(messages, tools=tools, endpoint=self.endpoint):
            if event["type"] == "delta":
                reply.text += event["text"]
                pending.append(event["text"])
                if loop.time() - last_flush >= DELTA_FLUSH_SECONDS:
                    await self.emit(ChatDeltaEvent(turn_id=self.user_message_id, step=step, text="".join(pending)))
                    pending.clear()
                    last_flush = loop.time()
            elif event["type"] == "tool_calls":
                reply.tool_calls = event["tool_calls"]
            elif event["type"] == "usage":
                reply.prompt_tokens, reply.completion_tokens = event["prompt_tokens"], event["completion_tokens"]
            elif event["type"] == "finish":
                reply.finish_reason = event["finish_reason"] or ""
        if pending:
            await self.emit(ChatDeltaEvent(turn_id=self.user_message_id, step=step, text="".join(pending)))

    async def finish(
        self,
        *,
        content: str,
        status: str,
        step: int,
        error: tuple[str, str] | None = None,
        origin: str | None = None,
    ) -> Message:
        """End the turn: store its final assistant message (``status`` complete/stopped/error),
        emit ``error`` (``error`` is ``(code, message)``, a code of
        :data:`chatapp.realtime.protocol.ERROR_CODES`) when it failed, then ``chat.done``.
        ``origin`` defaults to ``app`` for an ``error`` reply (the app wrote it; never sent to the
        model, docs/memory.md F-37) and ``model`` otherwise."""
        if origin is None:
            origin = Message.Origin.APP if status == Message.Status.ERROR else Message.Origin.MODEL
        message = await self.store(
            role=Message.Role.ASSISTANT, content=content, status=status, step=step, origin=origin
        )
        if error is not None:
            await self.emit(ErrorEvent(turn_id=self.user_message_id, code=error[0], message=error[1]))
        await self.emit(ChatDoneEvent(turn_id=self.user_message_id, status=status, message_id=message.pk))
        return message

    async def stopped(self, partial_text: str, *, step: int) -> Message:
        """End the turn the user stopped: a ``stopped`` reply with whatever text was streamed (the
        model's, sent later with a cut-off marker), or an app-written placeholder when nothing was
        (never sent to the model, docs/memory.md F-37)."""
        return await self.finish(
            content=partial_text or STOPPED_PLACEHOLDER,
            status=Message.Status.STOPPED,
            step=step,
            origin=Message.Origin.MODEL if partial_text else Message.Origin.APP,
        )

    async def fail(self, failure: ModelCallFailed, *, step: int) -> Message:
        """End the turn after the chat model failed: an ``error`` reply keeping the partial text."""
        return await self.finish(
            content=failure.reply_text,
            status=Message.Status.ERROR,
            step=step,
            error=(llm_error_code(failure.error.kind), failure.error.message),
        )

    async def overflow(self, ctx: MemoryContext, *, step: int) -> Message:
        """End the turn without calling the model: even the elided current turn is over the
        context window (``ctx.overflow``), so the request would be rejected."""
        await self.context_emit(ctx, step=step, model_call_id=None)
        text = (
            f"This message is too large for the model's context window ({ctx.tokens} of "
            f"{ctx.window_tokens or ctx.context_window} tokens even after compression), so it was not sent. "
            "Please send a shorter message or start a new chat."
        )
        return await self.finish(content=text, status=Message.Status.ERROR, step=step, error=(CONTEXT_OVERFLOW, text))
