"""OpenAI-compatible endpoints, their ``AsyncOpenAI`` clients and the streaming chat call (docs/memory.md §6). An
empty base URL is the in-process offline engine; clients never retry (docs/memory.md §4); every endpoint failure
is raised as :class:`LLMError`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

import httpx2
import openai
from django.conf import settings

from chatapp.llm.limits import server_slot
from chatapp.llm.offline.transport import OFFLINE_BASE_URL, OfflineTransport
from memory.api import to_wire

logger = logging.getLogger(__name__)

LLMErrorKind = Literal["connection", "timeout", "rate_limit", "server", "status", "malformed", "empty"]


class LLMError(Exception):
    """An endpoint gave no usable reply: ``message`` is one sentence naming the endpoint; ``kind``: ``rate_limit``
    is HTTP 429, ``server`` 5xx or a stream's error event, ``status`` other HTTP errors, ``empty`` no text or calls."""

    def __init__(self, message: str, kind: LLMErrorKind) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """One endpoint and model; an empty ``base_url`` is the offline engine. ``context_window``: input tokens;
    ``timeout``: seconds to connect and per read (in a stream, between chunks)."""

    base_url: str
    api_key: str = field(repr=False)
    model: str
    context_window: int
    timeout: float

    @property
    def offline(self) -> bool:
        return not self.base_url

    @property
    def label(self) -> str:
        return "The offline engine" if self.offline else f"The model endpoint at {self.base_url}"


def chat_endpoint() -> Endpoint:
    """The chat model, from the ``LLM_CHAT_*`` settings."""
    return Endpoint(
        base_url=settings.LLM_CHAT_BASE_URL,
        api_key=settings.LLM_CHAT_API_KEY,
        model=settings.LLM_CHAT_MODEL,
        context_window=settings.LLM_CHAT_CONTEXT_WINDOW,
        timeout=settings.LLM_CHAT_TIMEOUT,
    )


def summary_endpoint() -> Endpoint:
    """The primary summarizer model, from the ``LLM_SUMMARY_*`` settings."""
    return Endpoint(
        base_url=settings.LLM_SUMMARY_BASE_URL,
        api_key=settings.LLM_SUMMARY_API_KEY,
        model=settings.LLM_SUMMARY_MODEL,
        context_window=settings.LLM_SUMMARY_CONTEXT_WINDOW,
        timeout=settings.LLM_SUMMARY_TIMEOUT,
    )


def failover_endpoint() -> Endpoint | None:
    """The failover summarizer, or None without ``LLM_FAILOVER_MODEL``; by default on the summary endpoint's server."""
    if not settings.LLM_FAILOVER_MODEL:
        return None
    return Endpoint(
        base_url=settings.LLM_FAILOVER_BASE_URL or settings.LLM_SUMMARY_BASE_URL,
        api_key=settings.LLM_FAILOVER_API_KEY,
        model=settings.LLM_FAILOVER_MODEL,
        context_window=settings.LLM_FAILOVER_CONTEXT_WINDOW,
        timeout=settings.LLM_SUMMARY_TIMEOUT,
    )


def make_client(endpoint: Endpoint) -> openai.AsyncOpenAI:
    """A new client without retries, offline through :class:`OfflineTransport`; :func:`get_client` reuses them."""
    http_client = httpx2.AsyncClient(transport=OfflineTransport()) if endpoint.offline else None
    return openai.AsyncOpenAI(
        base_url=endpoint.base_url or OFFLINE_BASE_URL,
        # Keyless local servers (Ollama, llama.cpp) ignore the key, but the SDK insists on one.
        api_key=endpoint.api_key or "no-key",
        timeout=endpoint.timeout,
        max_retries=0,
        http_client=http_client,
    )


# A client's connection pool belongs to the event loop that opened it: one cache per loop.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Endpoint, openai.AsyncOpenAI]] = (
    weakref.WeakKeyDictionary()
)


def get_client(endpoint: Endpoint) -> openai.AsyncOpenAI:
    """The cached client of ``endpoint`` for the running event loop."""
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    if endpoint not in per_loop:
        per_loop[endpoint] = make_client(endpoint)
    return per_loop[endpoint]


