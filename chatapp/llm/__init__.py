"""LLM access for the chat app (docs/memory.md §6): endpoints, clients and :class:`LLMError` (``clients``), the
summarizers (``summarizer``) and the offline engine, an in-process OpenAI-compatible transport (``offline``)."""

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
