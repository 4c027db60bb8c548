"""Summarizer interface and the degradation chain (docs/memory.md §4).

layer 1: the primary summarizer, up to ``attempts`` tries, each under its own timeout;
layer 2: the failover summarizer, up to ``attempts`` more (skipped when none is configured);
layer 3: the raw archive, which needs no LLM and cannot fail (built by the caller from
``memory.core``). Empty or whitespace-only output counts as a failure. Every try is recorded as an
:class:`Attempt`. Nothing here writes any state: the caller persists only after this returns.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Phase = Literal["primary", "failover"]


class SummarizerError(Exception):
    """A summarizer answered, but not with a usable summary (for example empty text)."""


class EmptySummaryError(SummarizerError):
    """The summarizer returned empty or whitespace-only text (docs/memory.md §4: a failure)."""


@dataclass(frozen=True, kw_only=True)
class SummaryRequest:
    """One summarizer call.

    ``previous_summary``: the old summary text, ``""`` on a session's first compression.
    ``messages``: the prefix being folded in, OpenAI wire dicts (they may carry an ``id`` key).
    ``prompt``: the ready wire prompt, ``[system instructions, user transcript]`` (docs/memory.md F-11).
    ``max_tokens``: the output cap in tokens (30 % rule and hard cap already applied).
    """

    previous_summary: str
    messages: list[dict[str, Any]]
    prompt: list[dict[str, Any]]
    max_tokens: int


@runtime_checkable
class Summarizer(Protocol):
    """Anything that turns a :class:`SummaryRequest` into summary text.

    ``model`` names it in attempt records. ``summarize`` returns the new self-contained summary
    text; it may raise any exception, which the chain records as a failed attempt.
    """

    model: str

    async def summarize(self, request: SummaryRequest) -> str: ...


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One summarizer try: ``latency_ms`` in milliseconds, ``error`` empty on success."""

    model: str
    phase: Phase
    number: int
    latency_ms: int
    ok: bool
    error: str = ""

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

        Cancellation of the calling task still propagates (it is not a summarizer failure).
        """
        result = ChainResult(text=None)
        layers: list[tuple[Phase, Summarizer]] = [("primary", self.primary)]
        if self.failover is not None:
            layers.append(("failover", self.failover))
        for phase, summarizer in layers:
            for number in range(1, self.attempts + 1):
                if number > 1 and self.backoff > 0:
                    await asyncio.sleep(self.backoff * (number - 1))
                started = time.perf_counter()
                try:
                    text = await asyncio.wait_for(summarizer.summarize(request), timeout=self.timeout)
                    if not isinstance(text, str) or not text.strip():
                        raise EmptySummaryError("summarizer returned empty text")
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
                        )
                    )
                    continue
                result.attempts.append(
                    Attempt(
                        model=summarizer.model, phase=phase, number=number, latency_ms=_elapsed_ms(started), ok=True
                    )
                )
                result.text = text.strip()
                return result
        return result


def _elapsed_ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "TimeoutError: summarizer did not answer in time"
    message = str(exc).strip() or "(no message)"
    return f"{type(exc).__name__}: {message[:300]}"
