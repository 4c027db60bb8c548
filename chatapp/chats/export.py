"""Export of one chat session with its memory as Markdown or JSON (docs/export.md): streamed in pages of
:data:`EXPORT_PAGE_SIZE` rows, bounded in memory, a snapshot up to the newest ids at its start. No access check:
views fetch the session through :func:`chatapp.chats.access.session_get_for_owner`."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone
from django.utils.text import slugify

from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.chats.selectors import message_last_id, message_list_between
from chatapp.models import ChatSession, Message
from memory.api import CompressionRecord, KeyFact

# The JSON document's "format" and "version" (docs/export.md): a reader checks both.
EXPORT_FORMAT_NAME = "kestrel-chat-export"
EXPORT_FORMAT_VERSION = 1
# Markdown's names of ``summary_kind``; the JSON keeps the word.
SUMMARY_KIND_LABELS = {
    "none": "none",
    "llm": "LLM summary",
    "extractive": "extractive summary",
    "raw": "raw archive",
}
EXPORT_PAGE_SIZE = 200  # messages or compression events
FILENAME_TITLE_CHARS = 60


@dataclass(frozen=True)
class ExportFormat:
    """One download format; ``key`` as in the URL (``md``, ``json``)."""

    key: str
    extension: str
    content_type: str
    label: str


EXPORT_FORMATS: dict[str, ExportFormat] = {
    "md": ExportFormat("md", "md", "text/markdown; charset=utf-8", "Markdown"),
    "json": ExportFormat("json", "json", "application/json; charset=utf-8", "JSON"),
}


@dataclass(frozen=True, kw_only=True)
class ExportHead:
    """What an export reads once, before its pages, JSON-safe as in docs/export.md; ``as_of`` bounds the pages."""

    exported_at: str
    session: dict[str, Any]
    as_of: dict[str, int | None]
    summary: dict[str, Any]
    memory_job: dict[str, Any]
    key_facts: list[dict[str, Any]]


def chat_export_head_get(*, session: ChatSession) -> ExportHead:
    """The head of ``session``'s export in seven queries."""
    memory_key = memory_key_of(session.pk)
    engine = memory_engine()
    newest_events = engine.events(memory_key, limit=1)
    summary = engine.summary(memory_key)
    job = engine.job_state(memory_key).as_dict()
    job.pop("lease_owner", None)  # a worker's name: the server's business, not the chat's
    return ExportHead(
        exported_at=timezone.now().isoformat(),
        session={
            "id": session.pk,
            "title": session.title,
            "mode": session.mode,
            "created": session.created.isoformat(),
            "updated": session.updated.isoformat(),
        },
        as_of={
            "last_message_id": message_last_id(session_id=session.pk),
            "last_compression_event_id": newest_events[0].id if newest_events else None,
        },
        summary={
            "summary_type": summary.summary_type,
            "summary_kind": engine.summary_kind(memory_key, summary),
            "content": summary.content,
            "boundary": summary.last_message_id,
            "compressed_count": summary.compressed_count,
            "version": summary.version,
        },
        memory_job=job,
        key_facts=[key_fact_dict(fact) for fact in engine.facts(memory_key)],
    )


def key_fact_state(fact: KeyFact) -> str:
    """``superseded``, ``hidden`` or ``active``; superseded wins over hidden (docs/export.md)."""
    if fact.invalidated_at is not None:
        return "superseded"
    return "hidden" if fact.hidden_by_user else "active"


def key_fact_dict(fact: KeyFact) -> dict[str, Any]:
    return {"state": key_fact_state(fact), **fact.as_dict()}


def message_dict(message: Message) -> dict[str, Any]:
    return message.as_dict()


def summary_version_dict(event: CompressionRecord) -> dict[str, Any]:
    """The summary version a ``compression`` event wrote (docs/export.md ``summary_versions``)."""
    return {
        "version": event.summary_version,
        "summary_type": event.result_type,
        "summary_kind": event.summary_kind,
        "boundary": event.boundary_after,
        "compressed_messages": event.messages_summarized,
        "degraded": event.degraded,
        "created_at": event.created_at,
        "compression_event_id": event.id,
        "content": event.summary_content,
    }


