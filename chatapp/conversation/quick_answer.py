"""Quick-answer mode (docs/memory.md §7): knowledge-base passages within a share of the budget in the system
prompt, one context, one streamed model call."""

from __future__ import annotations

from django.conf import settings

from chatapp.chats import selectors
from chatapp.conversation.turn import ModelCallFailed, Turn, TurnStopped
from chatapp.kb.search import Passage, kb_search, passages_fit, passages_format
from chatapp.llm.prompts import NO_PASSAGES, system_prompt_with
from chatapp.models import Message
from chatapp.orm_threads import orm_async
from chatapp.realtime.protocol import ChatRetrievalEvent


def quick_answer_system_prompt(passages: list[Passage]) -> str:
    """The instructions, then the passages as ``[n] title`` blocks, or a note that none matched."""
    return system_prompt_with(passages_format(passages) if passages else NO_PASSAGES)


def _question_search(*, message_id: int, question: str | None = None) -> list[Passage]:
    """Passages for ``question`` (read from the message when None), in one trip to the database thread."""
    if question is None:
        question = selectors.message_content_get(message_id=message_id)
    return kb_search(question, settings.QUICK_ANSWER_PASSAGES)


async def quick_answer_run(turn: Turn) -> Message:
    """Answer in one model call; returns the stored final message (``complete``, ``stopped`` or ``error``)."""
    found = await orm_async(_question_search)(message_id=turn.user_message_id, question=turn.question)
    passages = passages_fit(found, budget_tokens=turn.passages_max_tokens, counter=turn.engine.counter)
    await turn.emit(
        ChatRetrievalEvent(
            turn_id=turn.user_message_id,
            passages=[{key: value for key, value in p.as_dict().items() if key != "text"} for p in passages],
        )
    )
    ctx = await turn.engine.context(await turn.context_request(system_prompt=quick_answer_system_prompt(passages)))
    if ctx.overflow:
        return await turn.overflow(ctx, step=1)
    try:
        reply = await turn.model_call(ctx, step=1, tools=None)
    except TurnStopped as stopped:
        return await turn.stopped(stopped.partial.text, step=1)
    except ModelCallFailed as failure:
        return await turn.fail(failure, step=1)
    return await turn.answered(reply, step=1)