@contextlib.contextmanager
def translated_errors(endpoint: Endpoint) -> Iterator[None]:
    """Re-raise the SDK's errors and undecodable bodies as :class:`LLMError`, each message one sentence."""
    try:
        yield
    except openai.APITimeoutError as exc:
        raise LLMError(_sentence(f"{endpoint.label} did not answer within {endpoint.timeout:g} s"), "timeout") from exc
    except openai.APIConnectionError as exc:
        raise LLMError(_connection_message(endpoint, exc), "connection") from exc
    except openai.RateLimitError as exc:
        message = f"{endpoint.label} is rate limiting requests (HTTP 429): {_detail(exc)}"
        raise LLMError(_sentence(message), "rate_limit") from exc
    except openai.APIStatusError as exc:
        kind: LLMErrorKind = "server" if exc.status_code >= 500 else "status"
        raise LLMError(_sentence(f"{endpoint.label} failed with HTTP {exc.status_code}: {_detail(exc)}"), kind) from exc
    except openai.APIError as exc:
        raise LLMError(_sentence(f"{endpoint.label} reported an error: {_detail(exc)}"), "server") from exc
    except json.JSONDecodeError as exc:
        message = f"{endpoint.label} sent a response that is not valid JSON ({exc.msg})"
        raise LLMError(_sentence(message), "malformed") from exc


def _causes(exc: BaseException | None) -> list[BaseException]:
    """``exc`` and what it was raised from, outermost first (at most ten)."""
    causes: list[BaseException] = []
    while exc is not None and len(causes) < 10:
        causes.append(exc)
        exc = exc.__cause__ or exc.__context__
    return causes


def _caused_by(exc: BaseException | None, kind: type[BaseException]) -> bool:
    return any(isinstance(cause, kind) for cause in _causes(exc))


def _connection_message(endpoint: Endpoint, exc: openai.APIConnectionError) -> str:
    # The HTTP stack wraps the OS error several times ("All connection attempts failed").
    causes = _causes(exc.__cause__)
    if any(isinstance(cause, ConnectionRefusedError) for cause in causes):
        return f"{endpoint.label} refused the connection (is the server running?)."
    detail = str(causes[-1]).strip() if causes else ""
    return _sentence(f"{endpoint.label} could not be reached: {detail or type(exc).__name__}")


def _sentence(text: str) -> str:
    """``text`` ending in exactly one full stop, or as is after ``?`` or ``!`` (provider texts vary)."""
    text = text.rstrip()
    if text.endswith(("?", "!")):
        return text
    return text.rstrip(". ") + "."


def _detail(exc: openai.APIError) -> str:
    """The provider's own error message, at most 300 characters."""
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str) and message.strip():
            return message.strip()[:300]
    return exc.message[:300]


class DeltaEvent(TypedDict):
    type: Literal["delta"]
    text: str


class ToolCallsEvent(TypedDict):
    type: Literal["tool_calls"]
    tool_calls: list[dict[str, Any]]


class UsageEvent(TypedDict):
    type: Literal["usage"]
    prompt_tokens: int | None  # None: the server sent usage without this figure
    completion_tokens: int | None
    # Why both figures are None: "not reported" (asked for, none came) or "not asked" (the
    # endpoint refused ``stream_options``). Absent when the server reported usage.
    missing: NotRequired[str]


class FinishEvent(TypedDict):
    type: Literal["finish"]
    finish_reason: str | None


