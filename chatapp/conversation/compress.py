""" "Compress now", the inspector's one action: the memory engine run outside a turn, forced to
fold every message before the session's newest question into the summary."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from chatapp.chats import selectors
from chatapp.conversation import leases
from chatapp.conversation.agent import AGENT_PROMPT
from chatapp.conversation.quick_answer import QUICK_ANSWER_PROMPT
from chatapp.conversation.tools import TOOL_SCHEMAS
from chatapp.conversation.turn import memory_engine_build
from chatapp.llm.calibration import token_factor_get
from chatapp.llm.clients import chat_endpoint
from chatapp.models import ChatSession
from chatapp.realtime.broadcast import event_broadcast
from chatapp.realtime.protocol import MemoryCompressionEvent, MemorySummaryEvent
from memory.api import ContextRequest, KeyFact, key_fact_list_active


async def session_memory_compress(*, session_id: int) -> list[dict[str, Any]]:
    """Compress now (the inspector's one action): fold every message of session ``session_id``
    before its newest user message into the summary, with the live chat endpoint's memory engine
    and the session's mode (its system prompt and, in agent mode, tool schemas); returns the
    compression events recorded (``CompressionEvent.as_dict()``; empty when the session has no
    user message yet).

    Turns still running are never summarized (``summarize_below``, docs/memory.md F-26); interrupted
    turns are closed first and pin nothing. A failing summarizer degrades to the raw archive
    like in a turn. The session's sockets get one ``memory.compression`` per event and then
    ``memory.summary {summary}`` (both with ``turn_id`` None and ``step`` 0). Raises
    ``ChatSession.DoesNotExist``; database errors propagate. Called from an HTTP view, so its ORM
    calls go through plain ``sync_to_async`` (the request owns connection handling).
    """
    session = await sync_to_async(selectors.chat_session_get)(session_id=session_id)
    last_user_id = await sync_to_async(selectors.message_last_user_id)(session_id=session_id)
    if last_user_id is None:
        return []

    async def load_increment(boundary: int | None) -> list[dict[str, Any]]:
        return await sync_to_async(selectors.message_list_for_context)(
            session_id=session_id, boundary=boundary, turn_message_id=last_user_id
        )

    memory_key = ChatSession.memory_key_for(session_id)

    async def load_facts() -> list[KeyFact]:
        return await sync_to_async(key_fact_list_active)(memory_key=memory_key)

    agent = session.mode == ChatSession.Mode.AGENT
    await sync_to_async(leases.turns_interrupted_close)(session_id=session_id)
    summarize_below = await sync_to_async(leases.turn_in_flight_first_id)(session_id=session_id)
    request = ContextRequest(
        memory_key=memory_key,
        system_prompt=AGENT_PROMPT if agent else QUICK_ANSWER_PROMPT,
        load_increment=load_increment,
        load_facts=load_facts,
        mode=session.mode,  # type: ignore[arg-type]  # ChatSession.Mode values are the engine's modes
        tools=TOOL_SCHEMAS if agent else None,
        summarize_below=summarize_below,
        force=True,
    )
    endpoint = chat_endpoint()
    # The budget of the session's next request, calibration included (docs/memory.md §5).
    token_factor = await sync_to_async(token_factor_get)(endpoint=endpoint)
    context = await memory_engine_build(endpoint, token_factor=token_factor).build_context(request)
    for event in context.events:
        await event_broadcast(session_id, MemoryCompressionEvent(turn_id=None, step=0, event=event))
    await event_broadcast(session_id, MemorySummaryEvent(turn_id=None, step=0, summary=context.summary.as_dict()))
    return context.events
