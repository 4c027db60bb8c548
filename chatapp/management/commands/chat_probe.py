"""``manage.py chat_probe URL [TEXT]``: one scripted chat turn through a running app, as a browser would do it (the
home page, a new chat, its WebSocket); prints the chat's id and the reply. Checks a deployment (docs/deploy.md)."""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import re
import urllib.parse
import urllib.request
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError

CHAT_PATH = re.compile(r"/s/(\d+)/")


class Command(BaseCommand):
    help = "Send one chat message through a running app and print the reply (a deployment check)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("url", help="the app's address, e.g. http://127.0.0.1:8000")
        parser.add_argument("text", nargs="?", default="My booking reference is QX-4417. What can you do?")
        parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the reply (default 60)")

    def handle(self, *args: Any, url: str, text: str, timeout: float, **options: Any) -> None:
        base = url.rstrip("/")
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        try:
            opener.open(base + "/", timeout=timeout).read()
            csrf = next((cookie.value or "" for cookie in jar if cookie.name == "csrftoken"), "")
            request = urllib.request.Request(
                base + "/s/new/",
                data=urllib.parse.urlencode({"mode": "agent"}).encode(),
                headers={"X-CSRFToken": csrf, "Referer": base + "/", "Origin": base},
            )
            landed = opener.open(request, timeout=timeout).geturl()
        except OSError as exc:
            raise CommandError(f"{base} did not answer: {exc}") from exc
        match = CHAT_PATH.search(urllib.parse.urlsplit(landed).path)
        if match is None:
            raise CommandError(f"no chat was created (landed on {landed})")
        chat_id = int(match.group(1))
        cookie = "; ".join(f"{c.name}={c.value}" for c in jar)
        reply = asyncio.run(asyncio.wait_for(self.turn(base, chat_id, cookie, text), timeout))
        self.stdout.write(json.dumps({"chat": chat_id, **reply}))
        if reply["status"] != "complete":
            raise CommandError(f"the turn ended {reply['status']}")

    async def turn(self, base: str, chat_id: int, cookie: str, text: str) -> dict[str, Any]:
        """The turn's final status and reply text."""
        from websockets.asyncio.client import connect
        from websockets.typing import Origin

        ws_url = base.replace("http", "ws", 1) + f"/ws/chat/{chat_id}/"
        reply = ""
        async with connect(ws_url, origin=Origin(base), additional_headers={"Cookie": cookie}) as socket:
            await socket.send(json.dumps({"type": "chat.send", "client_message_id": uuid.uuid4().hex, "text": text}))
            while True:
                event = json.loads(await socket.recv())
                if event["type"] == "error" and "turn_id" not in event:
                    raise CommandError(f"refused: {event['code']}: {event['message']}")
                if event["type"] == "chat.message" and event["message"]["role"] == "assistant":
                    reply = event["message"].get("content") or reply
                if event["type"] == "chat.done":
                    return {"status": event["status"], "reply": reply}
