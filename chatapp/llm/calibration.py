"""When the chat model's token-estimate calibration applies (docs/memory.md §5): never to the offline engine."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from chatapp.llm.clients import Endpoint


def calibration_applies(endpoint: Endpoint) -> bool:
    return bool(settings.LLM_TOKEN_CALIBRATION) and not endpoint.offline


def calibration_report(endpoint: Endpoint, *, token_factor: float, window_tokens: int) -> dict[str, Any]:
    return {
        "factor": token_factor,
        "window_tokens": window_tokens,
        "enabled": bool(settings.LLM_TOKEN_CALIBRATION),
        "offline": endpoint.offline,
    }


def server_facts_recorded(context: dict[str, Any], *, missing: str, adapted: frozenset[str]) -> dict[str, Any] | None:
    """A model call's recorded ``context`` whose calibration also says why the call taught it nothing (``usage``:
    ``not reported`` or ``not asked``, as the stream said) and which request shapes the server was found to refuse
    (``adapted``, sorted shape names of :func:`chatapp.llm.clients.refused_shapes`); None when neither applies."""
    if not missing and not adapted:
        return None
    calibration = {**(context.get("calibration") or {})}
    if missing:
        calibration["usage"] = missing
    if adapted:
        calibration["adapted"] = sorted(adapted)
    return {**context, "calibration": calibration}
