"""A scripted OpenAI-compatible HTTP server for tests, on 127.0.0.1 with an ephemeral port.

Each test scripts the replies (:meth:`FakeOpenAI.script`): JSON completions, SSE streams (text and
``tool_calls`` deltas), HTTP errors, slow replies, empty content, malformed bodies, and replies
cut off at the output cap (``finish_reason: "length"``), streamed or not, and ``/v1/embeddings``
replies (:func:`embeddings`). Every request is
recorded, so a test can assert exactly how many HTTP requests a client made. It runs in a thread
(stdlib ``http.server``) and really speaks HTTP, so clients exercise their real network stack.

Two switches imitate providers whose token counts differ from ours (docs/memory.md §5,
"Calibration"): ``usage_scale`` rewrites the ``usage.prompt_tokens`` of every reply to the
request's own estimate (tiktoken, :mod:`memory.tokens`) times the scale, so 1.2 is a provider
whose tokenizer yields 20 % more tokens; ``reject_stream_options`` answers HTTP 400 to any request
carrying ``stream_options``, as servers that do not know the option do.

Other switches imitate what real servers do with the requests the app sends, and
:meth:`FakeOpenAI.llama_cpp` turns on the ones llama.cpp's server shows: ``tools_need_choice``
(tools without ``tool_choice`` are ignored: the reply is plain text), ``stream_usage_ignored``
(``stream_options`` accepted, no usage chunk), ``json_schema_error`` (HTTP 500 for a
``json_schema`` ``response_format``; ``json_object_error`` for ``json_object`` too) and
``null_content_error`` (HTTP 500 for an assistant message with ``content: null`` beside
``tool_calls``). ``stream_options_error`` answers HTTP 500 naming ``stream_options``. ``single_slot``
is llama.cpp's ``interrupt_requests``: a request that arrives while a stream runs ends that stream
where it is, without a finish chunk or ``[DONE]``; ``most_at_once`` counts the requests it ever saw in
flight together. :func:`paced` spreads a stream's events over time. ``tools_stream_empty`` streams
a request with tools as an empty reply (a role chunk, then ``finish_reason: "stop"``) and answers
it in full only without streaming. :meth:`FakeOpenAI.deepseek` refuses ``json_schema`` with HTTP 400
("This response_format type is unavailable now") and ``json_object`` without the word "json" in the
prompt, as DeepSeek's API does; :meth:`FakeOpenAI.ollama` sends no usage in streams, as Ollama's
OpenAI endpoint did before it took ``stream_options``. ``auto_tool_choice_off`` is vLLM started without
``--enable-auto-tool-choice``: HTTP 400 for ``tool_choice: "auto"``. ``summary_overrun`` is a weak model
that never keeps a summary inside its budget: a summary request (its prompt states "At most N tokens") is
answered with that many times N tokens of whole sentences, cut at the request's ``max_tokens`` with
``finish_reason: "length"``, streamed or not.
:func:`dropped` is a reply whose connection is closed or reset before the first chunk.

The fixtures ``fake_openai`` and ``fake_openai_failover`` (two independent servers) and
``refused_base_url`` (a port where connections are refused) are in ``tests/conftest.py``, so every
test receives them by name.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import struct
import threading
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from memory.tokens.counter import get_counter


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One scripted HTTP reply: ``body`` sent whole, or ``events`` sent as SSE ``data:`` lines
    (each flushed on its own, then ``data: [DONE]``), after waiting ``delay`` seconds."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    events: list[str] | None = None
    delay: float = 0.0
    drop: str = ""  # "close" or "reset": the connection ends after the headers (see dropped)
    pace: float = 0.0  # seconds between two stream events


@dataclass(frozen=True)
class Recorded:
    """One request the server received; ``json`` is the parsed body (None if not JSON)."""

    method: str
    path: str
    headers: dict[str, str]
    json: Any


def completion(
    content: str | None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    model: str = "fake-model",
    finish_reason: str | None = None,
) -> Reply:
    """A non-streaming ``chat.completion`` with usage. ``finish_reason`` defaults to ``tool_calls``
    or ``stop``; pass ``"length"`` for a reply the provider cut off at its output cap."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    finish_reason = finish_reason or ("tool_calls" if tool_calls else "stop")
    payload = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }
    return Reply(body=json.dumps(payload).encode())


