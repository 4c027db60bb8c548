"""The chat model's token-estimate calibration (docs/memory.md §5, "Calibration"), per endpoint.

The rule and its storage are the memory engine's; this module says when it applies: to a chat
endpoint that is not the offline engine (which counts with our own tokenizer) while
``LLM_TOKEN_CALIBRATION`` is on."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from chatapp.llm.clients import Endpoint


def calibration_applies(endpoint: Endpoint) -> bool:
    """Whether ``endpoint``'s calls calibrate the estimate and its budget uses the factor."""
    return bool(settings.LLM_TOKEN_CALIBRATION) and not endpoint.offline


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


def usage_missing_recorded(context: dict[str, Any], missing: str) -> dict[str, Any]:
    """A model call's recorded ``context`` whose calibration also says why the call taught it
    nothing: ``usage`` is ``missing`` (``not reported``, ``not asked``), as the stream said."""
    return {**context, "calibration": {**(context.get("calibration") or {}), "usage": missing}}
