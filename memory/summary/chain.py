"""The summarizer degradation chain (docs/memory.md §4): primary attempts, failover attempts,
each with its timeout; empty or cut-off replies count as failures."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from memory.ports import Summarizer, SummaryReply, SummaryRequest

Phase = Literal["primary", "failover"]


class SummarizerError(Exception):
    """A summarizer answered, but not with a usable summary (for example empty text)."""


class EmptySummaryError(SummarizerError):
    """The summarizer returned empty or whitespace-only text (docs/memory.md §4: a failure)."""


class TruncatedSummaryError(SummarizerError):
    """The provider cut the reply off (``finish_reason`` ``length`` or ``content_filter``): the text
    is incomplete and is never stored (docs/memory.md F-36)."""


class MarkerOnlySummaryError(SummarizerError):
    """The reply holds nothing but markers such as ``[... transcript trimmed to fit the
    summarizer ...]`` or a raw-archive heading: no fact at all (docs/memory.md F-36, F-39)."""


# Finish reasons that mean the reply was stopped before the model finished it (OpenAI
# Chat Completions; most OpenAI-compatible servers report ``length`` at the output cap).
INCOMPLETE_FINISH_REASONS = frozenset({"length", "content_filter"})


# Lines this code base writes around summaries and transcripts, never facts: the trimming marker
# of an oversized transcript (memory.prompts), raw-archive headings and omission counts
# (memory.core), the summary block header, the elision marker, and bare ellipses.
_MARKER_LINE_RE = re.compile(
    r"""^(?:
        -?\s*\[(?:\.\.\.|…)?\s*transcript\ trimmed[^\]]*\]
      | \[Raw\ archive\ of\ newly\ added\ messages\]
      | -?\s*\[\d+\ earlier\ archived\ messages\ omitted\]
      | \[Memory\ Summary\b[^\]]*\]
      | \[…\s*\d+\ tokens\ elided[^\]]*\]
      | (?:\.\.\.|…|-|\s)+
    )$""",
    re.VERBOSE | re.IGNORECASE,
)


def is_marker_line(line: str) -> bool:
    """True when ``line`` (one line of text) is a marker this code base writes, not a fact:
    ``[... transcript trimmed to fit the summarizer ...]``, ``[Raw archive of newly added
    messages]``, ``- [N earlier archived messages omitted]``, a ``[Memory Summary - …]`` header,
    an elision marker, or only dots, ellipses and dashes (docs/memory.md F-39)."""
    return bool(_MARKER_LINE_RE.match(line.strip()))


def check_reply(reply: str | SummaryReply) -> str:
    """The stripped summary text of ``reply`` when it is usable (docs/memory.md §4, F-36).

    Raises :class:`TruncatedSummaryError` when the provider cut it off (``finish_reason`` in
    :data:`INCOMPLETE_FINISH_REASONS`), :class:`EmptySummaryError` when it is not a string or is
    empty or whitespace-only, :class:`MarkerOnlySummaryError` when every non-blank line is a
    marker (:func:`is_marker_line`).
    """
    finish_reason = reply.finish_reason if isinstance(reply, SummaryReply) else None
    text = reply.text if isinstance(reply, SummaryReply) else reply
    if finish_reason in INCOMPLETE_FINISH_REASONS:
        chars = len(text) if isinstance(text, str) else 0
        raise TruncatedSummaryError(f"reply cut off by the provider (finish_reason {finish_reason!r}, {chars} chars)")
    if not isinstance(text, str) or not text.strip():
        raise EmptySummaryError("summarizer returned empty text")
    if all(is_marker_line(line) for line in text.splitlines() if line.strip()):
        raise MarkerOnlySummaryError(f"reply holds only markers: {text.strip()[:120]!r}")
    return text.strip()


# How a summarizer writes summaries (``Summarizer.method``, recorded on every attempt).
METHOD_LLM = "llm"


METHOD_EXTRACTIVE = "extractive"


def summary_kind(result_type: str, attempts: Iterable[Mapping[str, Any]]) -> str:
    """How a summary of stored type ``result_type`` (``none``, ``llm``, ``raw``) was written,
    from the summarizer ``attempts`` recorded with it (``{"ok", "method", ...}``, see
    :class:`Attempt`): :data:`METHOD_EXTRACTIVE` when it is an ``llm`` result and every successful
    attempt came from an extractive summarizer (the offline engine copies sentences: no language
    model wrote it), else ``result_type``. Attempts recorded before ``method`` existed count as
    LLM ones."""
    if result_type != "llm":
        return result_type
    methods = {str(attempt.get("method") or METHOD_LLM) for attempt in attempts if attempt.get("ok")}
    return METHOD_EXTRACTIVE if methods == {METHOD_EXTRACTIVE} else result_type


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One summarizer try: ``latency_ms`` in milliseconds, ``error`` empty on success.
    ``wait_ms``: the backoff slept just before this try, in milliseconds (0 for a layer's first
    try), so that the attempts and their waits add up to the time the chain took.
    ``method``: the summarizer's ``method`` (:data:`METHOD_LLM` or :data:`METHOD_EXTRACTIVE`)."""

    model: str
    phase: Phase
    number: int
    latency_ms: int
    ok: bool
    error: str = ""
    wait_ms: int = 0
    method: str = METHOD_LLM

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True)
class ChainResult:
    """The chain's outcome: ``text`` is None when every layer-1/2 attempt failed."""

    text: str | None
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def phase(self) -> Phase | None:
        return self.attempts[-1].phase if self.text is not None and self.attempts else None


