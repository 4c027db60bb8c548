"""The memory engine's summarizers over OpenAI-compatible endpoints (docs/memory.md §3, §4); the settings give
one per endpoint (:func:`summarizers_get`)."""

from __future__ import annotations

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
    summary_endpoint,
    translated_errors,
)
from memory.api import SummaryReply, SummaryRequest


@dataclass(kw_only=True)
class OpenAISummarizer:
    """Summaries from one endpoint's model (``method``: ``extractive`` offline, else ``llm``), streamed with
    ``stream``. A request's ``response_format`` (docs/memory.md §11) falls back on HTTP 400/422 to ``json_object``,
    then none, remembering rejected types; the streamed path sends none."""

    endpoint: Endpoint
    temperature: float = 0.3
    stream: bool = False
    model: str = field(init=False)
    method: str = field(init=False)
    _rejected_formats: set[str] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self.model = self.endpoint.model
        self.method = "extractive" if self.endpoint.offline else "llm"

    async def summarize(self, request: SummaryRequest) -> SummaryReply:
        """The reply to ``request.prompt``, capped at ``request.max_tokens`` tokens, with its ``finish_reason``; the
        chain judges empty or cut-off replies (F-36). Raises :class:`LLMError`; one request per response format."""
        if self.stream:
            return await self._summarize_streamed(request)
        levels = [
            level
            for level in response_format_levels(request.response_format)
            if level is None or level.get("type") not in self._rejected_formats
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
            self._rejected_formats.update(rejected)
            break
        # The SDK hands back the raw text of a body that is not declared as JSON.
        if not isinstance(completion, ChatCompletion) or getattr(completion, "choices", None) is None:
            raise LLMError(f"{self.endpoint.label} sent a response that is not a chat completion.", "malformed")
        if not completion.choices:
            return SummaryReply(text="")
        choice = completion.choices[0]
        return SummaryReply(text=choice.message.content or "", finish_reason=choice.finish_reason)

    async def _complete(self, request: SummaryRequest, response_format: dict[str, Any] | None) -> object:
        client = get_client(self.endpoint)
        extra: dict[str, Any] = {"response_format": response_format} if response_format is not None else {}
        with translated_errors(self.endpoint):
            return await client.chat.completions.create(
                model=self.endpoint.model,
                messages=cast("list[ChatCompletionMessageParam]", request.prompt),
                max_tokens=request.max_tokens,
                temperature=self.temperature,
                **extra,
            )

    async def _summarize_streamed(self, request: SummaryRequest) -> SummaryReply:
        """:meth:`summarize` over a stream: the deltas joined, and the last finish reason (None when none came)."""
        pieces: list[str] = []
        finish_reason: str | None = None
        async for event in chat_stream(
            request.prompt, endpoint=self.endpoint, max_tokens=request.max_tokens, temperature=self.temperature
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
    """Whether the endpoint refused the request itself (HTTP 400 or 422), as for an unknown ``response_format``."""
    cause = exc.__cause__
    return exc.kind == "status" and isinstance(cause, openai.APIStatusError) and cause.status_code in (400, 422)


_summarizers: dict[tuple[Any, ...], tuple[OpenAISummarizer, OpenAISummarizer | None]] = {}


def summarizers_get() -> tuple[OpenAISummarizer, OpenAISummarizer | None]:
    """The primary and failover (or None) summarizers of the settings, kept while those stay the same so each
    remembers its rejected formats."""
    temperature, stream = settings.LLM_SUMMARY_TEMPERATURE, settings.LLM_SUMMARY_STREAM
    primary, failover = summary_endpoint(), failover_endpoint()
    key = (primary, failover, temperature, stream)
    if key not in _summarizers:
        _summarizers[key] = (
            OpenAISummarizer(endpoint=primary, temperature=temperature, stream=stream),
            OpenAISummarizer(endpoint=failover, temperature=temperature, stream=stream) if failover else None,
        )
    return _summarizers[key]