def compression_event_dict(event: CompressionRecord) -> dict[str, Any]:
    """``CompressionEvent.as_dict`` plus ``summary_kind``, without the text (it is in ``summary_versions``)."""
    data = event.as_dict()
    data.pop("summary_content", None)
    data["summary_kind"] = event.summary_kind
    return data


def chat_export_filename(*, session: ChatSession, export_format: ExportFormat) -> str:
    """``chat-<id>-<title slug>.<extension>`` in ASCII letters, digits and hyphens: safe in any header or file system."""
    slug = slugify(session.title)[:FILENAME_TITLE_CHARS].strip("-_")
    stem = f"chat-{session.pk}-{slug}" if slug else f"chat-{session.pk}"
    return f"{stem}.{export_format.extension}"


# --- Streaming


async def chat_export_stream(
    *, session: ChatSession, export_format: ExportFormat, page_size: int = EXPORT_PAGE_SIZE
) -> AsyncIterator[str]:
    """The export as text chunks: the head, then one chunk per page of at most ``page_size`` rows."""
    head = await sync_to_async(chat_export_head_get)(session=session)
    renderer: _JsonRenderer | _MarkdownRenderer
    renderer = _JsonRenderer(head) if export_format.key == "json" else _MarkdownRenderer(head)
    yield renderer.start()
    yield renderer.messages_start()
    async for page in _pages(_message_page(session.pk, head.as_of["last_message_id"], page_size)):
        yield renderer.messages([message_dict(message) for message in page])
    yield renderer.messages_end()
    for section in ("summary_versions", "compression_events"):
        yield renderer.events_start(section)
        pages = _event_page(session.pk, head.as_of["last_compression_event_id"], page_size)
        async for events in _pages(pages):
            if section == "summary_versions":
                versions = [event for event in events if event.kind == "compression"]
                yield renderer.summary_versions([summary_version_dict(event) for event in versions])
            else:
                yield renderer.compression_events([compression_event_dict(event) for event in events])
        yield renderer.events_end(section)
    yield renderer.end()


# The rows after an id, ascending, at most a page (a thread-run ORM call).
PageReader = Callable[[int], list[Any]]


def _message_page(session_id: int, up_to_id: int | None, size: int) -> PageReader:
    def read(after_id: int) -> list[Message]:
        if up_to_id is None:
            return []
        return message_list_between(session_id=session_id, after_id=after_id, up_to_id=up_to_id, limit=size)

    return read


def _event_page(session_id: int, up_to_id: int | None, size: int) -> PageReader:
    memory_key = memory_key_of(session_id)
    engine = memory_engine()

    def read(after_id: int) -> list[CompressionRecord]:
        if up_to_id is None:
            return []
        return engine.events_page(memory_key, after_id=after_id, up_to_id=up_to_id, limit=size)

    return read


async def _pages(read: PageReader) -> AsyncIterator[list[Any]]:
    after_id = 0
    while True:
        page = await sync_to_async(read)(after_id)
        if not page:
            return
        yield page
        last = page[-1]
        after_id = last.pk if isinstance(last, Message) else last.id


# --- JSON: one object; its lists are written one element per line as their pages arrive.


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class _JsonRenderer:
    """The JSON document of docs/export.md, in pieces."""

    def __init__(self, head: ExportHead) -> None:
        self.head = head
        self.first = True

    def _items(self, items: Iterable[dict[str, Any]]) -> str:
        parts: list[str] = []
        for item in items:
            parts.append(("\n" if self.first else ",\n") + _json(item))
            self.first = False
        return "".join(parts)

    def start(self) -> str:
        head = self.head
        fields = {
            "format": EXPORT_FORMAT_NAME,
            "version": EXPORT_FORMAT_VERSION,
            "exported_at": head.exported_at,
            "session": head.session,
            "as_of": head.as_of,
            "summary": head.summary,
            "memory_job": head.memory_job,
        }
        lines = [f"{_json(name)}:{_json(value)}" for name, value in fields.items()]
        facts = ",\n".join(_json(fact) for fact in head.key_facts)
        lines.append('"key_facts":[' + ("\n" + facts if facts else "") + "\n]")
        return "{\n" + ",\n".join(lines)

    def messages_start(self) -> str:
        self.first = True
        return ',\n"messages":['

    def messages(self, items: list[dict[str, Any]]) -> str:
        return self._items(items)

    def messages_end(self) -> str:
        return "\n]"

    def events_start(self, section: str) -> str:
        self.first = True
        return f",\n{_json(section)}:["

    def summary_versions(self, items: list[dict[str, Any]]) -> str:
        return self._items(items)

    def compression_events(self, items: list[dict[str, Any]]) -> str:
        return self._items(items)

    def events_end(self, section: str) -> str:
        return "\n]"

    def end(self) -> str:
        return "\n}\n"


