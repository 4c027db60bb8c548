"""The memory engine's summarizers over OpenAI-compatible endpoints (docs/memory.md §3 and §4).

:class:`OpenAISummarizer` implements :class:`memory.summarizer.Summarizer`; the degradation chain
(retries, failover, then raw archive) lives in :class:`memory.summarizer.SummarizerChain` and is
built from settings by :func:`build_summarizer_chain`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any, cast

import openai
from django.conf import settings
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from chatapp.llm.clients import (
    Endpoint,
    LLMError,
    chat_stream,
    failover_endpoint,
    get_client,
    refusal_names,
    refused_shapes,
    shape_refused,
    summary_endpoint,
    translated_errors,
)
from memory.api import SummaryReply, SummaryRequest


@dataclass(kw_only=True)
class OpenAISummarizer:
    """Summaries from one endpoint's model: one call per :meth:`summarize`.

    ``temperature``: sampling temperature of the summarizer (default 0.3, docs/memory.md §3), separate from the
    chat model's. ``stream``: ask for a streamed reply (``SUMMARY_STREAM``, for servers that only
    stream) instead of one chat completion. ``model`` (the endpoint's model) names it in the
    chain's attempt records, and ``method`` says how its summaries are written: ``extractive``
    when the endpoint is the offline engine (it copies sentences, no language model), else
    ``llm``.

    ``response_format`` of a request (a key-facts extraction, docs/memory.md §11) is sent on the
    non-streamed path with a fallback within the same call: the format as given, then
    ``{"type": "json_object"}``, then none but a plain instruction (:func:`json_only_prompt`),
    each next one only when the endpoint rejected the previous (:func:`_format_rejected`). What
    was rejected is remembered per endpoint (base URL and model), so later calls skip it. The
    streamed path sends the plain instruction (:func:`chatapp.llm.clients.chat_stream` takes no
    extra parameters). The reply of a request with a ``response_format`` is its first JSON object
    (:func:`first_json_object`), when it has one.
    """

    endpoint: Endpoint
    temperature: float = 0.3
    stream: bool = False
    model: str = field(init=False)
    method: str = field(init=False)

    def __post_init__(self) -> None:
        self.model = self.endpoint.model
        self.method = "extractive" if self.endpoint.offline else "llm"

    async def summarize(self, request: SummaryRequest) -> SummaryReply:
        """The reply to ``request.prompt``, capped at ``request.max_tokens`` tokens, with the
        provider's ``finish_reason``.

        The text is ``""`` when the model answered without text. The chain
        (:func:`memory.summarizer.check_reply`) counts an empty, cut-off (``finish_reason``
        ``length``) or marker-only reply as a failed attempt (docs/memory.md F-36), streamed or
        not. Raises :class:`LLMError` for any endpoint failure (for a stream, also a reply with no
        text at all). The client makes exactly one HTTP request (no hidden retries), so each chain
        attempt is one request -- except that a request with a ``response_format`` the endpoint
        rejects is sent again with the next fallback format (at most three requests; see the
        class docstring).
        """
        if self.stream:
            return _json_only(request, await self._summarize_streamed(request))
        refused = refused_shapes(self.endpoint)
        levels = [
            level
            for level in response_format_levels(request.response_format)
            if level is None or level.get("type") not in refused
        ]
        rejected: list[str] = []
        for number, level in enumerate(levels, 1):
            try:
                completion = await self._complete(request, level)
            except LLMError as exc:
                if number < len(levels) and level is not None and _format_rejected(exc):
                    rejected.append(str(level.get("type")))
                    continue
                raise
            # Remembered only once a later level worked: a 400 for another reason (a prompt
            # over the window) fails every level and must not mark the formats as unsupported.
            for shape in rejected:
                shape_refused(self.endpoint, shape)
            break
        # The SDK hands back the raw text of a body that is not declared as JSON.
        if not isinstance(completion, ChatCompletion) or getattr(completion, "choices", None) is None:
            raise LLMError(f"{self.endpoint.label} sent a response that is not a chat completion.", "malformed")
        if not completion.choices:
            return SummaryReply(text="")
        choice = completion.choices[0]
        return _json_only(request, SummaryReply(text=choice.message.content or "", finish_reason=choice.finish_reason))

    async def _complete(self, request: SummaryRequest, response_format: dict[str, Any] | None) -> object:
        """One chat completion of ``request.prompt`` (``response_format`` sent when not None)."""
        client = get_client(self.endpoint)
        extra: dict[str, Any] = {"response_format": response_format} if response_format is not None else {}
        prompt = request.prompt if response_format is not None else _prompt_of(request)
        with translated_errors(self.endpoint):
            return await client.chat.completions.create(
                model=self.endpoint.model,
                messages=cast("list[ChatCompletionMessageParam]", prompt),
                max_tokens=request.max_tokens,
                temperature=self.temperature,
                **extra,
            )

    async def _summarize_streamed(self, request: SummaryRequest) -> SummaryReply:
        """:meth:`summarize` over a streamed reply: the text deltas joined, and the finish reason
        of the stream's last choice (None when the server sent none)."""
        pieces: list[str] = []
        finish_reason: str | None = None
        async for event in chat_stream(
            _prompt_of(request), endpoint=self.endpoint, max_tokens=request.max_tokens, temperature=self.temperature
        ):
            if event["type"] == "delta":
                pieces.append(event["text"])
            elif event["type"] == "finish":
                finish_reason = event["finish_reason"]
        return SummaryReply(text="".join(pieces), finish_reason=finish_reason)


def response_format_levels(response_format: dict[str, Any] | None) -> list[dict[str, Any] | None]:
    """The ``response_format`` values tried in order for a request asking for ``response_format``
    (docs/memory.md §11):
    it as given, then ``{"type": "json_object"}`` (unless it is that already), then none. A
    request asking for none gets ``[None]``."""
    if response_format is None:
        return [None]
    levels: list[dict[str, Any] | None] = [response_format]
    if response_format.get("type") != "json_object":
        levels.append({"type": "json_object"})
    levels.append(None)
    return levels


def _format_rejected(exc: LLMError) -> bool:
    """Whether ``exc`` is the endpoint refusing the request itself (HTTP 400 or 422), which is how
    servers answer a ``response_format`` they do not support, or any HTTP error naming the format
    or its schema (llama.cpp's server answers HTTP 500)."""
    cause = exc.__cause__
    if exc.kind == "status" and isinstance(cause, openai.APIStatusError) and cause.status_code in (400, 422):
        return True
    return refusal_names(exc, "response_format", "json_schema", "json_object", "schema", "grammar")


JSON_ONLY_INSTRUCTION = "Reply with one JSON object only: no code fences, no text before or after it."


def json_only_prompt(prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``prompt`` with :data:`JSON_ONLY_INSTRUCTION` appended to its first system message (or in a
    new one in front): the request for JSON to an endpoint that takes no ``response_format``."""
    for number, message in enumerate(prompt):
        if message.get("role") == "system" and isinstance(message.get("content"), str):
            content = f"{message['content']}\n\n{JSON_ONLY_INSTRUCTION}"
            return [*prompt[:number], {**message, "content": content}, *prompt[number + 1 :]]
    return [{"role": "system", "content": JSON_ONLY_INSTRUCTION}, *prompt]


def first_json_object(text: str) -> str | None:
    """The first JSON object in ``text`` (inside a code fence when there is one), as its text, or
    None when there is none or the text opens with a broken one (a cut-off reply: an object
    nested in it is not the answer)."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    source = (fenced.group(1) if fenced else text).strip()
    decoder = json.JSONDecoder()
    for start in (match.start() for match in re.finditer(r"\{", source)):
        try:
            value, end = decoder.raw_decode(source, start)
        except ValueError:
            if start == 0:
                return None
            continue
        if isinstance(value, dict):
            return source[start:end]
    return None


def _prompt_of(request: SummaryRequest) -> list[dict[str, Any]]:
    """The prompt sent without ``response_format``: asking for JSON in words when it was wanted."""
    return request.prompt if request.response_format is None else json_only_prompt(request.prompt)


def _json_only(request: SummaryRequest, reply: SummaryReply) -> SummaryReply:
    """``reply`` reduced to its first JSON object when ``request`` asked for JSON."""
    if request.response_format is None:
        return reply
    found = first_json_object(reply.text)
    return reply if found is None or found == reply.text else dataclasses.replace(reply, text=found)


_summarizers: dict[tuple[Any, ...], tuple[OpenAISummarizer, OpenAISummarizer | None]] = {}


def summarizers_get() -> tuple[OpenAISummarizer, OpenAISummarizer | None]:
    """The primary and failover summarizers of the settings (the failover None when unset), kept
    while the settings stay the same."""
    temperature, stream = settings.LLM_SUMMARY_TEMPERATURE, settings.LLM_SUMMARY_STREAM
    primary, failover = summary_endpoint(), failover_endpoint()
    key = (primary, failover, temperature, stream)
    if key not in _summarizers:
        _summarizers[key] = (
            OpenAISummarizer(endpoint=primary, temperature=temperature, stream=stream),
            OpenAISummarizer(endpoint=failover, temperature=temperature, stream=stream) if failover else None,
        )
    return _summarizers[key]
