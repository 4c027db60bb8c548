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

from chatapp.llm.clients import Endpoint, LLMError, failover_endpoint, get_client, summary_endpoint, translated_errors
from memory.api import SummarizerChain, SummaryRequest


@dataclass(kw_only=True)
class OpenAISummarizer:
    """Summaries from one endpoint's model: one non-streaming call per :meth:`summarize`.

    ``temperature``: sampling temperature of the summarizer (default 0.3, docs/memory.md §3), separate from the
    chat model's. ``model`` (the endpoint's model) names it in the chain's attempt records.
    """

    endpoint: Endpoint
    temperature: float = 0.3
    model: str = field(init=False)

    def __post_init__(self) -> None:
        self.model = self.endpoint.model

    async def summarize(self, request: SummaryRequest) -> str:
        """The reply text to ``request.prompt``, capped at ``request.max_tokens`` tokens.

        Returns ``""`` when the model answered without text; the chain counts that as a failed
        attempt. Raises :class:`LLMError` for any endpoint failure. The client makes exactly one
        HTTP request (no hidden retries), so each chain attempt is one request.
        """
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
            return ""
        return completion.choices[0].message.content or ""


def build_summarizer_chain() -> SummarizerChain:
    """Layers 1 and 2 of the degradation chain from settings.

    Primary: :func:`summary_endpoint`; failover: :func:`failover_endpoint` (None when unset).
    ``MEMORY_SUMMARY_ATTEMPTS`` tries per layer, each limited to ``LLM_SUMMARY_TIMEOUT`` seconds;
    both summarizers use ``LLM_SUMMARY_TEMPERATURE``.
    """
    temperature = settings.LLM_SUMMARY_TEMPERATURE
    failover = failover_endpoint()
    return SummarizerChain(
        primary=OpenAISummarizer(endpoint=summary_endpoint(), temperature=temperature),
        failover=OpenAISummarizer(endpoint=failover, temperature=temperature) if failover else None,
        attempts=settings.MEMORY_SUMMARY_ATTEMPTS,
        timeout=settings.LLM_SUMMARY_TIMEOUT,
    )
