""" "Compress now", the inspector's one action: the memory engine run outside a turn, forced to
fold every message before the session's newest question into the summary."""

from __future__ import annotations

from asgiref.sync import sync_to_async

from chatapp.chats import selectors, turns
from chatapp.chats.memory import memory_engine, memory_key_of, session_scope_key
from chatapp.conversation import leases
from chatapp.llm.prompts import AGENT_PROMPT, QUICK_ANSWER_PROMPT, TOOL_SCHEMAS
from chatapp.models import ChatSession
from memory.api import CompressionRecord, ContextRequest, Message, Notice


async def session_memory_compress(*, session_id: int) -> list[CompressionRecord]:
    """Fold every message before the newest user message into the summary (never a running turn, F-26) and
    tell the sockets; returns the compression events. Raises ``ChatSession.DoesNotExist``."""
    session = await sync_to_async(selectors.chat_session_get)(session_id=session_id)
    last_user_id = await sync_to_async(selectors.message_last_user_id)(session_id=session_id)
    if last_user_id is None:
        return []

    async def load_increment(boundary: int | None) -> list[Message]:
        rows: list[Message] = await sync_to_async(selectors.message_list_for_context)(
            session_id=session_id, boundary=boundary, turn_message_id=last_user_id
        )
        return rows

    agent = session.mode == ChatSession.Mode.AGENT
    await sync_to_async(leases.turns_interrupted_close)(session_id=session_id)
    memory_key = memory_key_of(session_id)
    request = ContextRequest(
        memory_key=memory_key,
        system_prompt=AGENT_PROMPT if agent else QUICK_ANSWER_PROMPT,
        load_increment=load_increment,
        mode="agent" if agent else "quick-answer",
        tools=TOOL_SCHEMAS if agent else None,
        summarize_below=await sync_to_async(turns.turn_in_flight_first_id)(session_id=session_id),
        force=True,
        scope_key=session_scope_key(session),
    )
    # An HTTP view's work: on the request's own connection, like the reads above.
    engine = memory_engine(run_sync=sync_to_async)
    context = await engine.context(request)
    await engine.source.notify(memory_key, Notice(compressions=context.events, summary=context.summary))
    return context.events
