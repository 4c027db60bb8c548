"""Remembered token counts (memory/tokens.py, docs/memory.md §5): the same text gives the same
count, and a long text such as a system prompt is encoded once however often it is counted."""

from __future__ import annotations

import tiktoken

from memory.tokens.counter import COUNT_CACHE_MAX_CHARS, COUNT_CACHE_MIN_CHARS, FALLBACK_ENCODING, TokenCounter


class CountingEncoding:
    """A tiktoken encoding that counts its ``encode`` calls."""

    def __init__(self) -> None:
        self.inner = tiktoken.get_encoding(FALLBACK_ENCODING)
        self.calls = 0
        self.name = self.inner.name

    def encode(self, text: str, **kwargs: object) -> list[int]:
        self.calls += 1
        return self.inner.encode(text, **kwargs)  # type: ignore[arg-type]


def test_a_long_text_counted_again_is_encoded_once_with_the_same_count():
    encoding = CountingEncoding()
    counter = TokenCounter(encoding)  # type: ignore[arg-type]
    prompt = "You are the support assistant. Quote numbers exactly. " * 10  # 550 characters
    assert COUNT_CACHE_MIN_CHARS <= len(prompt) <= COUNT_CACHE_MAX_CHARS

    counts = [counter.count_text(prompt), counter.count_message({"role": "system", "content": prompt})]

    assert counts[0] == len(encoding.inner.encode(prompt, disallowed_special=()))
    assert counts[1] == 3 + 1 + counts[0]  # message overhead, the role "system" (1 token), the text
    assert encoding.calls == 2  # the prompt once, the role once


def test_short_and_very_long_texts_are_not_remembered():
    encoding = CountingEncoding()
    counter = TokenCounter(encoding)  # type: ignore[arg-type]
    short, huge = "hello there", "word " * (COUNT_CACHE_MAX_CHARS // 5 + 1)

    for _ in range(2):
        counter.count_text(short)
        counter.count_text(huge)

    assert encoding.calls == 4
    assert counter.count_text(huge) == len(encoding.inner.encode(huge, disallowed_special=()))
