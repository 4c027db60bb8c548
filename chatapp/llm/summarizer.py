"""The memory engine's summarizers over OpenAI-compatible endpoints (docs/memory.md §3 and §4).

:class:`OpenAISummarizer` implements :class:`memory.summarizer.Summarizer`; the degradation chain
(retries, failover, then raw archive) lives in :class:`memory.summarizer.SummarizerChain` and is
built from settings by :func:`build_summarizer_chain`.
"""

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
    """Summaries from one endpoint's model: one call per :meth:`summarize`.

    ``temperature``: sampling temperature of the summarizer (default 0.3, docs/memory.md §3), separate from the
    chat model's. ``stream``: ask for a streamed reply (``SUMMARY_STREAM``, for servers that only
    stream) instead of one chat completion. ``model`` (the endpoint's model) names it in the
    chain's attempt records, and ``method`` says how its summaries are written: ``extractive``
    when the endpoint is the offline engine (it copies sentences, no language model), else
    ``llm``.

    ``response_format`` of a request (a key-facts extraction, docs/memory.md §11) is sent on the
    non-streamed path with a fallback within the same call: the format as given, then
    ``{"type": "json_object"}``, then none, each next one only when the endpoint rejected the
    previous with HTTP 400 or 422 (servers that do not know ``json_schema``). The first level
    that worked is remembered per instance, so later calls skip the rejected ones. The streamed
    path sends no ``response_format`` (:func:`chatapp.llm.clients.chat_stream` takes no extra
    parameters): the reply is parsed tolerantly anyway.
    """

    endpoint: Endpoint
    temperature: float = 0.3
    stream: bool = False
    model: str = field(init=False)
    method: str = field(init=False)
    # ``response_format`` types (``json_schema``, ``json_object``) this endpoint rejected.
    _rejected_formats: set[str] = field(default_factory=set, init=False, repr=False)

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
        rejects (HTTP 400/422) is sent again with the next fallback format (at most three
        requests; see the class docstring).
        """
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
            # Remembered only once a later level worked: a 400 for another reason (a prompt
            # over the window) fails every level and must not mark the formats as unsupported.
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
        """One chat completion of ``request.prompt`` (``response_format`` sent when not None)."""
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
        """:meth:`summarize` over a streamed reply: the text deltas joined, and the finish reason
        of the stream's last choice (None when the server sent none)."""
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
    servers answer a ``response_format`` they do not support."""
    cause = exc.__cause__
    return exc.kind == "status" and isinstance(cause, openai.APIStatusError) and cause.status_code in (400, 422)


_summarizers: dict[tuple[Any, ...], tuple[OpenAISummarizer, OpenAISummarizer | None]] = {}


def summarizers_get() -> tuple[OpenAISummarizer, OpenAISummarizer | None]:
    """The primary and failover summarizers of the settings (the failover None when unset), kept
    while the settings stay the same: each remembers which ``response_format`` its endpoint
    rejected, so later calls skip it."""
    temperature, stream = settings.LLM_SUMMARY_TEMPERATURE, settings.LLM_SUMMARY_STREAM
    primary, failover = summary_endpoint(), failover_endpoint()
    key = (primary, failover, temperature, stream)
    if key not in _summarizers:
        _summarizers[key] = (
            OpenAISummarizer(endpoint=primary, temperature=temperature, stream=stream),
            OpenAISummarizer(endpoint=failover, temperature=temperature, stream=stream) if failover else None,
        )
    return _summarizers[key]
