"""The token-estimate calibration rule (docs/memory.md §5, "Calibration"): pure, no ORM, no I/O.

Our estimate counts with tiktoken (:mod:`memory.tokens`); a model whose tokenizer differs (an
``o200k`` model counted with ``cl100k_base``, a local model with its own vocabulary) sees the same
request as more or fewer tokens. Each chat call that reports ``usage.prompt_tokens`` gives one
sample ``ratio = prompt_tokens / estimate`` of the exact request sent; the per-model ``factor``
follows the samples, raising fast (an underestimate overflows the window) and lowering slowly
(an overestimate only wastes room), always within ``[MIN_FACTOR, MAX_FACTOR]``. The budget then
treats a request estimated at ``E`` tokens as ``E × factor`` (:attr:`memory.budget.MemoryBudget.token_factor`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# The factor's bounds: a tokenizer off by more than this is a configuration error, not a drift.
MIN_FACTOR = 0.5
MAX_FACTOR = 2.0
# Requests estimated under this many tokens teach nothing: per-message overheads and the reply
# priming, which providers count differently, dominate a tiny request.
MIN_SAMPLE_TOKENS = 256
# A sample this far outside the bounds (ratio below MIN_FACTOR / 2 or above MAX_FACTOR * 2) does
# not measure the same request (a provider counting something else): it is ignored.
OUTLIER_MARGIN = 2.0
# Share of the distance to a sample the factor moves: up fast, down slowly.
RAISE_WEIGHT = 0.5
LOWER_WEIGHT = 0.2
# Stored factors are rounded to this many decimals (a stable figure for the inspector).
FACTOR_DECIMALS = 4


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The estimate calibration of one model: ``factor`` (provider tokens per estimated token,
    1.0 before any sample) and ``samples`` (how many calls moved it)."""

    model: str
    factor: float = 1.0
    samples: int = 0


def clamp_factor(factor: float) -> float:
    """``factor`` within ``[MIN_FACTOR, MAX_FACTOR]``."""
    return min(MAX_FACTOR, max(MIN_FACTOR, factor))


def sample_ratio(*, estimated_tokens: int, prompt_tokens: int | None) -> float | None:
    """The sample one call gives (``prompt_tokens / estimated_tokens``, both in tokens), or None
    when it gives none: no figure reported, a request estimated under :data:`MIN_SAMPLE_TOKENS`,
    or a ratio outside the bounds by more than :data:`OUTLIER_MARGIN` times."""
    if prompt_tokens is None or prompt_tokens <= 0 or estimated_tokens < MIN_SAMPLE_TOKENS:
        return None
    ratio = prompt_tokens / estimated_tokens
    if not MIN_FACTOR / OUTLIER_MARGIN <= ratio <= MAX_FACTOR * OUTLIER_MARGIN:
        return None
    return ratio


def calibration_observe(current: Calibration, *, estimated_tokens: int, prompt_tokens: int | None) -> Calibration:
    """``current`` moved towards the sample of one call (see :func:`sample_ratio`); ``current``
    itself when the call gives no sample. The sample is clamped to the bounds first; the factor
    moves :data:`RAISE_WEIGHT` of the way up to it, or :data:`LOWER_WEIGHT` of the way down, so a
    steady ratio ``r`` is approached geometrically (after ``n`` samples the distance left is
    ``(1 - weight) ** n`` of the first)."""
    ratio = sample_ratio(estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens)
    if ratio is None:
        return current
    target = clamp_factor(ratio)
    weight = RAISE_WEIGHT if target > current.factor else LOWER_WEIGHT
    factor = clamp_factor(round(current.factor + weight * (target - current.factor), FACTOR_DECIMALS))
    return replace(current, factor=factor, samples=current.samples + 1)
