"""What both modes share within one turn: the memory engine, the chat model streamed as ``chat.delta``, stored
replies and the turn's end; every event carries ``turn_id`` (the user message's id) and ``step``, the model call
from 1 (docs/protocol.md)."""

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
from chatapp.llm.calibration import calibration_report, server_facts_recorded
from chatapp.llm.clients import LLMError, chat_endpoint, chat_stream, refused_shapes
from chatapp.llm.prompts import AGENT_PASSAGES_TARGET_SHARE, PASSAGES_TARGET_SHARE
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

# Seconds between chat.delta events: each costs every socket a channel-layer message (docs/benchmarks.md).
DELTA_FLUSH_SECONDS = 0.1
# A turn stopped before any text stores this (app-written, docs/memory.md F-37).
STOPPED_PLACEHOLDER = "[stopped by the user]"


@dataclass(kw_only=True)
class ModelReply:
    """One streamed model call so far: text, tool calls (OpenAI format), provider usage (tokens, None: unreported)."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str = ""
    # Why the provider's usage is missing ("not reported", "not asked"); "" when it came.
    usage_missing: str = ""


class TurnStopped(Exception):
    """``chat.stop`` while the model was answering; ``partial`` is what had been streamed."""

    def __init__(self, partial: ModelReply) -> None:
        super().__init__("stopped by the user")
        self.partial = partial


class ModelCallFailed(Exception):
    """The chat model raised ``error`` after streaming ``partial``."""

    def __init__(self, error: LLMError, partial: ModelReply) -> None:
        super().__init__(error.message)
        self.error = error
        self.partial = partial

    @property
    def reply_text(self) -> str:
        note = f"[The assistant could not answer: {self.error.message}]"
        return f"{self.partial.text}\n\n{note}" if self.partial.text else note


class Turn:
    """One running turn of ``session_id`` opened by ``user_message_id``; ``question`` and ``scope_key`` (the owner's)
    are what its recall searches with, and ``scope_key`` whose personal key facts its requests see; its replies are
    stored as ``version`` of the turn's reply (above 1 once regenerated)."""

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
        version: int = 1,
    ) -> None:
        self.session_id = session_id
        self.version = version
        self.user_message_id = user_message_id
        self.mode = mode
        self.question = question
        self._in_flight_first_id = in_flight_first_id
        self.endpoint = chat_endpoint()
        self.engine = engine
        self.memory_key = memory_key_of(session_id)
        self.scope_key = scope_key
        self._stop = asyncio.Event()
        self._stream_task: asyncio.Task[None] | None = None
        # Tokens of this turn's last request, 0 before the first.
        self.last_request_tokens = 0
        # The last call's provider usage, until stored with its message (:meth:`store`).
        self._usage: services.ModelCallUsage | None = None
        self.recall = engine.recall(memory_key=self.memory_key, scope_key=scope_key, question=question)

    async def context_request(self, *, system_prompt: str, tools: list[dict[str, Any]] | None = None) -> ContextRequest:
        """The memory engine's request for the next model call; call it before each one (turns in flight change)."""
        return ContextRequest(
            memory_key=self.memory_key,
            system_prompt=system_prompt,
            load_increment=self.load_increment,
            load_recall=self.recall,
            mode="agent" if self.mode == ChatSession.Mode.AGENT else "quick-answer",
            tools=tools,
            summarize_below=await self.summarize_below(),
            now=timezone.localtime(),
            scope_key=self.scope_key,
        )

    def precompression_may_help(self, final_reply: Message) -> bool:
        """Whether the next request could cross the trigger (last request + reply + ``MEMORY_PRECOMPRESS_TOKENS`` +
        passages), so a memory job is worth scheduling (docs/memory.md §10)."""
        if settings.MEMORY_COMPRESSION != "background" or not self.last_request_tokens:
            return settings.MEMORY_COMPRESSION == "background"
        allowance = self.passages_max_tokens if self.mode == "quick-answer" else 0
        planned = (
            self.last_request_tokens + (final_reply.token_count or 0) + settings.MEMORY_PRECOMPRESS_TOKENS + allowance
        )
        return planned > self.engine.budget.trigger_tokens

    @property
    def passages_max_tokens(self) -> int:
        """Tokens of knowledge-base passages one search may return: a share of the target, smaller for the agent."""
        share = AGENT_PASSAGES_TARGET_SHARE if self.mode == "agent" else PASSAGES_TARGET_SHARE
        return int(self.engine.budget.target_tokens * share)

    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        """A reply being streamed ends at once; no further step runs."""
        self._stop.set()
        if self._stream_task is not None:
            self._stream_task.cancel()

    async def load_increment(self, boundary: int | None) -> list[dict[str, Any]]:
        return await orm_async(selectors.message_list_for_context)(
            session_id=self.session_id, boundary=boundary, turn_message_id=self.user_message_id
        )

    async def summarize_below(self) -> int | None:
        """The first user message of the session's live turns in flight, so no concurrent turn's question is summarized
        (docs/memory.md F-26); the first call may use the id read as the turn opened (never too high)."""
        if self._in_flight_first_id is not None:
            first, self._in_flight_first_id = self._in_flight_first_id, None
            return first
        return await orm_async(turns.turn_in_flight_first_id)(session_id=self.session_id)

    async def emit(self, event: ServerEvent) -> None:
        await event_broadcast(self.session_id, event)

    async def store(self, **fields: Any) -> Message:
        """Store a reply of this turn, with its model call's usage when that is not stored yet."""
        usage = self._usage
        message = await orm_async(services.reply_message_store)(
            session_id=self.session_id, reply_to_id=self.user_message_id, usage=usage, version=self.version, **fields
        )
        if self._usage is usage:
            self._usage = None
        return message

    async def model_call(self, ctx: MemoryContext, *, step: int, tools: list[dict[str, Any]] | None) -> ModelReply:
        """Record the request (``ModelCall``), emit its memory events and stream the reply as ``chat.delta``; stores no
        message. ``ctx`` must not overflow. Raises :class:`TurnStopped` or :class:`ModelCallFailed`."""
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
                context=server_facts_recorded(
                    record.context, missing=reply.usage_missing, adapted=refused_shapes(self.endpoint)
                ),
            )
        await self.calibrate(estimated_tokens=ctx.tokens, prompt_tokens=reply.prompt_tokens)
        return reply

    def calibration(self, ctx: MemoryContext) -> dict[str, Any]:
        return calibration_report(self.endpoint, token_factor=ctx.token_factor, window_tokens=ctx.window_tokens)

    async def calibrate(self, *, estimated_tokens: int, prompt_tokens: int | None) -> None:
        """Count a finished call in the estimate's calibration (docs/memory.md §5); a lost sample is only logged."""
        try:
            await self.engine.calibrate(estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens)
        except DatabaseError:
            logger.warning("token calibration of %s not stored", self.endpoint.model, exc_info=True)

    async def context_emit(self, ctx: MemoryContext, *, step: int, model_call_id: int | None) -> None:
        """Emit ``memory.compression`` per compression event of ``ctx``, then ``memory.context``."""
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
                reply.usage_missing = event.get("missing", "")
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
        """Store the final reply, emit ``error`` (``error``: ``(code, message)``) when given, then ``chat.done``.
        ``origin`` defaults to ``app`` for an error reply (never sent to the model, F-37), else ``model``."""
        if origin is None:
            origin = Message.Origin.APP if status == Message.Status.ERROR else Message.Origin.MODEL
        message = await self.store(
            role=Message.Role.ASSISTANT, content=content, status=status, step=step, origin=origin
        )
        if error is not None:
            await self.emit(ErrorEvent(turn_id=self.user_message_id, code=error[0], message=error[1]))
        await self.emit(ChatDoneEvent(turn_id=self.user_message_id, status=status, message_id=message.pk))
        return message

    async def answered(self, reply: ModelReply, *, step: int) -> Message:
        """Store the model's final answer: ``cut_off`` when the provider ended it at its token limit, so it is never
        shown, exported or sent back to the model as a finished answer; ending markers the model copied are removed."""
        status = Message.Status.CUT_OFF if reply.finish_reason == "length" else Message.Status.COMPLETE
        return await self.finish(content=selectors.echoed_markers_removed(reply.text), status=status, step=step)

    async def stopped(self, partial_text: str, *, step: int) -> Message:
        """End a stopped turn with the streamed text, or the app's placeholder when there was none (F-37)."""
        return await self.finish(
            content=selectors.echoed_markers_removed(partial_text) if partial_text else STOPPED_PLACEHOLDER,
            status=Message.Status.STOPPED,
            step=step,
            origin=Message.Origin.MODEL if partial_text else Message.Origin.APP,
        )

    async def fail(self, failure: ModelCallFailed, *, step: int) -> Message:
        return await self.finish(
            content=failure.reply_text,
            status=Message.Status.ERROR,
            step=step,
            error=(llm_error_code(failure.error.kind), failure.error.message),
        )

    async def overflow(self, ctx: MemoryContext, *, step: int) -> Message:
        """End the turn without calling the model: even the elided current turn is over the window."""
        await self.context_emit(ctx, step=step, model_call_id=None)
        text = (
            f"This message is too large for the model's context window ({ctx.tokens} of "
            f"{ctx.window_tokens or ctx.context_window} tokens even after compression), so it was not sent. "
            "Please send a shorter message or start a new chat."
        )
        return await self.finish(content=text, status=Message.Status.ERROR, step=step, error=(CONTEXT_OVERFLOW, text))
