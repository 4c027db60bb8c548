"""LLM access for the chat app (docs/memory.md §6).

- :mod:`chatapp.llm.clients`: endpoints from settings, cached ``AsyncOpenAI`` clients,
  :func:`~chatapp.llm.clients.chat_stream` and the one error class :class:`~chatapp.llm.clients.LLMError`.
- :mod:`chatapp.llm.summarizer`: :class:`~chatapp.llm.summarizer.OpenAISummarizer` and the summarizers
  the memory engine's degradation chain is built with.
- :mod:`chatapp.llm.offline.transport`: the built-in offline engine, an OpenAI-compatible ``httpx2`` transport
  (its answers are decided in :mod:`chatapp.llm.offline.replies`).
"""

from __future__ import annotations

from chatapp.llm.clients import (
    ChatEvent,
    Endpoint,
    LLMError,
    chat_endpoint,
    chat_stream,
    failover_endpoint,
    get_client,
    make_client,
    summary_endpoint,
)
from chatapp.llm.offline.transport import OFFLINE_MODEL, OfflineTransport
from chatapp.llm.summarizer import OpenAISummarizer, summarizers_get

__all__ = [
    "OFFLINE_MODEL",
    "ChatEvent",
    "Endpoint",
    "LLMError",
    "OfflineTransport",
    "OpenAISummarizer",
    "chat_endpoint",
    "chat_stream",
    "failover_endpoint",
    "get_client",
    "make_client",
    "summarizers_get",
    "summary_endpoint",
]
