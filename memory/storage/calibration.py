"""The per-model estimate calibration in the database (docs/memory.md §5, "Calibration")."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from memory.models import TokenCalibration
from memory.tokens import calibration


def token_calibration_get(*, model: str) -> calibration.Calibration:
    """``model``'s stored calibration, else factor 1.0 with no samples. One SELECT."""
    row = TokenCalibration.objects.filter(model=model).first()
    return calibration.Calibration(model=model) if row is None else row.as_calibration()


def token_calibration_record(
    *, model: str, estimated_tokens: int, prompt_tokens: int | None
) -> calibration.Calibration:
    """Move ``model``'s calibration by one call's sample (:func:`memory.tokens.calibration.calibration_observe`; no
    sample, no write) under a row lock (SQLite: the write lock), so every worker's calls count. Returns it."""
    if calibration.sample_ratio(estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens) is None:
        return token_calibration_get(model=model)
    with transaction.atomic():
        row = TokenCalibration.objects.select_for_update().filter(model=model).first()
        current = calibration.Calibration(model=model) if row is None else row.as_calibration()
        moved = calibration.calibration_observe(current, estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens)
        if row is None:
            try:
                with transaction.atomic():
                    TokenCalibration.objects.create(model=model, factor=moved.factor, samples=moved.samples)
            except IntegrityError:  # another worker stored the first sample meanwhile: count ours on top
                row = TokenCalibration.objects.select_for_update().get(model=model)
                moved = calibration.calibration_observe(
                    row.as_calibration(), estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens
                )
        if row is not None:
            TokenCalibration.objects.filter(pk=row.pk).update(
                factor=moved.factor, samples=moved.samples, updated_at=timezone.now()
            )
        return moved
