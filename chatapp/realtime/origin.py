"""The WebSocket ``Origin`` check against cross-site hijacking, by Django's CSRF rule (scheme, host and port, or
``CSRF_TRUSTED_ORIGINS``); Channels' own validator compares host names only."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings

DEFAULT_PORTS = {"http": 80, "https": 443}
PAGE_SCHEMES = {"ws": "http", "wss": "https"}

SiteOrigin = tuple[str, str, int]


def origin_parse(value: str) -> SiteOrigin | None:
    """An Origin as ``(scheme, host, port)``, or None unless it is an http(s) origin with a host (``null``, bad port)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/") or parts.query:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else DEFAULT_PORTS[scheme]


def request_origin(scope: dict[str, Any]) -> SiteOrigin | None:
    """The origin of this app's pages at the socket's address (scheme from ``ws``/``wss``, ``Host``), or None."""
    host = _header(scope, b"host")
    scheme = PAGE_SCHEMES.get(str(scope.get("scheme", "ws")).lower())
    if not host or scheme is None:
        return None
    return origin_parse(f"{scheme}://{host}")


def origin_allowed(scope: dict[str, Any]) -> bool:
    """Whether the socket's ``Origin`` is this site as the browser reached it or a trusted origin
    (``https://*.example.com`` matches the subdomains, as for Django's CSRF check); a missing one is refused."""
    origin = origin_parse(_header(scope, b"origin") or "")
    if origin is None:
        return False
    return origin == request_origin(scope) or any(
        _trusted_match(origin, trusted) for trusted in settings.CSRF_TRUSTED_ORIGINS
    )


def _trusted_match(origin: SiteOrigin, trusted: str) -> bool:
    pattern = origin_parse(trusted.replace("://*.", "://wildcard.", 1))
    if pattern is None:
        return False
    if "://*." not in trusted:
        return origin == pattern
    scheme, host, port = origin
    parent = pattern[1].removeprefix("wildcard.")
    return (scheme, port) == (pattern[0], pattern[2]) and host.endswith("." + parent)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for header_name, value in scope.get("headers", ()):
        if header_name.lower() == name:
            return value.decode("latin-1")
    return None


class SameOriginValidator:
    """ASGI middleware: refuse a WebSocket handshake (HTTP 403) unless :func:`origin_allowed`."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