ChatEvent = DeltaEvent | ToolCallsEvent | UsageEvent | FinishEvent


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``messages`` with only the Chat Completions keys: stored extras (``id``) never go on the wire."""
    return [to_wire(message) for message in messages]


async def chat_stream(
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    endpoint: Endpoint | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
) -> AsyncGenerator[ChatEvent, None]:
    """Stream one chat completion as typed events: ``delta`` pieces as they arrive, then ``tool_calls`` (whole
    calls), ``usage`` (None figures and ``missing`` when unreported) and ``finish``. A request shape the endpoint
    refuses is changed and kept changed for it (:func:`_stream_open_adapted`); the whole stream holds a slot of its
    server (:func:`server_slot`). Raises :class:`LLMError` on failure, also after deltas: ``empty`` for no text
    nor calls, ``connection`` for a stream lost before its first chunk or ended without a finish reason."""
    endpoint = endpoint or chat_endpoint()
    async with server_slot(endpoint.base_url):
        async for event in _chat_events(messages, tools, endpoint, max_tokens, temperature):
            yield event


async def _chat_events(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    endpoint: Endpoint,
    max_tokens: int | None,
    temperature: float | None,
) -> AsyncIterator[ChatEvent]:
    """:func:`chat_stream` once its slot is held."""
    client = get_client(endpoint)
    body: dict[str, Any] = {
        "model": endpoint.model,
        "messages": wire_messages(messages),
        "stream": True,
        "max_tokens": max_tokens or settings.LLM_CHAT_MAX_OUTPUT_TOKENS,
    }
    # Usage of a stream is sent only when asked for (docs/memory.md §5, "Calibration").
    ask_usage = _asks_usage(endpoint)
    if ask_usage:
        body["stream_options"] = {"include_usage": True}
    if temperature is not None:
        body["temperature"] = temperature
    if tools:  # some OpenAI-compatible servers reject an empty "tools" list: leave the key out
        body["tools"] = tools
        # llama.cpp's server ignores tools unless a tool choice is given.
        body["tool_choice"] = "auto"
    if NULL_CONTENT in refused_shapes(endpoint):
        _call_content_emptied(body)
    if tools and STREAMED_TOOLS in refused_shapes(endpoint):
        async for event in _completion_events(client, body, endpoint):
            yield event
        return
    stream = await _stream_open_adapted(client, body, endpoint)
    assembler = _ToolCallAssembler()
    usage: UsageEvent | None = None
    finish_reason: str | None = None
    has_text = False
    chunks = 0
    async with stream:
        while (chunk := await _next_chunk(stream, endpoint, first=not chunks)) is not None:
            chunks += 1
            if not isinstance(chunk, dict):
                continue
            reported = chunk.get("usage")
            if isinstance(reported, dict):
                usage = UsageEvent(
                    type="usage",
                    prompt_tokens=_token_figure(reported.get("prompt_tokens")),
                    completion_tokens=_token_figure(reported.get("completion_tokens")),
                )
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                finish_reason = choice.get("finish_reason") or finish_reason
                delta = choice.get("delta")
                if not isinstance(delta, dict):
                    delta = {}
                assembler.add(delta.get("tool_calls") or ())
                content = delta.get("content")
                if content and isinstance(content, str):
                    has_text = True
                    yield {"type": "delta", "text": content}
    tool_calls = assembler.tool_calls()
    if not chunks:
        # Headers, then the connection ended: a server that stopped or crashed, not a model's reply.
        raise LLMError(f"{endpoint.label} closed the connection before the first token.", "connection")
    if finish_reason is None:
        # llama.cpp's server ends a running stream this way when another request arrives.
        raise LLMError(
            f"{endpoint.label} ended the stream before the reply was finished (no finish reason); a server that "
            "serves one request at a time does so when another request arrives.",
            "connection",
        )
    if not has_text and not tool_calls:
        if tools:
            # Some servers stream nothing for a request with tools but answer it whole: asked once more so.
            async for event in _completion_events(client, body, endpoint):
                yield event
            shape_refused(endpoint, STREAMED_TOOLS)
            return
        raise LLMError(f"{endpoint.label} returned an empty reply from model {endpoint.model}.", "empty")
    if tool_calls:
        yield {"type": "tool_calls", "tool_calls": tool_calls}
    if usage is None:
        missing = "not reported" if "stream_options" in body else "not asked"
        usage = UsageEvent(type="usage", prompt_tokens=None, completion_tokens=None, missing=missing)
    yield usage
    yield {"type": "finish", "finish_reason": finish_reason}


# Request shapes an endpoint may refuse, each learnt per (base URL, model) from a refusal.
STREAM_OPTIONS = "stream_options"  # sent without ``stream_options`` (no usage asked)
NULL_CONTENT = "null_content"  # assistant tool-call messages sent with ``content: ""``, not null
JSON_SCHEMA = "json_schema"  # ``response_format`` of that type not sent
JSON_OBJECT = "json_object"
STREAMED_TOOLS = "streamed_tools"  # a request with tools sent without streaming: its stream came empty

# What each endpoint (base URL, model) refused in this process.
_REFUSED: dict[tuple[str, str], set[str]] = {}


def refused_shapes(endpoint: Endpoint) -> frozenset[str]:
    """The request shapes (``STREAM_OPTIONS``, ``NULL_CONTENT``, ``JSON_SCHEMA``, ``JSON_OBJECT``, ``STREAMED_TOOLS``)
    ``endpoint`` refused in this process, which its requests avoid from then on."""
    return frozenset(_REFUSED.get((endpoint.base_url, endpoint.model), ()))


def shape_refused(endpoint: Endpoint, shape: str) -> None:
    """Remember that ``endpoint`` refused ``shape`` (only once a changed request worked)."""
    _REFUSED.setdefault((endpoint.base_url, endpoint.model), set()).add(shape)
    logger.info("%s (model %s) refused %s: avoided from now on", endpoint.label, endpoint.model, shape)


def refused_shapes_forget() -> None:
    """Forget every endpoint's refusals (tests: a port may serve another server later)."""
    _REFUSED.clear()


