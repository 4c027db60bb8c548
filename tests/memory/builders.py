"""Small builders for message dicts, an in-memory message store and scripted summarizers."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from memory.ports import SummaryRequest
from memory.summary.extractive import ExtractiveSummarizer
from memory.tokens.counter import get_counter

COUNTER = get_counter("gpt-4o-mini")


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def asst(text: str | None = None, *, tc: list[str] | None = None, tool: str = "kb_search") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tc:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps({"query": call_id})}}
            for call_id in tc
        ]
    return message


def tool(call_id: str, text: str = "result", *, name: str = "kb_search") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": text}


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


@dataclass
class Store:
    """An in-memory stand-in for the Message table: ids ascend from 1, rows are immutable."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, *messages: dict[str, Any]) -> list[dict[str, Any]]:
        added = []
        for message in messages:
            row = {**copy.deepcopy(message), "id": len(self.rows) + 1}
            row["token_count"] = COUNTER.count_message(row)
            self.rows.append(row)
            added.append(row)
        return added

    async def load_increment(self, boundary: int | None) -> list[dict[str, Any]]:
        return [copy.deepcopy(row) for row in self.rows if boundary is None or row["id"] > boundary]

    def snapshot(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.rows)


class ScriptedSummarizer:
    """A summarizer whose answers are scripted: each item is a string to return, an exception
    to raise, ``"sleep:<seconds>"`` to hang, or ``None`` to merge the material verbatim-ish."""

    def __init__(self, script: list[Any] | None = None, *, model: str = "scripted", default: Any = None) -> None:
        self.script = list(script or [])
        self.model = model
        self.default = default
        self.requests: list[SummaryRequest] = []

    async def summarize(self, request: SummaryRequest) -> str:
        self.requests.append(request)
        item = self.script.pop(0) if self.script else self.default
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, str) and item.startswith("sleep:"):
            await asyncio.sleep(float(item.split(":", 1)[1]))
            return "late summary"
        if item is None:
            text = f"{request.previous_summary}\n{request.prompt[-1]['content'][:200]}".strip()
            return COUNTER.truncate_text(text, request.max_tokens)
        return item


class FlakySummarizer(ExtractiveSummarizer):
    """Extractive summaries, except where the drawn script says fail or empty."""

    def __init__(self, script):
        super().__init__(COUNTER)
        self.model = "flaky"
        self.script = itertools.cycle(script)

    async def summarize(self, request):
        action = next(self.script)
        if action == "fail":
            raise RuntimeError("provider error")
        if action == "empty":
            return " "
        return await super().summarize(request)
