"""Agent mode (docs/memory.md §7): model call, tool calls, tool results, again, the memory engine before each call;
the last of ``AGENT_MAX_STEPS`` calls is offered no tools, so it must answer."""

from __future__ import annotations

from django.conf import settings

from chatapp.conversation.tools import tool_call_execute
from chatapp.conversation.turn import ModelCallFailed, Turn, TurnStopped
from chatapp.llm.prompts import AGENT_PROMPT, TOOL_SCHEMAS
from chatapp.models import Message
from chatapp.realtime.protocol import AGENT_STEP_LIMIT

STOPPED_TOOL_RESULT = "error: not run, the user stopped the turn"


async def agent_turn_run(turn: Turn) -> Message:
    """Run the agent loop; returns the stored final assistant message (``complete``, ``stopped`` or ``error``).
    Each step stores the tool-call message and one result per call (errors as ``error:`` results), so a stored
    tool group is always complete, even when stopped mid-step."""
    max_steps = settings.AGENT_MAX_STEPS
    for step in range(1, max_steps + 1):
        if turn.stop_requested():
            return await turn.stopped("", step=step)
        last_step = step == max_steps
        # The estimate must match what is sent: the last step carries no tool schemas.
        tools = None if last_step else TOOL_SCHEMAS
        ctx = await turn.engine.before_model(await turn.context_request(system_prompt=AGENT_PROMPT, tools=tools))
        if ctx.overflow:
            return await turn.overflow(ctx, step=step)
        try:
            reply = await turn.model_call(ctx, step=step, tools=tools)
        except TurnStopped as stopped:
            return await turn.stopped(stopped.partial.text, step=step)
        except ModelCallFailed as failure:
            return await turn.fail(failure, step=step)
        if not reply.tool_calls:
            return await turn.answered(reply, step=step)
        if last_step:
            note = f"[Stopped: no final answer within {max_steps} model calls.]"
            return await turn.finish(
                content=f"{reply.text}\n\n{note}" if reply.text else note,
                status=Message.Status.ERROR,
                step=step,
                error=(
                    AGENT_STEP_LIMIT,
                    f"The agent reached its limit of {max_steps} model calls without a final answer.",
                ),
            )
        await turn.store(
            role=Message.Role.ASSISTANT, content=reply.text or None, tool_calls=reply.tool_calls, step=step
        )
        for call in reply.tool_calls:
            if turn.stop_requested():
                result = STOPPED_TOOL_RESULT
            else:
                result = await tool_call_execute(
                    call, passages_max_tokens=turn.passages_max_tokens, counter=turn.engine.counter
                )
            name = (call.get("function") or {}).get("name") or ""
            await turn.store(role=Message.Role.TOOL, content=result, tool_call_id=call["id"], name=name[:64], step=step)
    raise AssertionError("unreachable: the last step always returns")