@dataclass(frozen=True, kw_only=True)
class SummarizerChain:
    """Layers 1 and 2 of the degradation chain.

    ``attempts``: tries per layer (default 3). ``timeout``: seconds per try (default
    60), enforced here with ``asyncio.wait_for`` so it fires whatever the client does.
    ``backoff``: seconds slept before a retry, multiplied by the try number (0 in tests).
    """

    primary: Summarizer
    failover: Summarizer | None = None
    attempts: int = 3
    timeout: float = 60.0
    backoff: float = 0.5

    async def run(self, request: SummaryRequest) -> ChainResult:
        """Try primary then failover; never raises for a summarizer failure.

        A reply refused by :func:`check_reply` (cut off, empty, markers only) is a failed
        attempt like an exception: recorded with its reason, then the next attempt runs.
        Cancellation of the calling task still propagates (it is not a summarizer failure).
        """
        result = ChainResult(text=None)
        layers: list[tuple[Phase, Summarizer]] = [("primary", self.primary)]
        if self.failover is not None:
            layers.append(("failover", self.failover))
        for phase, summarizer in layers:
            method = str(getattr(summarizer, "method", METHOD_LLM))
            for number in range(1, self.attempts + 1):
                wait_ms = 0
                if number > 1 and self.backoff > 0:
                    waiting = time.perf_counter()
                    await asyncio.sleep(self.backoff * (number - 1))
                    wait_ms = _elapsed_ms(waiting)
                started = time.perf_counter()
                try:
                    reply = await asyncio.wait_for(summarizer.summarize(request), timeout=self.timeout)
                    text = check_reply(reply)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # any summarizer failure is recorded and degrades
                    result.attempts.append(
                        Attempt(
                            model=summarizer.model,
                            phase=phase,
                            number=number,
                            latency_ms=_elapsed_ms(started),
                            ok=False,
                            error=_describe(exc),
                            wait_ms=wait_ms,
                            method=method,
                        )
                    )
                    continue
                result.attempts.append(
                    Attempt(
                        model=summarizer.model,
                        phase=phase,
                        number=number,
                        latency_ms=_elapsed_ms(started),
                        ok=True,
                        wait_ms=wait_ms,
                        method=method,
                    )
                )
                result.text = text
                return result
        return result


def _elapsed_ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "TimeoutError: summarizer did not answer in time"
    message = str(exc).strip() or "(no message)"
    return f"{type(exc).__name__}: {message[:300]}"
