"""``python -m chatapp.serve`` (``make run``): Daphne's command line, printing the address to open once every endpoint
is bound; a leading ``--open-path PATH`` names the page (``make demo``: ``/demo/``)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

from daphne.cli import CommandLineInterface
from daphne.server import Server
from django.conf import settings
from django.http.request import validate_host

WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


OPEN_PATH_OPTION = "--open-path"


def open_url(host: str, port: int, path: str = "/") -> str:
    host = WILDCARD_HOSTS.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


def ready_lines(addresses: Iterable[tuple[str, int]], *, allowed_hosts: Sequence[str], path: str = "/") -> list[str]:
    """Per address: a warning for a host ``allowed_hosts`` refuses, a hint for a wildcard, and last ``Open <url>``."""
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
    """``(path, Daphne's arguments)`` from a leading ``--open-path PATH`` (default ``/``); ``SystemExit`` unless ``/...``."""
    args = list(argv)
    if args[:1] != [OPEN_PATH_OPTION]:
        return "/", args
    if len(args) < 2 or not args[1].startswith("/"):
        raise SystemExit(f"{OPEN_PATH_OPTION} needs a path starting with /, such as /demo/")
    return args[1], args[2:]


def _host_allowed(host: str, allowed_hosts: Sequence[str]) -> bool:
    return validate_host(f"[{host}]" if ":" in host else host, list(allowed_hosts))


class AnnouncingServer(Server):
    """Daphne's server, printing :func:`ready_lines` once bound; a frame over 1 MiB closes with 1009 and a reason
    (docs/protocol.md "Close codes"), not autobahn's TCP drop that a client sees as 1006."""

    open_path = "/"  # the page the printed address opens (``--open-path``)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ready_callable"] = self.announce
        super().__init__(*args, **kwargs)

    def announce(self) -> None:
        # Daphne builds its WebSocket factory in run(), before the endpoints are bound and this runs.
        self.ws_factory.setProtocolOptions(failByDrop=False)
        for line in ready_lines(self.listening_addresses, allowed_hosts=settings.ALLOWED_HOSTS, path=self.open_path):
            print(line, flush=True)


class AnnouncingCommandLine(CommandLineInterface):
    server_class = AnnouncingServer


if __name__ == "__main__":
    AnnouncingServer.open_path, daphne_args = open_path_split(sys.argv[1:])
    sys.exit(AnnouncingCommandLine().run(daphne_args))
