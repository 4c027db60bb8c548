"""A compression's summarizer attempts as the inspector lists them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class AttemptStep:
    """One entry of an :class:`AttemptLog`: a summarizer try (``kind`` ``try``: its ``number``
    in its layer, ``ok``, and for a failed one ``error_index``, the 1-based position of its error
    in :attr:`AttemptLog.errors` when the log has several) or the backoff wait before one
    (``kind`` ``wait``). ``ms``: milliseconds."""

    kind: str
    ms: int
    number: int = 0
    ok: bool = True
    error_index: int | None = None


@dataclass(frozen=True, kw_only=True)
class AttemptGroup:
    """Consecutive tries of one summarizer: ``phase`` ``primary`` or ``failover``, its ``model``,
    and its tries with the waits between them, in order."""

    phase: str
    model: str
    steps: list[AttemptStep]


@dataclass(frozen=True, kw_only=True)
class ErrorLine:
    """One distinct error of an :class:`AttemptLog` and how many tries failed with it."""

    text: str
    count: int


@dataclass(frozen=True, kw_only=True)
class AttemptLog:
    """A compression's summarizer attempts as the inspector lists them: each distinct error once
    (``errors``, first seen first), the tries and backoff waits in order (``groups``), and
    milliseconds that add up: ``total_ms = tries_ms + waits_ms + other_ms``, where ``other_ms`` is
    the rest of the compression's recorded duration (transcript, raw archive, bookkeeping; also
    the waits of attempts recorded before waits were)."""

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


# An endpoint's error names the endpoint, then quotes the provider's message, which may name the
# same engine again ("LLMError: The offline engine failed with HTTP 500: offline engine: ...",
# after the exception's class as the summarizer records it). A label with a colon (an endpoint's
# URL) never matches.
_REPEATED_LABEL = re.compile(r"^(?P<head>(?:\w+: )?(?:The )?(?P<label>[^:]+?) [^:]*?: )(?P=label): ", re.IGNORECASE)


def error_text(text: str) -> str:
    """A summarizer error as the inspector shows it: ``text`` with the engine's name said once
    (``LLMError: The offline engine failed with HTTP 500: injected`` for ``... HTTP 500: offline
    engine: injected``); any other text unchanged. Pure."""
    return _REPEATED_LABEL.sub(r"\g<head>", text, count=1)


def attempt_log_build(attempts: Iterable[dict[str, Any]], *, duration_ms: int) -> AttemptLog:
    """The :class:`AttemptLog` of a compression event's ``attempts`` (``{"model", "phase",
    "number", "latency_ms", "ok", "error", "wait_ms"}``, :class:`memory.summarizer.Attempt`) and
    its ``duration_ms``. Pure. A try numbered 1, or of another phase or model, starts a new group
    (a long transcript is summarized in chunks, each with its own tries). When the parts add up to
    more than ``duration_ms`` (an event that recorded no duration, or rounding to whole
    milliseconds), ``other_ms`` is 0 and the total is the parts' sum. Errors are tidied by
    :func:`error_text`."""
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