def chunk(
    delta: dict[str, Any] | None = None, *, finish_reason: str | None = None, usage: dict[str, int] | None = None
) -> str:
    """One ``chat.completion.chunk`` as JSON text: a delta choice, or (with ``usage``) the final
    usage chunk that has no choices."""
    payload: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake-model",
    }
    if usage is not None:
        payload.update(choices=[], usage=usage)
    else:
        payload["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}]
    return json.dumps(payload)


def stream(*events: str) -> Reply:
    """An SSE reply made of ``events`` (see :func:`chunk`)."""
    return Reply(content_type="text/event-stream", events=list(events))


def text_stream(text: str, *, finish_reason: str | None = "stop", pieces: int = 3) -> Reply:
    """``text`` streamed in about ``pieces`` content deltas, then a chunk carrying
    ``finish_reason`` (``"length"`` for a cut-off reply; None sends no finish chunk), then usage."""
    size = max(1, -(-len(text) // pieces))
    deltas = [chunk({"content": text[start : start + size]}) for start in range(0, len(text), size)]
    tail = [chunk(finish_reason=finish_reason)] if finish_reason else []
    usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    return stream(chunk({"role": "assistant", "content": ""}), *deltas, *tail, chunk(usage=usage))


def error(status: int, message: str) -> Reply:
    """An OpenAI-style error body with HTTP ``status``."""
    error_type = "server_error" if status >= 500 else "rate_limit_error" if status == 429 else "invalid_request_error"
    return Reply(status=status, body=json.dumps({"error": {"message": message, "type": error_type}}).encode())


def slow(seconds: float, then: Reply) -> Reply:
    """``then``, sent only after ``seconds``."""
    return Reply(status=then.status, body=then.body, content_type=then.content_type, events=then.events, delay=seconds)


def paced(seconds: float, then: Reply) -> Reply:
    """``then``, a stream, with ``seconds`` between its events: a model that is still writing."""
    return replace(then, pace=seconds)


def embeddings(vectors: list[list[float]], *, model: str = "fake-embed") -> Reply:
    """A ``/v1/embeddings`` reply (``encoding_format`` ``float``) holding ``vectors`` in order."""
    payload = {
        "object": "list",
        "data": [{"object": "embedding", "index": index, "embedding": vector} for index, vector in enumerate(vectors)],
        "model": model,
        "usage": {"prompt_tokens": 5, "total_tokens": 5},
    }
    return Reply(body=json.dumps(payload).encode())


def dropped(how: str) -> Reply:
    """A stream whose connection ends before the first chunk: after the headers of an SSE reply,
    ``close`` closes the connection and ``reset`` resets it (TCP RST), as a server that died does."""
    assert how in ("close", "reset")
    return Reply(content_type="text/event-stream", events=[], drop=how)


# What the plain-text reply of a server that ignored the request's tools says.
TOOLS_IGNORED_TEXT = "17 x 23 is 405."

MALFORMED_JSON = Reply(body=b'{"id": "chatcmpl-fake", "choices": [')


@dataclass
class FakeOpenAI:
    """The server. ``base_url`` ends in ``/v1``. Scripted replies are served in order; the last
    one repeats, so a test scripting one failure sees it on every retry."""

    requests: list[Recorded] = field(default_factory=list)
    _replies: list[Reply] = field(default_factory=lambda: [completion("ok")])
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _released: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    usage_scale: float | None = None
    reject_stream_options: bool = False
    stream_options_error: bool = False
    tools_need_choice: bool = False
    stream_usage_ignored: bool = False
    json_schema_error: bool = False
    json_object_error: bool = False
    null_content_error: bool = False
    single_slot: bool = False
    tools_stream_empty: bool = False
    json_schema_unavailable: bool = False
    auto_tool_choice_off: bool = False
    summary_overrun: float = 0.0
    json_object_needs_word: bool = False
    most_at_once: int = 0
    _in_flight: int = 0
    _arrivals: int = 0

    def llama_cpp(self) -> FakeOpenAI:
        """Behave as llama.cpp's OpenAI-compatible server does (see the module docstring)."""
        self.tools_need_choice = self.stream_usage_ignored = True
        self.json_schema_error = self.null_content_error = self.single_slot = True
        return self

    def deepseek(self) -> FakeOpenAI:
        """Behave as DeepSeek's API does with structured output (see the module docstring)."""
        self.json_schema_unavailable = self.json_object_needs_word = True
        return self

    def ollama(self) -> FakeOpenAI:
        """Behave as Ollama's OpenAI-compatible endpoint did: no usage chunk in a stream."""
        self.stream_usage_ignored = True
        return self

    @property
    def base_url(self) -> str:
        assert self._server is not None, "server not started"
        return f"http://127.0.0.1:{self._server.server_port}/v1"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._replies = list(replies)

    def start(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        # A short poll interval keeps shutdown (and so each test's teardown) fast.
        threading.Thread(target=self._server.serve_forever, args=(0.02,), name="fake-openai", daemon=True).start()

    def stop(self) -> None:
        # Wake handlers still sleeping in a scripted delay so they finish promptly.
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _take(self, recorded: Recorded) -> Reply:
        with self._lock:
            self.requests.append(recorded)
            if self.reject_stream_options and isinstance(recorded.json, dict) and "stream_options" in recorded.json:
                return error(400, "Unrecognized request argument supplied: stream_options")
            refusal = self._refusal(recorded.json) if isinstance(recorded.json, dict) else None
            if refusal is not None:
                return refusal
            reply = self._replies.pop(0) if len(self._replies) > 1 else self._replies[0]
            body = recorded.json if isinstance(recorded.json, dict) else {}
            if self.tools_need_choice and body.get("tools") and "tool_choice" not in body:
                reply = text_stream(TOOLS_IGNORED_TEXT) if body.get("stream") else completion(TOOLS_IGNORED_TEXT)
            if self.summary_overrun and (overrun := self._overrun(body)) is not None:
                reply = overrun
            if self.tools_stream_empty and body.get("tools") and body.get("stream"):
                reply = stream(chunk({"role": "assistant", "content": ""}), chunk(finish_reason="stop"))
            if self.stream_usage_ignored and reply.events is not None:
                reply = replace(reply, events=[event for event in reply.events if '"usage"' not in event])
        if self.usage_scale is not None and isinstance(recorded.json, dict):
            return _usage_rescaled(reply, round(request_estimate(recorded.json) * self.usage_scale))
        return reply

    def _overrun(self, body: dict[str, Any]) -> Reply | None:
        """The reply of :attr:`summary_overrun` to a summary request, None for any other request."""
        system = next((m.get("content") for m in body.get("messages") or () if m.get("role") == "system"), "")
        stated = re.search(r"At most (\d+) tokens", system if isinstance(system, str) else "")
        if stated is None:
            return None
        counter = get_counter(str(body.get("model") or ""))
        wanted = int(self.summary_overrun * int(stated.group(1)))
        text, number = "", 0
        while counter.count_text(text) < wanted:
            text += f"The user asked about order W{number:04d} and the agent checked its status. "
            number += 1
        limit = int(body.get("max_tokens") or wanted)
        finish = "length" if counter.count_text(text) > limit else "stop"
        text = counter.truncate_text(text, limit).strip()
        return text_stream(text, finish_reason=finish) if body.get("stream") else completion(text, finish_reason=finish)

    def _refusal(self, body: dict[str, Any]) -> Reply | None:
        """The HTTP error a switched-on quirk answers ``body`` with, or None."""
        if self.auto_tool_choice_off and body.get("tool_choice") == "auto":
            return error(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
        if self.stream_options_error and "stream_options" in body:
            return error(500, "stream_options: unsupported parameter")
        response_format = body.get("response_format")
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if kind == "json_schema" and self.json_schema_unavailable:
            return error(400, "This response_format type is unavailable now")
        if kind == "json_object" and self.json_object_needs_word and "json" not in json.dumps(body["messages"]).lower():
            return error(
                400, "Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'."
            )
        if (kind == "json_schema" and self.json_schema_error) or (kind == "json_object" and self.json_object_error):
            return error(500, f"response_format of type {kind} is not supported")
        if self.null_content_error and any(
            message.get("role") == "assistant" and message.get("tool_calls") and message.get("content") is None
            for message in body.get("messages") or ()
            if isinstance(message, dict)
        ):
            return error(500, "Missing 'content': expected a string, got null")
        return None


def request_estimate(body: dict[str, Any]) -> int:
    """Our estimate (tokens) of a chat request ``body``: its messages and tools counted with the
    encoding of its model (:meth:`memory.tokens.TokenCounter.count_request`)."""
    counter = get_counter(str(body.get("model") or ""))
    return counter.count_request(body.get("messages") or [], body.get("tools"))


def _usage_rescaled(reply: Reply, prompt_tokens: int) -> Reply:
    """``reply`` with ``prompt_tokens`` (and the total) in every usage object it carries."""

    def rescale(text: str) -> str:
        try:
            payload = json.loads(text)
        except ValueError:
            return text
        usage = payload.get("usage") if isinstance(payload, dict) else None
        if not isinstance(usage, dict):
            return text
        usage["prompt_tokens"] = prompt_tokens
        usage["total_tokens"] = prompt_tokens + int(usage.get("completion_tokens") or 0)
        return json.dumps(payload)

    if reply.events is not None:
        return replace(reply, events=[rescale(event) for event in reply.events])
    return replace(reply, body=rescale(reply.body.decode()).encode()) if reply.body else reply


def _handler_for(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._serve(None)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            self._serve(body)

        def _serve(self, body: Any) -> None:
            with fake._lock:
                fake._arrivals += 1
                fake._in_flight += 1
                fake.most_at_once = max(fake.most_at_once, fake._in_flight)
                self.arrival = fake._arrivals
            try:
                reply = fake._take(
                    Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                if reply.delay and fake._released.wait(reply.delay):
                    return
                # A client that gave up (a timeout under test) has closed the socket: nothing to tell it.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._send(reply)
            finally:
                with fake._lock:
                    fake._in_flight -= 1

        def _interrupted(self) -> bool:
            """Whether a single-slot server took a later request since this one arrived."""
            return fake.single_slot and fake._arrivals > self.arrival

        def _send(self, reply: Reply) -> None:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Connection", "close")
            if reply.events is None:
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
                return
            self.end_headers()
            if reply.drop:
                self.wfile.flush()
                self.close_connection = True
                if reply.drop == "reset":
                    # SO_LINGER with a zero timeout: closing sends a TCP RST instead of a FIN.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                return
            for event in [*reply.events, "[DONE]"]:
                if reply.pace and fake._released.wait(reply.pace):
                    return
                if self._interrupted():
                    self.close_connection = True
                    return
                self.wfile.write(f"data: {event}\n\n".encode())
                self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

    return Handler
