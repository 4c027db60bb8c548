"""The request's size against the context window: the gauge, its sections and the estimate check (tokens)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The gauge's level (Gauge.level) in words: the bar's colour and pattern never say it alone.
GAUGE_LEVEL_LABELS = {
    "low": "under the target",
    "mid": "over the target",
    "high": "over the trigger",
    "over": "over the context window",
}


@dataclass(frozen=True, kw_only=True)
class Gauge:
    """The request size against the context window; all figures in tokens."""

    used: int
    context_window: int
    trigger_tokens: int
    target_tokens: int

    @property
    def used_percent(self) -> float:
        """``used`` as a share of the window, capped at 100 (for the bar's width)."""
        return min(100.0, percent(self.used, self.context_window))

    @property
    def trigger_percent(self) -> float:
        return percent(self.trigger_tokens, self.context_window)

    @property
    def target_percent(self) -> float:
        return percent(self.target_tokens, self.context_window)

    @property
    def level(self) -> str:
        """``low`` (at most the target), ``mid`` (up to the trigger), ``high`` (over the trigger,
        within the window) or ``over`` (over the window): the gauge's colour and pattern."""
        if self.used > self.context_window:
            return "over"
        if self.used > self.trigger_tokens:
            return "high"
        if self.used > self.target_tokens:
            return "mid"
        return "low"

    @property
    def level_label(self) -> str:
        """:attr:`level` in words (``under the target``, ``over the target``, ``over the
        trigger``, ``over the context window``), shown beside the bar and read by screen readers."""
        return GAUGE_LEVEL_LABELS[self.level]

    @property
    def value_text(self) -> str:
        """The whole gauge in one sentence for assistive technology (the meter's
        ``aria-valuetext``): used and window, the level, then the marks with their figures."""
        return (
            f"{self.used:,} of {self.context_window:,} tokens, {self.level_label}; "
            f"target {self.target_tokens:,}, trigger {self.trigger_tokens:,}, window {self.context_window:,}"
        )


@dataclass(frozen=True, kw_only=True)
class Section:
    """One part of a request: ``tokens`` as the engine counted them, ``percent`` of the context
    window, ``text`` the exact text sent (``""`` for the free space and the reply priming)."""

    key: str
    label: str
    tokens: int
    percent: float
    text: str = ""
    message_count: int = 0


@dataclass(frozen=True, kw_only=True)
class EstimateCheck:
    """Our estimate of one request against the provider's ``usage.prompt_tokens`` and the
    calibration the request was budgeted with (docs/memory.md §5, "Calibration"); tokens.

    ``estimated_tokens``: the engine's estimate; ``prompt_tokens``: the provider's figure (None
    until the reply ended, or when it reports none); ``factor``: provider tokens per estimated
    token the budget applied; ``context_window`` the model's window and ``window_tokens`` the
    same in estimated tokens; ``enabled``: ``LLM_TOKEN_CALIBRATION``; ``offline``: the offline
    engine, which counts with our own tokenizer, so the page shows no comparison; ``recorded``:
    the call was recorded with its calibration (False for calls older than calibration)."""

    estimated_tokens: int
    prompt_tokens: int | None
    factor: float = 1.0
    context_window: int
    window_tokens: int
    enabled: bool = False
    offline: bool = False
    recorded: bool = False

    @property
    def shown(self) -> bool:
        """Whether the page compares the figures: not for the offline engine."""
        return not self.offline

    @property
    def ratio(self) -> float | None:
        """This request's provider figure per estimated token (None when not reported)."""
        if self.prompt_tokens is None or self.estimated_tokens <= 0:
            return None
        return self.prompt_tokens / self.estimated_tokens

    @property
    def difference(self) -> int | None:
        """Provider-reported minus estimated tokens (None when not reported)."""
        return None if self.prompt_tokens is None else self.prompt_tokens - self.estimated_tokens


def estimate_check_build(
    calibration: dict[str, Any] | None, *, estimated_tokens: int, prompt_tokens: int | None, context_window: int
) -> EstimateCheck:
    """The :class:`EstimateCheck` of a request from the ``calibration`` its record or its
    ``memory.context`` event carries (``{factor, window_tokens, enabled, offline}``, see
    :func:`chatapp.llm.calibration.calibration_report`; None for calls older than calibration)."""
    calibration = calibration or {}
    return EstimateCheck(
        estimated_tokens=estimated_tokens,
        prompt_tokens=prompt_tokens,
        factor=float(calibration.get("factor") or 1.0),
        context_window=context_window,
        window_tokens=int(calibration.get("window_tokens") or context_window),
        enabled=bool(calibration.get("enabled")),
        offline=bool(calibration.get("offline")),
        recorded=bool(calibration),
    )


def percent(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole > 0 else 0.0
