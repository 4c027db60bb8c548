"""The token-estimate calibration rule, pure; its figures and their reasons are docs/memory.md §5 "Calibration"."""

from __future__ import annotations

from dataclasses import dataclass, replace

MIN_FACTOR = 0.5
MAX_FACTOR = 2.0
MIN_SAMPLE_TOKENS = 256
OUTLIER_MARGIN = 2.0
RAISE_WEIGHT = 0.5
LOWER_WEIGHT = 0.2
FACTOR_DECIMALS = 4


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """One model's calibration: ``factor`` (provider tokens per estimated token, 1.0 at first) and its ``samples``."""

    model: str
    factor: float = 1.0
    samples: int = 0


def clamp_factor(factor: float) -> float:
    return min(MAX_FACTOR, max(MIN_FACTOR, factor))


def sample_ratio(*, estimated_tokens: int, prompt_tokens: int | None) -> float | None:
    """One call's ``prompt_tokens / estimated_tokens``, or None: no figure, too small a request, or an outlier."""
    if prompt_tokens is None or prompt_tokens <= 0 or estimated_tokens < MIN_SAMPLE_TOKENS:
        return None
    ratio = prompt_tokens / estimated_tokens
    if not MIN_FACTOR / OUTLIER_MARGIN <= ratio <= MAX_FACTOR * OUTLIER_MARGIN:
        return None
    return ratio


def calibration_observe(current: Calibration, *, estimated_tokens: int, prompt_tokens: int | None) -> Calibration:
    """``current`` moved towards one call's clamped sample (itself without one), faster up than down."""
    ratio = sample_ratio(estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens)
    if ratio is None:
        return current
    target = clamp_factor(ratio)
    weight = RAISE_WEIGHT if target > current.factor else LOWER_WEIGHT
    factor = clamp_factor(round(current.factor + weight * (target - current.factor), FACTOR_DECIMALS))
    return replace(current, factor=factor, samples=current.samples + 1)