def refusal_names(exc: LLMError, *words: str) -> bool:
    """Whether ``exc`` is an HTTP 4xx/5xx answer (not 429) whose error text names one of ``words``
    (case-insensitive): llama.cpp's server refuses a shape it cannot handle with HTTP 500."""
    cause = exc.__cause__
    if not (isinstance(cause, openai.APIStatusError) and cause.status_code >= 400 and cause.status_code != 429):
        return False
    text = _detail(cause).lower()
    return any(word.lower() in text for word in words)


def _asks_usage(endpoint: Endpoint) -> bool:
    return STREAM_OPTIONS not in refused_shapes(endpoint)


def _rejects_request(exc: LLMError) -> bool:
    """Whether the endpoint refused the request itself (HTTP 400 or 422); one retry without the option is cheap."""
    cause = exc.__cause__
    return isinstance(cause, openai.APIStatusError) and cause.status_code in (400, 422)


async def _stream_open_adapted(
    client: openai.AsyncOpenAI, body: dict[str, Any], endpoint: Endpoint
) -> openai.AsyncStream[object]:
    """:func:`_stream_open`, changing ``body`` (in place) once per shape the endpoint refuses:
    ``content: ""`` for a refusal naming content or null, no ``stream_options`` for a 400/422 or
    any refusal naming it. What a request that then worked avoided is remembered."""
    avoided: list[str] = []
    while True:
        try:
            stream = await _stream_open(client, body, endpoint)
        except LLMError as exc:
            if _has_null_call_content(body) and refusal_names(exc, "content", "null", "nonetype"):
                _call_content_emptied(body)
                avoided.append(NULL_CONTENT)
            elif "stream_options" in body and (_rejects_request(exc) or refusal_names(exc, "stream_options")):
                del body["stream_options"]
                avoided.append(STREAM_OPTIONS)
            else:
                raise
            continue
        for shape in avoided:
            shape_refused(endpoint, shape)
        return stream


def _has_null_call_content(body: dict[str, Any]) -> bool:
    return any(message.get("tool_calls") and message.get("content") is None for message in body["messages"])


def _call_content_emptied(body: dict[str, Any]) -> None:
    """``content: ""`` instead of null in the assistant tool-call messages of ``body``."""
    body["messages"] = [
        {**message, "content": ""} if message.get("tool_calls") and message.get("content") is None else message
        for message in body["messages"]
    ]


async def _stream_open(
    client: openai.AsyncOpenAI, body: dict[str, Any], endpoint: Endpoint
) -> openai.AsyncStream[object]:
    with translated_errors(endpoint):
        # The SDK's generic request, not ``chat.completions.create``: same client and errors, but no type transforms
        # of the request and no model object per chunk, both costly in CPU. Chunks arrive as the server's JSON objects.
        return await client.post(
            "/chat/completions", cast_to=object, body=body, stream=True, stream_cls=openai.AsyncStream[object]
        )


