"""``python -m chatapp.serve``: Daphne's command line (the same arguments as ``daphne``) that also
prints the address to open once the server listens, which is what ``make run`` starts, and closes
a socket that sends an oversized frame with a close code instead of dropping it.

Daphne itself only logs ``Listening on TCP address HOST:PORT``. Its server calls a
``ready_callable`` after every endpoint was bound and before it starts serving, and never when
binding failed (a port in use ends the start-up instead), so the line printed here means the app
is ready at that address. The address is the one bound (``-p 0`` prints the port the system
chose), written as a browser needs it: a wildcard host (``0.0.0.0``, ``::``) is reached here
through the loopback address, and from other machines through this machine's name, which must be
listed in ``DJANGO_ALLOWED_HOSTS`` (docs/configuration.md); a host Django would refuse gets a
warning. ``--open-path PATH`` (before Daphne's own arguments) names the page to open: ``make demo``
passes ``/demo/``, so the last line printed is the demo's address.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

from daphne.cli import CommandLineInterface
from daphne.server import Server
from django.conf import settings
from django.http.request import validate_host

# Hosts that mean "every interface": not an address a browser can open.
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


OPEN_PATH_OPTION = "--open-path"


def open_url(host: str, port: int, path: str = "/") -> str:
    """The URL a browser on this machine opens for ``path`` on a server bound to ``host``:``port``:
    a wildcard host becomes its loopback address, an IPv6 address is bracketed
    (``http://[::1]:8000/``)."""
    host = WILDCARD_HOSTS.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def ready_lines(addresses: Iterable[tuple[str, int]], *, allowed_hosts: Sequence[str], path: str = "/") -> list[str]:
    """What start-up prints for the bound ``(host, port)`` addresses (in order, duplicates once):
    a warning for a host that ``allowed_hosts`` (Django's ``ALLOWED_HOSTS``) would refuse, since
    every page would then answer 400, a hint for a wildcard host, and last ``Open <url>`` of
    ``path`` per address, so that the address to open ends the output."""
    lines: list[str] = []
    for host, port in dict.fromkeys(addresses):
        shown = WILDCARD_HOSTS.get(host, host)
        if not _host_allowed(shown, allowed_hosts):
            lines.append(f"Warning: {shown} is not in DJANGO_ALLOWED_HOSTS, so that address answers 400 Bad Request.")
        if host in WILDCARD_HOSTS:
            lines.append(
                f"Listening on every interface: from another machine open http://<this machine's name>:{port}{path}, "
                "with that name listed in DJANGO_ALLOWED_HOSTS."
            )
        lines.append(f"Open {open_url(host, port, path)} in a browser.")
    return lines


def open_path_split(argv: Sequence[str]) -> tuple[str, list[str]]:
    """``(path, the rest of argv)``: the value of a leading ``--open-path PATH`` (``/`` without
    one) and Daphne's arguments. Raises ``SystemExit`` for a path that does not start with ``/``."""
    args = list(argv)
    if args[:1] != [OPEN_PATH_OPTION]:
        return "/", args
    if len(args) < 2 or not args[1].startswith("/"):
        raise SystemExit(f"{OPEN_PATH_OPTION} needs a path starting with /, such as /demo/")
    return args[1], args[2:]


def _host_allowed(host: str, allowed_hosts: Sequence[str]) -> bool:
    """Django's own check (``validate_host``), IPv6 literals bracketed as in a Host header."""
    return validate_host(f"[{host}]" if ":" in host else host, list(allowed_hosts))


class AnnouncingServer(Server):
    """Daphne's server, printing :func:`ready_lines` to stdout once every endpoint is bound.

    A WebSocket frame or message over Daphne's size limit (``websocket_max_message_size``, 1 MiB)
    is refused before the application sees it. autobahn's default for a server is to drop the TCP
    connection then, which a client only sees as 1006 (no reason); here the socket is closed with
    1009 ("message too big") and autobahn's reason naming the limit (docs/protocol.md "Close
    codes"). Nothing of such a frame is read or stored.
    """

    open_path = "/"  # the page the printed address opens (``--open-path``)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ready_callable"] = self.announce
        super().__init__(*args, **kwargs)

    def announce(self) -> None:
        # Daphne builds its WebSocket factory in run(), before the endpoints are bound and this runs.
        self.ws_factory.setProtocolOptions(failByDrop=False)
        # The application (chatapp.asgi) is imported before the server is built: settings are set up.
        for line in ready_lines(self.listening_addresses, allowed_hosts=settings.ALLOWED_HOSTS, path=self.open_path):
            print(line, flush=True)


class AnnouncingCommandLine(CommandLineInterface):
    """``daphne``'s command line with :class:`AnnouncingServer`."""

    server_class = AnnouncingServer


if __name__ == "__main__":
    AnnouncingServer.open_path, daphne_args = open_path_split(sys.argv[1:])
    sys.exit(AnnouncingCommandLine().run(daphne_args))
