"""The WebSocket origin rule (chatapp/origin.py): the page's own scheme, host and port, or a
trusted origin; the socket-level tests are in test_consumers.py."""

from __future__ import annotations

from typing import Any

import pytest

from chatapp.realtime.origin import origin_allowed, origin_parse


def scope(origin: str | None, host: str | None = "127.0.0.1:8000", scheme: str = "ws") -> dict[str, Any]:
    headers = [(b"host", host.encode())] if host is not None else []
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return {"type": "websocket", "scheme": scheme, "headers": headers}


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "allowed"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", "ws", True),
        ("http://chat.example.com", "chat.example.com", "ws", True),  # default ports on both sides
        ("http://chat.example.com:80", "chat.example.com", "ws", True),
        ("https://chat.example.com", "chat.example.com", "wss", True),
        ("https://chat.example.com", "chat.example.com:443", "wss", True),
        ("http://[::1]:8000", "[::1]:8000", "ws", True),
        ("http://Chat.Example.com", "chat.example.COM", "ws", True),
        ("http://127.0.0.1:9999", "127.0.0.1:8000", "ws", False),
        ("https://127.0.0.1", "127.0.0.1:8000", "ws", False),
        ("http://chat.example.com", "chat.example.com", "wss", False),  # an http page on a TLS site
        ("https://chat.example.com", "chat.example.com", "ws", False),  # TLS ends at a proxy: trust it
        ("http://127.0.0.1:8000", None, "ws", False),
        ("null", "127.0.0.1:8000", "ws", False),
        ("file://", "127.0.0.1:8000", "ws", False),
        ("http://127.0.0.1:8000/chat/", "127.0.0.1:8000", "ws", False),
    ],
)
def test_same_origin_means_scheme_host_and_port(settings, origin, host, scheme, allowed):
    settings.CSRF_TRUSTED_ORIGINS = []
    assert origin_allowed(scope(origin, host, scheme)) is allowed


@pytest.mark.parametrize(
    ("trusted", "origin", "allowed"),
    [
        ("https://chat.example.com", "https://chat.example.com", True),
        ("https://chat.example.com", "https://chat.example.com:443", True),
        ("https://chat.example.com", "http://chat.example.com", False),
        ("https://chat.example.com", "https://chat.example.com:8443", False),
        ("https://chat.example.com", "https://evil.example.com", False),
        ("https://*.example.com", "https://eu.chat.example.com", True),
        ("https://*.example.com", "https://example.com.evil.net", False),
        ("https://*.example.com", "http://eu.example.com", False),
    ],
)
def test_trusted_origins_behind_a_proxy_that_rewrites_host(settings, trusted, origin, allowed):
    settings.CSRF_TRUSTED_ORIGINS = [trusted]
    assert origin_allowed(scope(origin, "10.0.0.5:8001")) is allowed


def test_origin_parse_normalizes_and_refuses_garbage():
    assert origin_parse("HTTPS://Chat.Example.com") == ("https", "chat.example.com", 443)
    assert origin_parse("http://x:99999") is None
    assert origin_parse("") is None
    assert origin_parse("ws://127.0.0.1:8000") is None
