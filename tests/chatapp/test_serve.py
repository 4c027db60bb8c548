"""``python -m chatapp.serve`` (what ``make run`` starts): Daphne that prints the address to open
once it listens. The address as a browser needs it (wildcards, IPv6, hosts Django would refuse),
and one real start-up: the line comes once, after binding, and names a port that answers."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from chatapp.serve import open_path_split, open_url, ready_lines
from tests.daphne_process import REPO, STARTUP_SECONDS, server_environment

ALLOWED = ["127.0.0.1", "localhost"]


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [
        ("127.0.0.1", 8000, "http://127.0.0.1:8000/"),
        ("localhost", 8100, "http://localhost:8100/"),
        ("0.0.0.0", 8000, "http://127.0.0.1:8000/"),
        ("::", 8000, "http://[::1]:8000/"),
        ("::1", 9000, "http://[::1]:9000/"),
        ("chat.example.org", 80, "http://chat.example.org:80/"),
    ],
)
def test_open_url_is_an_address_a_browser_can_open(host: str, port: int, url: str):
    assert open_url(host, port) == url


def test_a_loopback_server_prints_one_line():
    assert ready_lines([("127.0.0.1", 8000)], allowed_hosts=ALLOWED) == ["Open http://127.0.0.1:8000/ in a browser."]


def test_a_wildcard_server_says_how_to_reach_it_from_elsewhere():
    lines = ready_lines([("0.0.0.0", 8100)], allowed_hosts=ALLOWED)
    assert "DJANGO_ALLOWED_HOSTS" in lines[0] and ":8100/" in lines[0]
    assert lines[1] == "Open http://127.0.0.1:8100/ in a browser."
    assert len(lines) == 2


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "192.168.1.20"])
def test_the_address_to_open_is_the_last_line_and_carries_the_path(host: str):
    lines = ready_lines([(host, 8000)], allowed_hosts=ALLOWED, path="/demo/")
    assert re.fullmatch(r"Open http://[\d.]+:8000/demo/ in a browser\.", lines[-1]), lines
    assert all("/demo/" in line for line in lines if "http://" in line)


def test_the_open_path_option_comes_before_daphnes_arguments():
    assert open_path_split(["-b", "127.0.0.1", "app"]) == ("/", ["-b", "127.0.0.1", "app"])
    assert open_path_split(["--open-path", "/demo/", "-p", "0", "app"]) == ("/demo/", ["-p", "0", "app"])
    with pytest.raises(SystemExit):
        open_path_split(["--open-path", "demo"])


def test_make_demo_serves_with_the_demo_path():
    recipe = (REPO / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert recipe.rstrip().splitlines()[-1].split()[:4] == ["$(BIN)/python", "-m", "chatapp.serve", "--open-path"]
    assert "--open-path /demo/" in recipe


def test_a_host_django_refuses_gets_a_warning():
    lines = ready_lines([("192.168.1.20", 8000)], allowed_hosts=ALLOWED)
    assert lines == [
        "Warning: 192.168.1.20 is not in DJANGO_ALLOWED_HOSTS, so that address answers 400 Bad Request.",
        "Open http://192.168.1.20:8000/ in a browser.",
    ]
    assert ready_lines([("::", 8000)], allowed_hosts=["[::1]"])[0].startswith("Listening on every interface")
    assert ready_lines([("::", 8000)], allowed_hosts=ALLOWED)[0].startswith("Warning: ::1 is not in")


def test_each_address_is_announced_once():
    assert len(ready_lines([("127.0.0.1", 8000), ("127.0.0.1", 8000)], allowed_hosts=ALLOWED)) == 1


@pytest.fixture
def migrated_sqlite(tmp_path: Path) -> Path:
    database = tmp_path / "serve.sqlite3"
    env = server_environment({"SQLITE_PATH": str(database)})
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=REPO, env=env, check=True, timeout=120
    )
    return database


@pytest.mark.parametrize("open_path", [[], ["--open-path", "/demo/"]], ids=["root", "demo"])
def test_the_server_prints_the_address_once_it_listens_and_that_address_answers(
    migrated_sqlite: Path, open_path: list[str]
):
    env = server_environment({"SQLITE_PATH": str(migrated_sqlite)})
    command = [
        sys.executable,
        "-m",
        "chatapp.serve",
        *open_path,
        "-b",
        "127.0.0.1",
        "-p",
        "0",
        "chatapp.asgi:application",
    ]
    path = open_path[1] if open_path else "/"
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, daemon=True).start()
    seen: list[str] = []
    try:
        while True:
            line = lines.get(timeout=STARTUP_SECONDS)
            assert line is not None, "the server ended:\n" + "".join(seen)
            seen.append(line)
            match = re.fullmatch(rf"Open http://127\.0\.0\.1:(\d+){re.escape(path)} in a browser\.\n", line)
            if match:
                break
        port = int(match.group(1))
        assert port > 0
        # Daphne's own "Listening" line came first: the address was bound before it was announced.
        assert any(f"Listening on TCP address 127.0.0.1:{port}" in earlier for earlier in seen)
        head = urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/", method="HEAD"), timeout=30)
        assert head.status == 200 and head.read() == b""
        icon = urllib.request.urlopen(f"http://127.0.0.1:{port}/favicon.ico", timeout=30)
        assert icon.status == 200 and icon.url.endswith("/static/favicon.svg")
        assert icon.headers["Content-Type"] == "image/svg+xml" and icon.read().startswith(b"<svg")
    finally:
        process.terminate()
        process.wait(timeout=30)
    rest = []
    while (line := lines.get(timeout=30)) is not None:
        rest.append(line)
    assert sum(line.startswith("Open ") for line in seen + rest) == 1
