"""A compression's summarizer attempts as the inspector lists them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class AttemptStep:
    """A summarizer try (``kind`` ``try``; ``error_index``: 1-based into :attr:`AttemptLog.errors`
    when it has several) or the backoff wait before one (``wait``); ``ms`` milliseconds."""

    kind: str
    ms: int
    number: int = 0
    ok: bool = True
    error_index: int | None = None


@dataclass(frozen=True, kw_only=True)
class AttemptGroup:
    """Consecutive tries of one summarizer (``phase`` ``primary`` or ``failover``) and their waits."""

    phase: str
    model: str
    steps: list[AttemptStep]


@dataclass(frozen=True, kw_only=True)
class ErrorLine:
    text: str
    count: int


@dataclass(frozen=True, kw_only=True)
class AttemptLog:
    """Each distinct error once, the tries and waits in order, and milliseconds that add up:
    ``total_ms = tries_ms + waits_ms + other_ms`` (``other_ms``: the rest of the recorded duration)."""

    groups: list[AttemptGroup]
    errors: list[ErrorLine]
    tries: int
    failed: int
    tries_ms: int
    waits_ms: int
    other_ms: int

    @property
    def total_ms(self) -> int:
        return self.tries_ms + self.waits_ms + self.other_ms


# The provider's message quoted in an endpoint's error may name the engine again; a URL label never matches.
_REPEATED_LABEL = re.compile(r"^(?P<head>(?:\w+: )?(?:The )?(?P<label>[^:]+?) [^:]*?: )(?P=label): ", re.IGNORECASE)


def error_text(text: str) -> str:
    """``text`` with the engine's name said once (``...HTTP 500: offline engine: x`` -> ``...HTTP 500: x``)."""
    return _REPEATED_LABEL.sub(r"\g<head>", text, count=1)


def attempt_log_build(attempts: Iterable[dict[str, Any]], *, duration_ms: int) -> AttemptLog:
    """The log of an event's ``attempts`` (``Attempt.as_dict()`` rows). A try numbered 1, or of another
    phase or model, starts a group (chunked transcripts); ``other_ms`` is never below 0."""
    rows = list(attempts)
    distinct: dict[str, int] = {}
    for row in rows:
        if not row.get("ok"):
            error = error_text(str(row.get("error") or "(no message)"))
            distinct[error] = distinct.get(error, 0) + 1
    numbered = len(distinct) > 1
    indexes = {error: index for index, error in enumerate(distinct, 1)}
    groups: list[AttemptGroup] = []
    for row in rows:
        phase, model, number = str(row.get("phase") or ""), str(row.get("model") or ""), int(row.get("number") or 0)
        last = groups[-1] if groups else None
        if last is None or number <= 1 or (last.phase, last.model) != (phase, model):
            last = AttemptGroup(phase=phase, model=model, steps=[])
            groups.append(last)
        wait_ms = int(row.get("wait_ms") or 0)
        if wait_ms > 0:
            last.steps.append(AttemptStep(kind="wait", ms=wait_ms))
        ok = bool(row.get("ok"))
        error_index = None if ok else indexes.get(error_text(str(row.get("error") or "(no message)")))
        last.steps.append(
            AttemptStep(
                kind="try",
                ms=int(row.get("latency_ms") or 0),
                number=number,
                ok=ok,
                error_index=error_index if numbered else None,
            )
        )
    tries_ms = sum(int(row.get("latency_ms") or 0) for row in rows)
    waits_ms = sum(int(row.get("wait_ms") or 0) for row in rows)
    return AttemptLog(
        groups=groups,
        errors=[ErrorLine(text=text, count=count) for text, count in distinct.items()],
        tries=len(rows),
        failed=sum(distinct.values()),
        tries_ms=tries_ms,
        waits_ms=waits_ms,
        other_ms=max(0, duration_ms - tries_ms - waits_ms),
    )
