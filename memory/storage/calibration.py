"""The per-model estimate calibration in the database (docs/memory.md §5, "Calibration")."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from memory.models import TokenCalibration
from memory.tokens import calibration


def token_calibration_get(*, model: str) -> calibration.Calibration:
    """The estimate calibration of chat model ``model`` (docs/memory.md §5, "Calibration"):
    the stored one, or factor 1.0 with no samples when none is stored. One SELECT."""
    row = TokenCalibration.objects.filter(model=model).first()
    return calibration.Calibration(model=model) if row is None else row.as_calibration()


def token_calibration_record(
    *, model: str, estimated_tokens: int, prompt_tokens: int | None
) -> calibration.Calibration:
    """Move ``model``'s calibration by one chat call: ``estimated_tokens`` our estimate of the
    request sent, ``prompt_tokens`` the provider's ``usage.prompt_tokens`` (None: not reported).
    The rule is :func:`memory.calibration.calibration_observe`; a call that gives no sample (no
    figure, a tiny request, an outlier) writes nothing. The row is read and written in one
    transaction under a row lock (SQLite: the transaction's write lock, taken at its start), so
    calls on several workers all count. Returns the calibration now."""
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