# --- Markdown: the same content for reading.

ROLE_LABELS = {"user": "User", "assistant": "Assistant", "tool": "Tool", "system": "System"}
STATUS_NOTES = {"cut_off": "cut off at the model's token limit"}
FACT_STATE_ORDER = ("active", "hidden", "superseded")


def fenced(text: str, info: str = "") -> str:
    """``text`` fenced by more backticks than any run in it, so no content can close it early."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}\n"


def quoted(text: str) -> str:
    """``text`` as a block quote, so its own headings and lists cannot break the document's outline."""
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines() or [""]) + "\n"


def inline(text: str) -> str:
    """``text`` on one line as a code span, backticks inside it kept verbatim."""
    flat = " ".join(str(text).split())
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") or not flat else ""
    return f"{ticks}{pad}{flat}{pad}{ticks}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _when(value: str | None) -> str:
    """An ISO 8601 time as ``2026-12-01 10:00:00 UTC`` (``—`` for None)."""
    if not value:
        return "—"
    moment = datetime.fromisoformat(value)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class _MarkdownRenderer:
    """The Markdown document, in the section order of docs/export.md."""

    def __init__(self, head: ExportHead) -> None:
        self.head = head
        self.any_item = False

    def start(self) -> str:
        head = self.head
        session, summary = head.session, head.summary
        title = " ".join(session["title"].split()) or f"Chat {session['id']}"
        parts = [
            f"# {title}\n",
            f"- Chat: {session['id']} · mode {session['mode']} · created {_when(session['created'])}",
            f"- Exported: {_when(head.exported_at)}, messages up to #{head.as_of['last_message_id'] or '—'}",
            f"- Format: {EXPORT_FORMAT_NAME} version {EXPORT_FORMAT_VERSION} (the JSON export holds every field)\n",
            "## Key facts\n",
        ]
        if not head.key_facts:
            parts.append("No key facts.\n")
        for state in FACT_STATE_ORDER:
            facts = [fact for fact in head.key_facts if fact["state"] == state]
            if facts:
                parts.append(f"### {state.capitalize()} ({len(facts)})\n")
                parts.extend(self._fact(fact) for fact in facts)
                parts.append("")
        parts.append("## Current summary\n")
        if summary["version"]:
            parts.append(
                f"Version {summary['version']} · {SUMMARY_KIND_LABELS.get(summary['summary_kind'], summary['summary_kind'])} · covers messages up to "
                f"#{summary['boundary']} · {_count(summary['compressed_count'], 'message')} compressed\n"
            )
            parts.append(fenced(summary["content"], "text"))
        else:
            parts.append("No summary yet: nothing was compressed.\n")
        return "\n".join(parts) + "\n"

    @staticmethod
    def _fact(fact: dict[str, Any]) -> str:
        source = f"message #{fact['source_message_id']}" if fact["source_message_id"] else "no message"
        flags = [flag for flag, on in (("pinned", fact["pinned_by_user"]), ("hidden", fact["hidden_by_user"])) if on]
        extra = f" ({', '.join(flags)})" if flags else ""
        text = f" — {' '.join(fact['text'].split())}" if fact["text"] else ""
        return (
            f"- {inline(fact['key'])} = {inline(fact['value'])} · {fact['kind']} · from {source}, "
            f"{fact['extractor']}{extra}{text}"
        )

    def messages_start(self) -> str:
        self.any_item = False
        return "## Messages\n\n"

    def messages(self, items: list[dict[str, Any]]) -> str:
        self.any_item = self.any_item or bool(items)
        return "".join(self._message(message) for message in items)

    @staticmethod
    def _message(message: dict[str, Any]) -> str:
        role = ROLE_LABELS.get(message["role"], message["role"])
        if message["role"] == "tool":
            role = f"Tool {inline(message['name'] or 'result')} answering {inline(message['tool_call_id'])}"
        notes = []
        if message["status"] != "complete":
            notes.append(STATUS_NOTES.get(message["status"], message["status"]))
        if message["origin"] == "app":
            notes.append("written by the app, never sent to the model")
        note = f" ({'; '.join(notes)})" if notes else ""
        parts = [f"### #{message['id']} · {role} · {_when(message['created'])}{note}\n"]
        content = message["content"]
        if message["role"] == "tool":
            parts.append(fenced(content or "", "text"))
        elif content:
            parts.append(quoted(content))
        for call in message["tool_calls"] or []:
            function = call.get("function") or {}
            parts.append(f"Tool call {inline(function.get('name', '?'))}, id {inline(call.get('id', '?'))}:\n")
            parts.append(fenced(str(function.get("arguments", "")), "json"))
        if not content and not message["tool_calls"]:
            parts.append("_(no text)_\n")
        return "\n".join(parts) + "\n"

    def messages_end(self) -> str:
        return "" if self.any_item else "No messages.\n\n"

    def events_start(self, section: str) -> str:
        self.any_item = False
        return "## Summary versions\n\n" if section == "summary_versions" else "## Compression events\n\n"

    def summary_versions(self, items: list[dict[str, Any]]) -> str:
        self.any_item = self.any_item or bool(items)
        parts = []
        for version in items:
            degraded = " (degraded)" if version["degraded"] else ""
            parts.append(
                f"### Version {version['version']} · {SUMMARY_KIND_LABELS.get(version['summary_kind'], version['summary_kind'])}{degraded} · "
                f"{_when(version['created_at'])}\n\n"
                f"Covers messages up to #{version['boundary']}; {_count(version['compressed_messages'], 'message')} "
                f"folded in (compression event {version['compression_event_id']}).\n\n"
                + fenced(version["content"], "text")
                + "\n"
            )
        return "".join(parts)

    def compression_events(self, items: list[dict[str, Any]]) -> str:
        self.any_item = self.any_item or bool(items)
        parts = []
        for event in items:
            attempts = event["attempts"] or []
            failed = sum(1 for attempt in attempts if not attempt.get("ok"))
            version = f", wrote version {event['summary_version']}" if event["summary_version"] else ""
            parts.append(
                f"- {_when(event['created_at'])} · event {event['id']} · {event['kind']} ({event['origin']}) · "
                f"{event['tokens_before']} → {event['tokens_after']} tokens (trigger {event['trigger_tokens']}, "
                f"target {event['target_tokens']}) · {_count(event['messages_summarized'], 'message')} summarized · "
                f"result {SUMMARY_KIND_LABELS.get(event['summary_kind'], event['summary_kind'])}"
                f"{' (degraded)' if event['degraded'] else ''}{version} · "
                f"{_count(len(attempts), 'attempt')}, {failed} failed · {event['duration_ms']} ms\n"
            )
            for attempt in attempts:
                outcome = "ok" if attempt.get("ok") else f"failed: {' '.join(str(attempt.get('error', '')).split())}"
                parts.append(
                    f"  - {attempt.get('phase', '?')} attempt {attempt.get('number', '?')} "
                    f"({attempt.get('model', '?')}{', extractive' if attempt.get('method') == 'extractive' else ''}, "
                    f"{attempt.get('latency_ms', '?')} ms): {outcome}\n"
                )
            parts.extend(f"  - note: {' '.join(str(note).split())}\n" for note in event["notes"] or [])
        return "".join(parts)

    def events_end(self, section: str) -> str:
        if self.any_item:
            return "\n" if section == "compression_events" else ""
        return "No summary versions.\n\n" if section == "summary_versions" else "No compression events.\n\n"

    def end(self) -> str:
        job = self.head.memory_job
        error = f" · last error: {' '.join(job['last_error'].split())}" if job.get("last_error") else ""
        return f"## Memory job\n\nStatus {job.get('status', '?')} · {_count(job.get('runs', 0), 'run')}{error}\n"