async def _completion_events(
    client: openai.AsyncOpenAI, body: dict[str, Any], endpoint: Endpoint
) -> AsyncIterator[ChatEvent]:
    """``body`` sent without streaming, its reply as :func:`chat_stream`'s events (the text in one ``delta``).
    Raises :class:`LLMError`: ``malformed`` for a body that is not a completion, ``empty`` for no text nor calls."""
    plain = {key: value for key, value in body.items() if key not in ("stream", "stream_options")}
    with translated_errors(endpoint):
        reply = await client.post("/chat/completions", cast_to=object, body=plain)
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(reply, dict) or not isinstance(choices, list):
        raise LLMError(f"{endpoint.label} sent a response that is not a chat completion.", "malformed")
    choice: dict[str, Any] = choices[0] if choices and isinstance(choices[0], dict) else {}
    message: dict[str, Any] = choice["message"] if isinstance(choice.get("message"), dict) else {}
    assembler = _ToolCallAssembler()
    calls: list[Any] = message["tool_calls"] if isinstance(message.get("tool_calls"), list) else []
    assembler.add([{**call, "index": index} for index, call in enumerate(calls) if isinstance(call, dict)])
    tool_calls = assembler.tool_calls()
    text = message["content"] if isinstance(message.get("content"), str) else ""
    if not text and not tool_calls:
        raise LLMError(f"{endpoint.label} returned an empty reply from model {endpoint.model}.", "empty")
    if text:
        yield {"type": "delta", "text": text}
    if tool_calls:
        yield {"type": "tool_calls", "tool_calls": tool_calls}
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else None
    if usage is None:
        yield UsageEvent(type="usage", prompt_tokens=None, completion_tokens=None, missing="not reported")
    else:
        yield UsageEvent(
            type="usage",
            prompt_tokens=_token_figure(usage.get("prompt_tokens")),
            completion_tokens=_token_figure(usage.get("completion_tokens")),
        )
    yield {"type": "finish", "finish_reason": choice.get("finish_reason")}


def _token_figure(value: object) -> int | None:
    """A token count from a server's ``usage`` object: a whole number, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def _next_chunk(stream: openai.AsyncStream[object], endpoint: Endpoint, *, first: bool = False) -> object | None:
    """The next chunk, or None; translated here, not around the loop, so errors thrown into ``yield`` keep theirs.
    ``first``: no chunk came yet, so a lost connection is named as lost before the first token."""
    try:
        with translated_errors(endpoint):
            try:
                return await stream.__anext__()
            except StopAsyncIteration:
                return None
    except LLMError as exc:
        if not (first and exc.kind == "connection"):
            raise
        how = "reset" if _caused_by(exc.__cause__, ConnectionResetError) else "closed"
        raise LLMError(
            f"{endpoint.label} {how} the connection before the first token.", "connection"
        ) from exc.__cause__


class _ToolCallAssembler:
    """Joins streamed ``tool_calls`` deltas (keyed by their ``index``) into whole calls."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, str]] = {}

    def add(self, deltas: Any) -> None:
        for delta in deltas if isinstance(deltas, list | tuple) else ():
            if not isinstance(delta, dict):
                continue
            call = self._calls.setdefault(delta.get("index") or 0, {"id": "", "name": "", "arguments": ""})
            call["id"] = call["id"] or str(delta.get("id") or "")
            function = delta.get("function")
            if isinstance(function, dict):
                # The name arrives whole in one delta; some servers repeat it in later deltas.
                call["name"] = call["name"] or str(function.get("name") or "")
                call["arguments"] += str(function.get("arguments") or "")

    def tool_calls(self) -> list[dict[str, Any]]:
        """OpenAI-format calls in index order; a missing id gets a unique one (results pair by id, F-05)."""
        return [
            {
                "id": call["id"] or f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]},
            }
            for _, call in sorted(self._calls.items())
        ]
