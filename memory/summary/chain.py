"""The summarizer degradation chain (docs/memory.md §4): primary, then failover attempts, each with its timeout."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from memory.ports import Summarizer, SummaryReply, SummaryRequest
from memory.summary.prompts import restated_budget, stated_budget

Phase = Literal["primary", "failover"]


class SummarizerError(Exception):
    """A summarizer answered, but not with a usable summary."""


class EmptySummaryError(SummarizerError):
    """Empty or whitespace-only text (docs/memory.md §4: a failure)."""


class TruncatedSummaryError(SummarizerError):
    """The provider cut the reply off: incomplete text is never stored (docs/memory.md F-36)."""


class MarkerOnlySummaryError(SummarizerError):
    """Nothing but markers such as a transcript-trimmed note or a raw-archive heading (F-36, F-39)."""


# Finish reasons of a reply stopped before the model finished it (``length`` at the output cap).
INCOMPLETE_FINISH_REASONS = frozenset({"length", "content_filter"})


# Lines this code base writes around summaries and transcripts (trim marker, archive headings, block headers).
_MARKER_LINE_RE = re.compile(
    r"""^(?:
        -?\s*\[(?:\.\.\.|…)?\s*transcript\ trimmed[^\]]*\]
      | \[Raw\ archive\ of\ newly\ added\ messages\]
      | -?\s*\[\d+\ earlier\ archived\ messages\ omitted\]
      | \[Memory\ Summary\b[^\]]*\]
      | \[…\s*\d+\ tokens\ elided[^\]]*\]
      | \[…[^\]]*\bto\ fit\ the\ summary\ cap\]
      | (?:\.\.\.|…|-|\s)+
    )$""",
    re.VERBOSE | re.IGNORECASE,
)


def is_marker_line(line: str) -> bool:
    """Whether ``line`` is such a marker, or only dots, ellipses and dashes: not a fact (F-39)."""
    return bool(_MARKER_LINE_RE.match(line.strip()))


def check_reply(reply: str | SummaryReply) -> str:
    """``reply``'s stripped text when usable (docs/memory.md §4, F-36). Raises :class:`TruncatedSummaryError`,
    :class:`EmptySummaryError` or :class:`MarkerOnlySummaryError`."""
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
    """``result_type`` (``none``, ``llm``, ``raw``), or :data:`METHOD_EXTRACTIVE` when every successful attempt
    was extractive: no language model wrote it (attempts without ``method`` count as LLM ones)."""
    if result_type != "llm":
        return result_type
    methods = {str(attempt.get("method") or METHOD_LLM) for attempt in attempts if attempt.get("ok")}
    return METHOD_EXTRACTIVE if methods == {METHOD_EXTRACTIVE} else result_type


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One summarizer try; ``wait_ms``, the backoff slept before it, makes the tries add up to the chain's time."""

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
    """Layers 1 and 2 of the degradation chain: ``attempts`` per layer, ``timeout`` seconds per try (enforced
    here, whatever the client does), ``backoff`` seconds times the try number before a retry."""

    primary: Summarizer
    failover: Summarizer | None = None
    attempts: int = 3
    timeout: float = 60.0
    backoff: float = 0.5

    async def run(self, request: SummaryRequest) -> ChainResult:
        """Primary then failover; a refused reply fails its attempt, and after a reply the provider cut off the
        next attempt states a tighter budget (:func:`tightened`). Never raises but for cancellation."""
        result = ChainResult(text=None)
        layers: list[tuple[Phase, Summarizer]] = [("primary", self.primary)]
        if self.failover is not None:
            layers.append(("failover", self.failover))
        for phase, summarizer in layers:
            method = str(getattr(summarizer, "method", METHOD_LLM))
            asked = request
            for number in range(1, self.attempts + 1):
                wait_ms = 0
                if number > 1 and self.backoff > 0:
                    waiting = time.perf_counter()
                    await asyncio.sleep(self.backoff * (number - 1))
                    wait_ms = _elapsed_ms(waiting)
                started = time.perf_counter()
                try:
                    reply = await asyncio.wait_for(summarizer.summarize(asked), timeout=self.timeout)
                    text = check_reply(reply)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # any summarizer failure is recorded and degrades
                    if isinstance(exc, TruncatedSummaryError):
                        asked = tightened(asked)
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


def tightened(request: SummaryRequest) -> SummaryRequest:
    """``request`` stating two thirds of its budget (at least 16 tokens), the provider's limit unchanged: a model
    that overran its budget past that limit gets a target it can meet. Unchanged when the prompt states none."""
    stated = stated_budget(request.prompt)
    if stated is None:
        return request
    return replace(request, prompt=restated_budget(request.prompt, max(16, stated * 2 // 3)))


def _elapsed_ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "TimeoutError: summarizer did not answer in time"
    message = str(exc).strip() or "(no message)"
    return f"{type(exc).__name__}: {message[:300]}"
