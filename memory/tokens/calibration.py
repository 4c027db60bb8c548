"""The token-estimate calibration rule (docs/memory.md §5 "Calibration"), pure: each call reporting
``usage.prompt_tokens`` gives a sample ``prompt_tokens / estimate``; the model's factor follows them, up fast (an
underestimate overflows the window), down slowly (an overestimate only wastes room). The budget multiplies by it."""

from __future__ import annotations

from dataclasses import dataclass, replace

# The factor's bounds: a tokenizer off by more than this is a configuration error, not a drift.
MIN_FACTOR = 0.5
MAX_FACTOR = 2.0
# Smaller requests teach nothing: per-message overheads and the reply priming, counted differently, dominate them.
MIN_SAMPLE_TOKENS = 256
# A sample this many times beyond the bounds measures something else (a provider counting otherwise): ignored.
OUTLIER_MARGIN = 2.0
# Share of the distance to a sample the factor moves: up fast, down slowly.
RAISE_WEIGHT = 0.5
LOWER_WEIGHT = 0.2
# Stored factors are rounded to this many decimals (a stable figure for the inspector).
FACTOR_DECIMALS = 4


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """One model's calibration: ``factor`` (provider tokens per estimated token, 1.0 at first), ``samples`` moving it."""

    model: str
    factor: float = 1.0
    samples: int = 0


def clamp_factor(factor: float) -> float:
    return min(MAX_FACTOR, max(MIN_FACTOR, factor))


def sample_ratio(*, estimated_tokens: int, prompt_tokens: int | None) -> float | None:
    """One call's sample ``prompt_tokens / estimated_tokens``, or None: no figure, a request under
    :data:`MIN_SAMPLE_TOKENS`, or an outlier."""
    if prompt_tokens is None or prompt_tokens <= 0 or estimated_tokens < MIN_SAMPLE_TOKENS:
        return None
    ratio = prompt_tokens / estimated_tokens
    if not MIN_FACTOR / OUTLIER_MARGIN <= ratio <= MAX_FACTOR * OUTLIER_MARGIN:
        return None
    return ratio


def calibration_observe(current: Calibration, *, estimated_tokens: int, prompt_tokens: int | None) -> Calibration:
    """``current`` moved towards one call's clamped sample (itself without one): :data:`RAISE_WEIGHT` of the way up or
    :data:`LOWER_WEIGHT` down, so a steady ratio is approached geometrically."""
    ratio = sample_ratio(estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens)
    if ratio is None:
        return current
    target = clamp_factor(ratio)
    weight = RAISE_WEIGHT if target > current.factor else LOWER_WEIGHT
    factor = clamp_factor(round(current.factor + weight * (target - current.factor), FACTOR_DECIMALS))
    return replace(current, factor=factor, samples=current.samples + 1)
