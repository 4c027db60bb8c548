"""The WebSocket origin check: a socket may be opened only by a page of this very site.

Browsers send cookies with a WebSocket handshake whatever page opens it, so the ``Origin`` header
is the only defence against another site's page talking to the chat as the user
(cross-site WebSocket hijacking). Channels' ``AllowedHostsOriginValidator`` compares host names
only: a page on ``http://127.0.0.1:9999`` (another program on the same machine) or
``https://127.0.0.1`` passed for an app on ``:8000``. :class:`SameOriginValidator` applies the
rule of Django's own CSRF origin check instead: the Origin's scheme, host and port must equal
those the browser used to reach this app (the scope's scheme and the ``Host`` header), or the
Origin must be listed in ``settings.CSRF_TRUSTED_ORIGINS`` (a proxy that terminates TLS or
rewrites ``Host``). A missing, ``null`` or malformed Origin is refused. The stack keeps
``AllowedHostsOriginValidator`` in front, so the Origin's host must also be in ``ALLOWED_HOSTS``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings

DEFAULT_PORTS = {"http": 80, "https": 443}
# The HTTP scheme of the page that opens a socket with each WebSocket scheme.
PAGE_SCHEMES = {"ws": "http", "wss": "https"}

# (scheme, host, port): host lower-cased, port made explicit.
SiteOrigin = tuple[str, str, int]


def origin_parse(value: str) -> SiteOrigin | None:
    """``value`` (an Origin such as ``https://chat.example.com:8443``) as ``(scheme, host, port)``,
    or None when it is not an http(s) origin with a host (``null``, garbage, a bad port)."""
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
    """The origin a page served by this app at the socket's address has: the page's scheme (from
    the scope's ``ws``/``wss``) with the ``Host`` header, or None without a usable ``Host``."""
    host = _header(scope, b"host")
    scheme = PAGE_SCHEMES.get(str(scope.get("scheme", "ws")).lower())
    if not host or scheme is None:
        return None
    return origin_parse(f"{scheme}://{host}")


def origin_allowed(scope: dict[str, Any]) -> bool:
    """True when the socket's ``Origin`` is this site as the browser reached it, or matches an
    entry of ``settings.CSRF_TRUSTED_ORIGINS`` (scheme, host and port; ``https://*.example.com``
    matches the subdomains of ``example.com``, as for Django's CSRF check)."""
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
    """The first value of header ``name`` (lower-case bytes), decoded as Latin-1 like Django does."""
    for header_name, value in scope.get("headers", ()):
        if header_name.lower() == name:
            return value.decode("latin-1")
    return None


class SameOriginValidator:
    """ASGI middleware for WebSocket scopes: refuse the handshake (HTTP 403) unless
    :func:`origin_allowed`; otherwise pass the connection on to ``application``."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
