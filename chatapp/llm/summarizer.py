"""The memory engine's summarizers over OpenAI-compatible endpoints (docs/memory.md §3 and §4).

:class:`OpenAISummarizer` implements :class:`memory.summarizer.Summarizer`; the degradation chain
(retries, failover, then raw archive) lives in :class:`memory.summarizer.SummarizerChain` and is
built from settings by :func:`build_summarizer_chain`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

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
from memory.api import SummarizerChain, SummaryReply, SummaryRequest


@dataclass(kw_only=True)
class OpenAISummarizer:
    """Summaries from one endpoint's model: one call per :meth:`summarize`.

    ``temperature``: sampling temperature of the summarizer (default 0.3, docs/memory.md §3), separate from the
    chat model's. ``stream``: ask for a streamed reply (``SUMMARY_STREAM``, for servers that only
    stream) instead of one chat completion. ``model`` (the endpoint's model) names it in the
    chain's attempt records.
    """

    endpoint: Endpoint
    temperature: float = 0.3
    stream: bool = False
    model: str = field(init=False)

    def __post_init__(self) -> None:
        self.model = self.endpoint.model

    async def summarize(self, request: SummaryRequest) -> SummaryReply:
        """The reply to ``request.prompt``, capped at ``request.max_tokens`` tokens, with the
        provider's ``finish_reason``.

        The text is ``""`` when the model answered without text. The chain
        (:func:`memory.summarizer.check_reply`) counts an empty, cut-off (``finish_reason``
        ``length``) or marker-only reply as a failed attempt (docs/memory.md F-36), streamed or
        not. Raises :class:`LLMError` for any endpoint failure (for a stream, also a reply with no
        text at all). The client makes exactly one HTTP request (no hidden retries), so each chain
        attempt is one request.
        """
        if self.stream:
            return await self._summarize_streamed(request)
        client = get_client(self.endpoint)
        with translated_errors(self.endpoint):
            completion = await client.chat.completions.create(
                model=self.endpoint.model,
                messages=cast("list[ChatCompletionMessageParam]", request.prompt),
                max_tokens=request.max_tokens,
                temperature=self.temperature,
            )
        # The SDK hands back the raw text of a body that is not declared as JSON.
        if not isinstance(completion, ChatCompletion) or getattr(completion, "choices", None) is None:
            raise LLMError(f"{self.endpoint.label} sent a response that is not a chat completion.", "malformed")
        if not completion.choices:
            return SummaryReply(text="")
        choice = completion.choices[0]
        return SummaryReply(text=choice.message.content or "", finish_reason=choice.finish_reason)

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


def build_summarizer_chain() -> SummarizerChain:
    """Layers 1 and 2 of the degradation chain from settings.

    Primary: :func:`summary_endpoint`; failover: :func:`failover_endpoint` (None when unset).
    ``MEMORY_SUMMARY_ATTEMPTS`` tries per layer, each limited to ``LLM_SUMMARY_TIMEOUT`` seconds;
    both summarizers use ``LLM_SUMMARY_TEMPERATURE`` and stream when ``LLM_SUMMARY_STREAM`` is set.
    """
    temperature, stream = settings.LLM_SUMMARY_TEMPERATURE, settings.LLM_SUMMARY_STREAM
    failover = failover_endpoint()
    return SummarizerChain(
        primary=OpenAISummarizer(endpoint=summary_endpoint(), temperature=temperature, stream=stream),
        failover=OpenAISummarizer(endpoint=failover, temperature=temperature, stream=stream) if failover else None,
        attempts=settings.MEMORY_SUMMARY_ATTEMPTS,
        timeout=settings.LLM_SUMMARY_TIMEOUT,
    )
