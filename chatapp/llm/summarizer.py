"""The memory engine's summarizers over OpenAI-compatible endpoints (docs/memory.md §3, §4); the settings give
one per endpoint (:func:`summarizers_get`)."""

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
from chatapp.llm.limits import server_slot
from memory.api import SummaryReply, SummaryRequest


@dataclass(kw_only=True)
class OpenAISummarizer:
    """Summaries from one endpoint's model (``method``: ``extractive`` offline, else ``llm``), streamed with
    ``stream``. A request's ``response_format`` (docs/memory.md §11) falls back ``json_schema`` -> ``json_object`` ->
    a plain instruction when the endpoint refuses it, remembered per endpoint; a JSON reply is its first object."""

    endpoint: Endpoint
    temperature: float = 0.3
    stream: bool = False
    model: str = field(init=False)
    method: str = field(init=False)

    def __post_init__(self) -> None:
        self.model = self.endpoint.model
        self.method = "extractive" if self.endpoint.offline else "llm"

    async def summarize(self, request: SummaryRequest) -> SummaryReply:
        """The reply to ``request.prompt``, capped at ``request.reply_tokens`` (else ``max_tokens``) tokens, with its
        ``finish_reason``; the chain judges empty or cut-off replies (F-36). Raises :class:`LLMError`; one request
        per response format."""
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
            # Remembered only once a later level worked: a 400 for another reason fails every level.
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
        client = get_client(self.endpoint)
        extra: dict[str, Any] = {"response_format": response_format} if response_format is not None else {}
        prompt = request.prompt if response_format is not None else _prompt_of(request)
        async with server_slot(self.endpoint.base_url):
            with translated_errors(self.endpoint):
                return await client.chat.completions.create(
                    model=self.endpoint.model,
                    messages=cast("list[ChatCompletionMessageParam]", prompt),
                    max_tokens=request.reply_tokens or request.max_tokens,
                    temperature=self.temperature,
                    **extra,
                )

    async def _summarize_streamed(self, request: SummaryRequest) -> SummaryReply:
        """:meth:`summarize` over a stream: the deltas joined, and the last finish reason (None when none came)."""
        pieces: list[str] = []
        finish_reason: str | None = None
        async for event in chat_stream(
            _prompt_of(request),
            endpoint=self.endpoint,
            max_tokens=request.reply_tokens or request.max_tokens,
            temperature=self.temperature,
        ):
            if event["type"] == "delta":
                pieces.append(event["text"])
            elif event["type"] == "finish":
                finish_reason = event["finish_reason"]
        return SummaryReply(text="".join(pieces), finish_reason=finish_reason)


def response_format_levels(response_format: dict[str, Any] | None) -> list[dict[str, Any] | None]:
    """The ``response_format`` values tried in order: as given, ``{"type": "json_object"}``, then None."""
    if response_format is None:
        return [None]
    levels: list[dict[str, Any] | None] = [response_format]
    if response_format.get("type") != "json_object":
        levels.append({"type": "json_object"})
    levels.append(None)
    return levels


def _format_rejected(exc: LLMError) -> bool:
    """Whether the endpoint refused the request itself (HTTP 400/422), or any HTTP error names the format or its
    schema (llama.cpp's server answers HTTP 500)."""
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
    """The primary and failover (or None) summarizers of the settings, kept while those stay the same."""
    temperature, stream = settings.LLM_SUMMARY_TEMPERATURE, settings.LLM_SUMMARY_STREAM
    primary, failover = summary_endpoint(), failover_endpoint()
    key = (primary, failover, temperature, stream)
    if key not in _summarizers:
        _summarizers[key] = (
            OpenAISummarizer(endpoint=primary, temperature=temperature, stream=stream),
            OpenAISummarizer(endpoint=failover, temperature=temperature, stream=stream) if failover else None,
        )
    return _summarizers[key]
