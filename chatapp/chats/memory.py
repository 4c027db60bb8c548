"""The chat app's side of the memory engine: chats as its conversations (the one place a chat
session becomes a memory key), its settings as one :class:`MemoryConfig`, and the engine built
from them (docs/architecture.md, "memory engine")."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.db import connection
from django.utils import timezone

from chatapp.chats import selectors, turns
from chatapp.llm.calibration import calibration_applies
from chatapp.llm.clients import Endpoint, chat_endpoint
from chatapp.llm.embeddings import embedder_choice, embedder_configured
from chatapp.llm.prompts import (
    AGENT_PROMPT,
    EMPTY_RESULTS,
    NO_PASSAGES,
    PASSAGES_TARGET_SHARE,
    TOOL_SCHEMAS,
    UNINDEXED_TOOLS,
)
from chatapp.llm.prompts import system_prompt_with as quick_answer_prompt
from chatapp.llm.summarizer import summarizers_get
from chatapp.models import ChatSession, Message
from chatapp.orm_threads import orm_async

if TYPE_CHECKING:
    from chatapp.chats.job_queue import DurableJobQueue
from chatapp.realtime.broadcast import event_broadcast
from chatapp.realtime.protocol import MemoryCompressionEvent, MemoryFactsEvent, MemorySummaryEvent
from memory.api import (
    ContextRequest,
    ConversationSource,
    MemoryConfig,
    MemoryEngine,
    NextRequest,
    Notice,
    StoredMessages,
)
from memory.api import (
    Message as WireMessage,
)

logger = logging.getLogger(__name__)

# How synchronous ORM work is run from async code (:func:`chatapp.orm_threads.orm_async`, or
# asgiref's ``sync_to_async`` for a caller that holds its connection).
RunSync = Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]
# How many assistant messages before a batch are searched for the calls its tool results answer.
CALLS_LOOKBACK = 50


def memory_key_of(session_id: int) -> str:
    """The memory key of chat session ``session_id``."""
    return str(session_id)


def session_of(memory_key: str) -> int:
    """The chat session a memory key names; ValueError for a key that names none."""
    return int(memory_key)


def chat_session_scope_key(*, owner_id: int | None, owner_session_key: str, copy_id: int | None = None) -> str:
    """The memory scope key of a chat's owner (docs/memory.md §11, "scope"): ``user:<id>`` for a
    user, ``anon:<Django session key>`` for an anonymous browser. An edited copy (``copy_id``, §8) is a
    scope of its own, ``<owner>/copy:<chat id>``: its memory comes from its own messages, and no other
    chat sees its facts or recalls its messages, nor it theirs."""
    owner = f"user:{owner_id}" if owner_id is not None else f"anon:{owner_session_key}"
    return owner if copy_id is None else f"{owner}/copy:{copy_id}"


def session_scope_key(session: ChatSession) -> str:
    """:func:`chat_session_scope_key` of ``session``."""
    copy_id = session.pk if session.forked_at_message_id is not None else None
    return chat_session_scope_key(
        owner_id=session.owner_id, owner_session_key=session.owner_session_key, copy_id=copy_id
    )


def chat_session_lock(session_id: int) -> bool:
    """Whether the session exists, its row locked until the transaction ends where the database
    has row locks (SQLite's transactions begin IMMEDIATE and already serialize writers)."""
    rows = ChatSession.objects.filter(pk=session_id)
    if connection.features.has_select_for_update:
        rows = rows.select_for_update()
    return rows.exists()


class ChatConversations(ConversationSource):
    """Chat sessions as the memory engine's conversations. ``run_sync`` runs their reads (the ORM
    threads; a replay, which holds its database connection, passes ``sync_to_async``)."""

    def __init__(self, *, run_sync: RunSync = orm_async) -> None:
        self.run_sync = run_sync

    async def messages_after(self, memory_key: str, *, after: int | None, limit: int) -> StoredMessages | None:
        stored: StoredMessages | None = await self.run_sync(_messages_after)(
            session_id=session_of(memory_key), after=after, limit=limit
        )
        return stored

    async def has_messages_after(self, memory_key: str, *, after: int | None) -> bool:
        return bool(await self.run_sync(_messages_after_exist)(session_id=session_of(memory_key), after=after))

    async def next_request(self, memory_key: str) -> NextRequest | None:
        session_id = session_of(memory_key)
        subject = await self.run_sync(_next_request_subject)(session_id=session_id)
        if subject is None:
            return None
        mode, last_id, in_flight, scope_key = subject

        async def load_increment(boundary: int | None) -> list[WireMessage]:
            rows: list[WireMessage] = await self.run_sync(selectors.message_list_for_context)(
                session_id=session_id, boundary=boundary, turn_message_id=last_id
            )
            return rows

        system_prompt, tools, reserve_share = next_request_of_mode(mode)
        request = ContextRequest(
            memory_key=memory_key,
            system_prompt=system_prompt,
            load_increment=load_increment,
            mode="agent" if mode == ChatSession.Mode.AGENT else "quick-answer",
            tools=tools,
            summarize_below=in_flight,
            now=timezone.localtime(),
            scope_key=scope_key,
        )
        return NextRequest(request=request, reserve_share=reserve_share, last_message_id=last_id)

    def titles(self, memory_keys: set[str]) -> Mapping[str, str]:
        ids = {session_of(key): key for key in memory_keys}
        titles = dict(ChatSession.objects.filter(pk__in=ids).values_list("pk", "title"))
        return {key: titles.get(pk) or "untitled" for pk, key in ids.items()}

    def alive(self, memory_key: str) -> bool:
        try:
            session_id = session_of(memory_key)
        except ValueError:
            return False
        return chat_session_lock(session_id)

    async def notify(self, memory_key: str, notice: Notice) -> None:
        session_id = session_of(memory_key)
        try:
            for record in notice.compressions:
                await event_broadcast(session_id, MemoryCompressionEvent(turn_id=None, step=0, event=record.as_dict()))
            if notice.summary is not None:
                await event_broadcast(
                    session_id, MemorySummaryEvent(turn_id=None, step=0, summary=notice.summary.as_dict())
                )
            if notice.facts is not None:
                facts = [fact.as_dict() for fact in notice.facts]
                await event_broadcast(session_id, MemoryFactsEvent(turn_id=None, step=0, facts=facts))
        except Exception:
            logger.exception("could not tell chat session %s what memory did", session_id)


def next_request_of_mode(mode: str) -> tuple[str, list[dict[str, Any]] | None, float]:
    """What a chat's next request in ``mode`` carries besides its history: the system prompt,
    the tool schemas, and the share of the target kept for knowledge-base passages."""
    if mode == ChatSession.Mode.AGENT:
        return AGENT_PROMPT, TOOL_SCHEMAS, 0.0
    return quick_answer_prompt(NO_PASSAGES), None, PASSAGES_TARGET_SHARE


def _messages_after_exist(*, session_id: int, after: int | None) -> bool:
    rows = Message.objects.filter(session_id=session_id).exclude(origin=Message.Origin.APP)
    return (rows.filter(id__gt=after) if after is not None else rows).exists()


def _messages_after(*, session_id: int, after: int | None, limit: int) -> StoredMessages | None:
    """The session's messages after ``after`` that the app did not write, with the owner's scope
    key and the earlier calls their tool results answer; None when the session is gone."""
    owner = (
        ChatSession.objects.filter(pk=session_id)
        .values_list("owner_id", "owner_session_key", "forked_at_message_id")
        .first()
    )
    if owner is None:
        return None
    rows = Message.objects.filter(session_id=session_id).exclude(origin=Message.Origin.APP)
    if after is not None:
        rows = rows.filter(id__gt=after)
    columns = ("id", "role", "content", "tool_calls", "tool_call_id", "name", "created")
    messages: list[dict[str, Any]] = [
        {**dict(zip(columns[:-1], row[:-1], strict=True)), "created_at": row[-1]}
        for row in rows.order_by("id").values_list(*columns)[:limit]
    ]
    made = {str(call.get("id")) for message in messages for call in message["tool_calls"] or () if call.get("id")}
    wanted = {message["tool_call_id"] for message in messages if message["role"] == "tool"} - made - {""}
    calls: dict[str, tuple[int, dict[str, Any]]] = {}
    if wanted:
        earlier = (
            Message.objects.filter(session_id=session_id, role=Message.Role.ASSISTANT, id__lt=messages[0]["id"])
            .exclude(tool_calls__isnull=True)
            .order_by("-id")
            .values_list("id", "tool_calls")[:CALLS_LOOKBACK]
        )
        for message_id, tool_calls in earlier:
            for call in tool_calls or ():
                if isinstance(call, dict) and str(call.get("id")) in wanted:
                    calls.setdefault(str(call["id"]), (message_id, call))
    copy_id = session_id if owner[2] is not None else None
    scope_key = chat_session_scope_key(owner_id=owner[0], owner_session_key=owner[1], copy_id=copy_id)
    return StoredMessages(scope_key=scope_key, messages=messages, calls=calls)


def _next_request_subject(*, session_id: int) -> tuple[str, int, int | None, str] | None:
    """The session's mode, newest message id, first turn in flight and owner's scope key; None
    when it is gone or has no message."""
    session = (
        ChatSession.objects.filter(pk=session_id)
        .values_list("mode", "owner_id", "owner_session_key", "forked_at_message_id")
        .first()
    )
    if session is None:
        return None
    mode, owner_id, owner_session_key, forked_at = session
    last_id = Message.objects.filter(session_id=session_id).order_by("-id").values_list("id", flat=True).first()
    if last_id is None:
        return None
    copy_id = session_id if forked_at is not None else None
    scope_key = chat_session_scope_key(owner_id=owner_id, owner_session_key=owner_session_key, copy_id=copy_id)
    return mode, last_id, turns.turn_in_flight_first_id(session_id=session_id), scope_key


def memory_config(endpoint: Endpoint | None = None) -> MemoryConfig:
    """The memory engine's settings, read now (docs/configuration.md), for the chat model at
    ``endpoint`` (default: the configured one)."""
    endpoint = endpoint or chat_endpoint()
    return MemoryConfig(
        chat_model=endpoint.model,
        context_window=endpoint.context_window,
        calibrate=calibration_applies(endpoint),
        trigger_ratio=settings.MEMORY_TRIGGER_RATIO,
        target_ratio=settings.MEMORY_TARGET_RATIO,
        summary_max_tokens=settings.MEMORY_SUMMARY_MAX_TOKENS,
        summary_role=cast(Any, settings.MEMORY_SUMMARY_ROLE),  # validated by settings
        preserve_turns=settings.MEMORY_PRESERVE_TURNS,
        strict_alternation=settings.LLM_STRICT_ALTERNATION,
        facts_share=settings.MEMORY_FACTS_SHARE,
        facts_max_tokens=settings.MEMORY_FACTS_MAX_TOKENS,
        facts_min_tokens=settings.MEMORY_FACTS_MIN_TOKENS,
        recall_share=settings.MEMORY_RECALL_SHARE,
        recall_fill=settings.MEMORY_RECALL_FILL,
        summary_model=settings.LLM_SUMMARY_MODEL,
        summary_context_window=settings.LLM_SUMMARY_CONTEXT_WINDOW,
        failover_context_window=settings.LLM_FAILOVER_CONTEXT_WINDOW if settings.LLM_FAILOVER_MODEL else None,
        summary_attempts=settings.MEMORY_SUMMARY_ATTEMPTS,
        summary_timeout_seconds=settings.LLM_SUMMARY_TIMEOUT,
        compression=cast(Any, settings.MEMORY_COMPRESSION),
        sync_wait_seconds=settings.MEMORY_SYNC_WAIT_MS / 1000,
        precompress_tokens=settings.MEMORY_PRECOMPRESS_TOKENS,
        job_debounce_seconds=settings.MEMORY_JOB_DEBOUNCE_MS / 1000,
        job_lease_seconds=settings.MEMORY_JOB_LEASE_SECONDS,
        job_idle_seconds=settings.MEMORY_JOB_IDLE_SECONDS,
        job_batch_turns=settings.MEMORY_JOB_BATCH_TURNS,
        facts_extraction=bool(settings.MEMORY_FACTS_EXTRACTION),
        facts_scope=cast(Any, settings.MEMORY_FACTS_SCOPE),  # validated by settings
        recall_scope=cast(Any, settings.MEMORY_RECALL_SCOPE),
        recall_deadline_seconds=settings.MEMORY_RECALL_DEADLINE_MS / 1000,
        recall_cache_mb=settings.MEMORY_RECALL_CACHE_MB,
        unindexed_tools=UNINDEXED_TOOLS,
        empty_results=EMPTY_RESULTS,
    )


async def recall_cache_warm(session: ChatSession) -> None:
    """Read the chat owner's vectors into this worker's recall cache as a socket opens (logged, never raised); nothing
    to do, and no engine built, when recall has no embedder."""
    if embedder_choice().backend == "none":
        return
    try:
        await memory_engine().recall_warm(session_scope_key(session))
    except Exception:
        logger.exception("could not read the vectors of chat %s's owner ahead of its questions", session.pk)


@functools.cache
def durable_job_queue() -> DurableJobQueue:
    """This process's side of the durable queue (one, so its pending defers are held in one place)."""
    from chatapp.chats.job_queue import DurableJobQueue

    return DurableJobQueue(
        debounce_seconds=settings.MEMORY_JOB_DEBOUNCE_MS / 1000,
        idle_seconds=settings.MEMORY_JOB_IDLE_SECONDS,
        batch_turns=settings.MEMORY_JOB_BATCH_TURNS,
    )


def memory_engine(
    *,
    config: MemoryConfig | None = None,
    source: ConversationSource | None = None,
    run_sync: RunSync = orm_async,
    **options: Any,
) -> MemoryEngine:
    """The memory engine of the chat app: ``config`` (default :func:`memory_config`), chats as its
    conversations, the configured summarizers and embedder, ORM work through ``run_sync``.
    ``options`` go to :class:`MemoryEngine` (a replay's own ``compression_jobs``, another
    ``embedder``)."""
    primary, failover = summarizers_get()
    options.setdefault("embedder", embedder_configured())
    if settings.MEMORY_JOB_QUEUE == "procrastinate":
        options.setdefault("queue", durable_job_queue())
    return MemoryEngine(
        config=config or memory_config(),
        source=source or ChatConversations(run_sync=run_sync),
        summarizer=primary,
        failover=failover,
        run_sync=run_sync,
        **options,
    )
