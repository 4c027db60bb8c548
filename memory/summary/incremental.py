"""Incremental summarization (docs/memory.md §3 step 4): new messages folded into the old summary chunk by chunk,
falling back to the raw archive (§4), and a summary over its cap rewritten (F-40). Writes nothing."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from memory.messages import Message, found_nothing
from memory.ports import SummaryRequest
from memory.summary.archive import raw_archive_merge, raw_text, shorten_at_sentence, summary_block, trim_summary
from memory.summary.chain import Attempt, SummarizerChain
from memory.summary.prompts import (
    build_summary_prompt,
    chunk_messages,
    fit_transcript,
    render_transcript,
    reply_room,
    transcript_budget,
)
from memory.summary.store import Summary, SummaryType
from memory.text.secrets import redact_values, secret_values
from memory.tokens.counter import TokenCounter

# The smallest summary worth asking for, in tokens.
MIN_SUMMARY_TOKENS = 48
# The transcript sent when a stored summary over the cap is shrunk with no new messages (F-40).
SHRINK_TRANSCRIPT = "(no new messages: rewrite the previous summary shorter, keeping every fact that still matters)"


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """A result before anything is written: ``summary`` (version as read), ``attempts``, ``degraded`` to raw."""

    summary: Summary
    attempts: list[Attempt]
    degraded: bool


def _moved(summary: Summary, messages: list[Message], content: str, summary_type: SummaryType) -> Summary:
    """``summary`` with ``content`` of ``summary_type``, its boundary past ``messages``."""
    return Summary(
        content=content,
        summary_type=summary_type,
        last_message_id=max(max(message.get("id") or 0 for message in messages), summary.last_message_id or 0),
        compressed_count=summary.compressed_count + len(messages),
        version=summary.version,
    )


def summary_cap(reserve_tokens: int, counter: TokenCounter) -> int:
    """The summary text's cap in tokens: the reserve minus the block's header and message overhead."""
    empty_block = summary_block(content="", summary_type="raw", compressed_count=10**6, role="system")
    return max(16, reserve_tokens - counter.count_message(empty_block) - 1)


def summary_output_tokens(*, previous_summary_tokens: int, transcript_tokens: int, cap: int, ratio: float) -> int:
    """The summarizer's output limit in tokens: the old summary whole plus at most ``ratio`` of the new material's
    size, never over ``cap``."""
    wanted = previous_summary_tokens + math.ceil(ratio * transcript_tokens)
    return max(min(MIN_SUMMARY_TOKENS, cap), min(cap, wanted))


@dataclass(frozen=True, kw_only=True)
class IncrementalSummarizer:
    """Folds messages into a summary through ``chain``; ``window``: tokens of one summarizer request."""

    chain: SummarizerChain
    counter: TokenCounter
    ratio: float
    window: int
    empty_results: tuple[str, ...] = ()

    async def fold(self, summary: Summary, messages: list[Message], *, cap: int) -> Outcome:
        """``messages`` folded into ``summary`` within ``cap`` tokens, chunk by chunk (F-17); from a chunk the chain
        fails on, the rest goes to the raw archive; credentials never reach the result (F-51); a tool result that found
        nothing is left out (it is no fact). Without ``messages``, :meth:`shrink`."""
        previous_tokens = self.counter.count_text(summary.content)
        if not messages:
            return await self.shrink(summary, cap=cap)
        told = [message for message in messages if not found_nothing(message, self.empty_results)]
        if not told:
            kind = "llm" if summary.summary_type == "none" else summary.summary_type
            return Outcome(summary=_moved(summary, messages, summary.content, kind), attempts=[], degraded=False)
        transcript_tokens = self.counter.count_text(render_transcript(told))
        max_tokens = summary_output_tokens(
            previous_summary_tokens=previous_tokens,
            transcript_tokens=transcript_tokens,
            cap=cap,
            ratio=self.ratio,
        )
        budget = transcript_budget(
            previous_summary_tokens=max(cap, previous_tokens),
            max_output_tokens=reply_room(max_tokens),
            window=self.window,
            counter=self.counter,
        )
        chunks = chunk_messages(told, budget=budget, counter=self.counter)
        # The summarizer may echo a credential however it was told: its reply is redacted before use (F-51).
        secrets = secret_values([summary.content, *map(raw_text, messages)])
        content, attempts, degraded = summary.content, [], False
        for index, chunk in enumerate(chunks):
            transcript = fit_transcript(chunk, max_tokens=budget, counter=self.counter)
            result = await self.chain.run(
                SummaryRequest(
                    previous_summary=content,
                    messages=chunk,
                    prompt=build_summary_prompt(previous_summary=content, transcript=transcript, max_tokens=max_tokens),
                    max_tokens=max_tokens,
                    reply_tokens=reply_room(max_tokens),
                )
            )
            attempts.extend(result.attempts)
            if result.text is None:
                rest = [message for later in chunks[index:] for message in later]
                content = raw_archive_merge(content, rest, max_tokens=cap, counter=self.counter)
                degraded = True
                break
            content = await self._fitted(redact_values(result.text, secrets), cap, attempts)
        new = _moved(summary, messages, content, "raw" if degraded else "llm")
        return Outcome(summary=new, attempts=attempts, degraded=degraded)

    async def shrink(self, summary: Summary, *, cap: int) -> Outcome:
        """``summary`` rewritten within ``cap`` tokens by the chain (no new material), or trimmed
        without an LLM when the chain fails; boundary and count unchanged (docs/memory.md F-40)."""
        if self.counter.count_text(summary.content) <= cap:
            return Outcome(summary=summary, attempts=[], degraded=False)
        result = await self.chain.run(self._shrink_request(summary.content, cap))
        attempts = list(result.attempts)
        if result.text is None:
            content, summary_type, degraded = (
                trim_summary(summary.content, cap, self.counter),
                summary.summary_type,
                True,
            )
        else:
            text = redact_values(result.text, secret_values([summary.content]))
            content, summary_type, degraded = await self._fitted(text, cap, attempts), "llm", False
        return Outcome(
            summary=replace(summary, content=content, summary_type=summary_type),
            attempts=attempts,
            degraded=degraded,
        )

    async def _fitted(self, text: str, cap: int, attempts: list[Attempt]) -> str:
        """``text`` within ``cap`` tokens: as it is, else rewritten shorter by the chain against two thirds of the
        cap, else the shorter of the two cut at a sentence and marked. The second pass's attempts go to ``attempts``."""
        if self.counter.count_text(text) <= cap:
            return text
        result = await self.chain.run(self._shrink_request(text, cap, stated=max(16, cap * 2 // 3)))
        attempts.extend(result.attempts)
        shorter = redact_values(result.text, secret_values([text])) if result.text else text
        if self.counter.count_text(shorter) <= cap:
            return shorter
        best = min(text, shorter, key=self.counter.count_text)
        return shorten_at_sentence(best, cap, self.counter)

    def _shrink_request(self, content: str, cap: int, *, stated: int | None = None) -> SummaryRequest:
        """The request rewriting ``content`` alone, stating ``stated`` (default ``cap``) tokens, with room above it."""
        budget = stated or cap
        prompt = build_summary_prompt(previous_summary=content, transcript="", max_tokens=budget)
        prompt[-1] = {**prompt[-1], "content": f"{prompt[-1]['content']}\n{SHRINK_TRANSCRIPT}"}
        return SummaryRequest(
            previous_summary=content, messages=[], prompt=prompt, max_tokens=budget, reply_tokens=reply_room(cap)
        )
