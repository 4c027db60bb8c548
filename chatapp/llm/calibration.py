"""The chat model's token-estimate calibration (docs/memory.md §5, "Calibration"), per endpoint.

The rule and its storage are the memory app's (:mod:`memory.calibration`,
:func:`memory.api.token_calibration_record`); this module says when it applies. It applies to a
chat endpoint that is not the offline engine (which counts with our own tokenizer, so its
figure always equals the estimate) while ``LLM_TOKEN_CALIBRATION`` is on. Calibrations are kept
per model name. The functions are synchronous ORM code: call them through
:func:`chatapp.orm_threads.orm_async` from async code.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from chatapp.llm.clients import Endpoint
from memory.api import Calibration, token_calibration_get, token_calibration_record


def calibration_applies(endpoint: Endpoint) -> bool:
    """Whether ``endpoint``'s calls calibrate the estimate and its budget uses the factor."""
    return bool(settings.LLM_TOKEN_CALIBRATION) and not endpoint.offline


def token_factor_get(*, endpoint: Endpoint) -> float:
    """The factor ``endpoint``'s budget applies (provider tokens per estimated token): the
    stored one, or 1.0 when calibration does not apply (no query then) or nothing is stored."""
    if not calibration_applies(endpoint):
        return 1.0
    return token_calibration_get(model=endpoint.model).factor


def token_calibration_observe(
    *, endpoint: Endpoint, estimated_tokens: int, prompt_tokens: int | None
) -> Calibration | None:
    """Count one chat call of ``endpoint`` (``estimated_tokens``: our estimate of the request
    sent; ``prompt_tokens``: the provider's figure, None when it sent none) and return the
    model's calibration now; None when calibration does not apply (nothing read or written)."""
    if not calibration_applies(endpoint):
        return None
    return token_calibration_record(
        model=endpoint.model, estimated_tokens=estimated_tokens, prompt_tokens=prompt_tokens
    )


def calibration_report(endpoint: Endpoint, *, token_factor: float, window_tokens: int) -> dict[str, Any]:
    """What a model call's record and ``memory.context`` say about calibration: ``factor`` the
    budget applied, ``window_tokens`` the window in estimated tokens, ``enabled``
    (``LLM_TOKEN_CALIBRATION``) and ``offline`` (the offline engine: the provider's figure is our
    own estimate, so the inspector shows no comparison)."""
    return {
        "factor": token_factor,
        "window_tokens": window_tokens,
        "enabled": bool(settings.LLM_TOKEN_CALIBRATION),
        "offline": endpoint.offline,
    }
