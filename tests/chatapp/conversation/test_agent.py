"""The agent loop with a scripted chat model: step limit, tool errors, parallel calls, stopping
mid-step, and the memory middleware before every model call."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chatapp.chats.memory import memory_engine
from chatapp.conversation import agent
from chatapp.conversation.runner import chat_turn_run, chat_turn_stop
from chatapp.conversation.tools import tool_call_execute
from chatapp.conversation.turn import Turn
from chatapp.models import ChatSession, Message, ModelCall
from tests.chatapp.conftest import chat_session_make, message_make

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("offline_engine", "demo_kb", "db_connections_closed"),
]

Script = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], dict[str, Any]]
# The ``model`` fixture: install a script, get the list of requests it will receive.
Model = Callable[[Script], list[dict[str, Any]]]


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.fixture
def model(monkeypatch) -> Model:
    """Replace the chat model by ``script(messages, tools) -> {"text"?, "tool_calls"?}``; returns
    the list of requests it received (``{"messages", "tools"}``)."""
    requests: list[dict[str, Any]] = []

    def install(script: Script) -> list[dict[str, Any]]:
        async def fake_stream(messages, *, tools=None, endpoint=None) -> AsyncIterator[dict[str, Any]]:
            requests.append({"messages": messages, "tools": tools})
            reply = script(messages, tools)
            if reply.get("text"):
                yield {"type": "delta", "text": reply["text"]}
            if reply.get("tool_calls"):
                yield {"type": "tool_calls", "tool_calls": reply["tool_calls"]}
            yield {"type": "usage", "prompt_tokens": 100, "completion_tokens": 10}
            yield {"type": "finish", "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop"}

        monkeypatch.setattr("chatapp.conversation.turn.chat_stream", fake_stream)
        return requests

    return install


async def start_turn(owner, text: str) -> tuple[ChatSession, Message]:
    session = await sync_to_async(chat_session_make)(owner.owner, mode=ChatSession.Mode.AGENT)
    user = await sync_to_async(message_make)(session, "user", text)
    return session, user


async def replies(user: Message) -> list[Message]:
    return [m async for m in Message.objects.filter(reply_to=user).order_by("id")]


async def test_step_limit_ends_with_a_final_answer_offered_no_tools(alice, model: Model, settings):
    settings.AGENT_MAX_STEPS = 3
    counter = iter(range(100))
    requests = model(
        lambda messages, tools: (
            {"tool_calls": [call(f"c{next(counter)}", "calculator", '{"expression": "1+1"}')]}
            if tools
            else {"text": "final answer"}
        )
    )
    session, user = await start_turn(alice, "keep calculating")

    final = await chat_turn_run(session_id=session.pk, user_message_id=user.pk)

    assert [r["tools"] is not None for r in requests] == [True, True, False]
    assert final.status == Message.Status.COMPLETE and final.content == "final answer"
    stored = await replies(user)
    assert [(m.role, bool(m.tool_calls)) for m in stored] == [
        ("assistant", True),
        ("tool", False),
        ("assistant", True),
        ("tool", False),
        ("assistant", False),
    ]
    assert [m.content for m in stored if m.role == "tool"] == ["2", "2"]
    calls = [c async for c in ModelCall.objects.filter(session=session).order_by("step")]
    assert [c.step for c in calls] == [1, 2, 3]
    assert calls[2].context["sections"]["tools"] == 0 and calls[0].context["sections"]["tools"] > 0
    # Each call's usage is stored with the message it produced (a tool-calling one, or the final reply).
    assert [(c.prompt_tokens, c.completion_tokens) for c in calls] == [(100, 10)] * 3
    assert [c.finish_reason for c in calls] == ["tool_calls", "tool_calls", "stop"]


async def test_model_still_calling_tools_at_the_limit_is_an_error_without_a_dangling_call(
    alice, model: Model, settings
):
    settings.AGENT_MAX_STEPS = 2
    model(
        lambda messages, tools: {
            "text": "let me check",
            "tool_calls": [call(f"c{len(messages)}", "kb_search", '{"query": "plans"}')],
        }
    )
    session, user = await start_turn(alice, "loop forever")

    final = await chat_turn_run(session_id=session.pk, user_message_id=user.pk)

    assert final.status == Message.Status.ERROR and final.tool_calls is None
    assert final.content is not None and final.content.startswith("let me check")
    assert "no final answer within 2 model calls" in final.content
    stored = await replies(user)
    assert [(m.role, bool(m.tool_calls)) for m in stored] == [
        ("assistant", True),
        ("tool", False),
        ("assistant", False),
    ]


async def test_tool_errors_become_results_and_parallel_calls_each_get_one(alice, model: Model):
    batch = [
        call("a", "calculator", json.dumps({"expression": "__import__('os').system('echo hi')"})),
        call("b", "calculator", json.dumps({"expression": "2 ** 10"})),
        call("c", "rm_rf", "{}"),
        call("d", "kb_search", "{not json"),
        call("e", "calculator", json.dumps({"expression": "1/0"})),
        call("f", "kb_search", json.dumps({"query": "KS-207"})),
    ]
    model(lambda messages, tools: {"tool_calls": batch} if messages[-1]["role"] == "user" else {"text": "done"})
    session, user = await start_turn(alice, "do several things")

    final = await chat_turn_run(session_id=session.pk, user_message_id=user.pk)

    assert final.status == Message.Status.COMPLETE and final.content == "done"
    stored = await replies(user)
    results = {m.tool_call_id: m.content or "" for m in stored if m.role == "tool"}
    assert list(results) == ["a", "b", "c", "d", "e", "f"]
    assert results["a"].startswith("error: Call is not allowed")
    assert results["b"] == "1024"
    assert results["c"].startswith("error: unknown tool 'rm_rf'")
    assert results["d"].startswith("error: arguments are not valid JSON")
    assert results["e"] == "error: division by zero"
    assert "conflicted copy" in results["f"]


async def test_memory_runs_before_every_model_call_and_sees_the_previous_steps(alice, model: Model):
    requests = model(
        lambda messages, tools: (
            {"tool_calls": [call("k1", "kb_search", '{"query": "trash retention"}')]}
            if messages[-1]["role"] == "user"
            else {"text": "Deleted files stay 30 days."}
        )
    )
    session, user = await start_turn(alice, "How long do deleted files stay?")

    await chat_turn_run(session_id=session.pk, user_message_id=user.pk)

    calls = [c async for c in ModelCall.objects.filter(session=session).order_by("step")]
    assert len(calls) == len(requests) == 2
    # Each request is exactly the context the engine built before that call.
    assert [c.context["messages"] for c in calls] == [r["messages"] for r in requests]
    assert [m["role"] for m in requests[1]["messages"]] == ["system", "user", "assistant", "tool"]
    assert [s["kind"] for s in calls[1].context["sources"]] == ["system", "current", "current", "current"]


async def test_stop_during_tool_execution_keeps_the_tool_group_complete(alice, model: Model, monkeypatch):
    model(
        lambda messages, tools: {
            "tool_calls": [
                call("x", "calculator", '{"expression": "6*7"}'),
                call("y", "calculator", '{"expression": "1+2"}'),
            ]
        }
    )
    session, user = await start_turn(alice, "two sums please")
    real_execute = tool_call_execute

    async def execute_then_stop(tool_call, **kwargs):
        chat_turn_stop(session_id=session.pk)
        return await real_execute(tool_call, **kwargs)

    monkeypatch.setattr(agent, "tool_call_execute", execute_then_stop)

    final = await chat_turn_run(session_id=session.pk, user_message_id=user.pk)

    assert final.status == Message.Status.STOPPED
    stored = await replies(user)
    assert [(m.role, m.tool_call_id, m.content) for m in stored[1:]] == [
        ("tool", "x", "42"),
        ("tool", "y", agent.STOPPED_TOOL_RESULT),
        ("assistant", "", "[stopped by the user]"),
    ]


async def test_a_model_calls_usage_waits_for_its_message_and_is_never_overwritten_by_the_next_call(alice, model: Model):
    model(lambda messages, tools: {"text": "an answer"})
    session, user = await start_turn(alice, "what is 2+2?")
    turn = Turn(
        session_id=session.pk, user_message_id=user.pk, mode="agent", engine=memory_engine(), question="", scope_key="x"
    )
    ctx = await turn.engine.context(await turn.context_request(system_prompt="be brief"))

    await turn.model_call(ctx, step=1, tools=None)
    first = await ModelCall.objects.aget(session=session, step=1)
    assert first.prompt_tokens is None  # not yet: it is stored with the message the call produced

    # A second call before any message is stored: the first call's usage is saved on its own.
    await turn.model_call(ctx, step=2, tools=None)
    await turn.store(role=Message.Role.ASSISTANT, content="an answer", step=2)

    calls = [c async for c in ModelCall.objects.filter(session=session).order_by("step")]
    assert [(c.step, c.prompt_tokens, c.completion_tokens, c.finish_reason) for c in calls] == [
        (1, 100, 10, "stop"),
        (2, 100, 10, "stop"),
    ]
