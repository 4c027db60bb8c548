"""Rate limits per owner and per client address on sending messages and uploading documents (docs/configuration.md
"Rate limits"), counted in fixed windows in Django's cache: Redis in the production shape, so that every worker
counts together; the process's memory on the embedded default."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

from django.conf import settings
from django.core.cache import cache

Action = Literal["send", "upload"]
Subject = Literal["owner", "address"]


@dataclass(frozen=True, kw_only=True)
class Rate:
    """At most ``count`` actions per ``seconds``."""

    count: int
    seconds: int


class RateLimited(Exception):
    """Over a limit; ``retry_after`` seconds until its window ends."""

    def __init__(self, action: Action, subject: Subject, rate: Rate, retry_after: int) -> None:
        self.retry_after = retry_after
        noun = "messages" if action == "send" else "uploads"
        by = "from this chat's owner" if subject == "owner" else "from this address"
        super().__init__(
            f"Too many {noun} {by}: at most {rate.count} per {rate.seconds} s. Try again in {retry_after} s."
        )


def _rate(action: Action, subject: Subject) -> Rate | None:
    """The configured limit (``RATE_LIMITS``, plain dicts in settings), None when off."""
    configured = settings.RATE_LIMITS[action].get(subject)
    return None if configured is None else Rate(**configured)


def _window(rate: Rate, now: float) -> tuple[int, int]:
    """(the window's number, seconds until it ends) at ``now``."""
    number = int(now // rate.seconds)
    return number, max(1, math.ceil((number + 1) * rate.seconds - now))


def _key(action: Action, subject: Subject, value: str, number: int) -> str:
    return f"ratelimit:{action}:{subject}:{number}:{value}"


def owner_label(*, user_id: int | None, session_key: str | None) -> str:
    """The owner a limit counts for: a signed-in user, else the browser session (empty: none yet)."""
    return f"user:{user_id}" if user_id is not None else (f"anon:{session_key}" if session_key else "")


def rate_limit_take(action: Action, *, owner: str, address: str | None) -> None:
    """Count one ``action`` for ``owner`` and ``address`` (None: unknown, not limited) and raise
    :class:`RateLimited` when that goes over either limit; an action refused is counted all the same."""
    now = time.time()
    for subject, value in (("owner", owner), ("address", address)):
        rate = _rate(action, subject)  # type: ignore[arg-type]
        if rate is None or not value:
            continue
        number, remaining = _window(rate, now)
        key = _key(action, subject, value, number)  # type: ignore[arg-type]
        cache.add(key, 0, timeout=rate.seconds + 1)
        try:
            count = cache.incr(key)
        except ValueError:  # the key expired between add and incr
            cache.add(key, 1, timeout=rate.seconds + 1)
            count = 1
        if count > rate.count:
            raise RateLimited(action, subject, rate, remaining)  # type: ignore[arg-type]


async def arate_limit_take(action: Action, *, owner: str, address: str | None) -> None:
    """:func:`rate_limit_take` from async code (the cache's calls run in a thread; none when both limits are off)."""
    from asgiref.sync import sync_to_async

    if _rate(action, "owner") is None and _rate(action, "address") is None:
        return
    await sync_to_async(rate_limit_take, thread_sensitive=False)(action, owner=owner, address=address)
