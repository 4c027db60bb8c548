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
        return min(100.0, percent(self.used, self.context_window))

    @property
    def trigger_percent(self) -> float:
        return percent(self.trigger_tokens, self.context_window)

    @property
    def target_percent(self) -> float:
        return percent(self.target_tokens, self.context_window)

    @property
    def level(self) -> str:
        """``low`` (at most the target), ``mid`` (to the trigger), ``high`` (to the window) or ``over``."""
        if self.used > self.context_window:
            return "over"
        if self.used > self.trigger_tokens:
            return "high"
        if self.used > self.target_tokens:
            return "mid"
        return "low"

    @property
    def level_label(self) -> str:
        return GAUGE_LEVEL_LABELS[self.level]

    @property
    def value_text(self) -> str:
        """The whole gauge in one sentence: the meter's ``aria-valuetext``."""
        return (
            f"{self.used:,} of {self.context_window:,} tokens, {self.level_label}; "
            f"target {self.target_tokens:,}, trigger {self.trigger_tokens:,}, window {self.context_window:,}"
        )


@dataclass(frozen=True, kw_only=True)
class Section:
    """One part of a request: the engine's ``tokens``, ``percent`` of the window, the exact ``text`` sent."""

    key: str
    label: str
    tokens: int
    percent: float
    text: str = ""
    message_count: int = 0


# What each request shape a server refused (chatapp.llm.clients.refused_shapes) changed, in words.
ADAPTED_WORDS = {
    "null_content": 'tool-call messages go with content "" (it refused null)',
    "stream_options": "usage is not asked for (it refused stream_options)",
    "json_schema": "key facts are asked as json_object (it refused json_schema)",
    "json_object": "key facts are asked for JSON in words (it refused json_object)",
    "streamed_tools": "requests with tools go whole, not streamed (it streamed them empty)",
}


@dataclass(frozen=True, kw_only=True)
class EstimateCheck:
    """Our estimate of one request against the provider's ``prompt_tokens`` (None until reported) and
    the calibration it was budgeted with (docs/memory.md §5, "Calibration"); ``window_tokens`` is the
    window in estimated tokens; ``recorded``: the call kept its calibration. Tokens. ``usage_missing``: why no
    figure came (``not reported``, ``not asked``); ``adapted``: request shapes the server was found to refuse."""

    estimated_tokens: int
    prompt_tokens: int | None
    factor: float = 1.0
    context_window: int
    window_tokens: int
    enabled: bool = False
    offline: bool = False
    recorded: bool = False
    usage_missing: str = ""
    adapted: tuple[str, ...] = ()

    @property
    def adapted_words(self) -> list[str]:
        return [ADAPTED_WORDS.get(shape, shape) for shape in self.adapted]

    @property
    def shown(self) -> bool:
        """The offline engine counts with our own tokenizer: nothing to compare."""
        return not self.offline

    @property
    def ratio(self) -> float | None:
        if self.prompt_tokens is None or self.estimated_tokens <= 0:
            return None
        return self.prompt_tokens / self.estimated_tokens

    @property
    def difference(self) -> int | None:
        return None if self.prompt_tokens is None else self.prompt_tokens - self.estimated_tokens


def estimate_check_build(
    calibration: dict[str, Any] | None, *, estimated_tokens: int, prompt_tokens: int | None, context_window: int
) -> EstimateCheck:
    """From the ``calibration`` a call or ``memory.context`` event carries (``calibration_report``; None if older)."""
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
        usage_missing=str(calibration.get("usage") or ""),
        adapted=tuple(str(shape) for shape in calibration.get("adapted") or ()),
    )


def percent(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole > 0 else 0.0
