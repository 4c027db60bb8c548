"""The last request sent to the chat model, read from its ``ModelCall.context`` snapshot."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chatapp.models import ModelCall
from chatapp.ui.inspector.gauge import EstimateCheck, Gauge, Section, estimate_check_build, percent

# (section key, label, source kind of its messages in ``context["sources"]``), in request order.
MESSAGE_SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("system", "System prompt", "system"),
    ("facts", "Key facts", "facts"),
    ("summary", "Summary", "summary"),
    ("recall", "Recalled", "recall"),
    ("retained", "Retained window", "history"),
    ("current", "Current turn", "current"),
)


# How memory met a request (MemoryContext.path, docs/memory.md §10), as the request panel says it.
PATH_LABELS = {
    "under_trigger": "Under the trigger: no memory work before the first token.",
    "no_progress": (
        "Over the trigger, but nothing before the current turn may be summarized: only the current turn "
        "was elided or folded."
    ),
    "compressed": "Compressed inside this request, before the first token (MEMORY_COMPRESSION=sync).",
    "waited": "Waited {waited_ms:,}\u00a0ms for the memory job's compression, then under the trigger.",
    "deferred": (
        "Over the trigger: sent the stored summary plus a raw archive of the overflow (nothing written) "
        "and left the compression to the memory job (waited {waited_ms:,}\u00a0ms)."
    ),
    "degraded": "Degraded context: the stored summary plus a raw archive of the overflow, nothing written.",
}


@dataclass(frozen=True, kw_only=True)
class RequestSnapshot:
    """One recorded model call: ``gauge.used`` the engine's estimate, ``prompt_tokens`` the provider's
    (None until reported), ``summary`` the summary state the request was built with."""

    model_call_id: int
    turn_id: int | None
    step: int
    mode: str
    model: str
    created: datetime
    gauge: Gauge
    sections: list[Section]
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str
    summary: dict[str, Any]
    elisions: list[dict[str, Any]]
    repairs: list[str]
    history_ids: frozenset[int]
    current_ids: frozenset[int]
    memory_path: str = ""
    waited_ms: int = 0
    estimate_check: EstimateCheck | None = None

    @property
    def path_label(self) -> str:
        """How memory met this request, in words ("" for calls recorded before it was kept)."""
        label = PATH_LABELS.get(self.memory_path, "")
        return label.format(waited_ms=self.waited_ms)

    @property
    def summary_boundary(self) -> int | None:
        """The last message id the summary sent with this request covered; None without one."""
        boundary = self.summary.get("last_message_id")
        return int(boundary) if boundary is not None else None

    @property
    def prompt_tokens_difference(self) -> int | None:
        return None if self.prompt_tokens is None else self.prompt_tokens - self.gauge.used


def request_snapshot_build(call: ModelCall) -> RequestSnapshot:
    """The snapshot of ``call`` (pure). The engine's section counts, ``Reply priming`` (the rest of the
    estimate) and ``Free`` add up to the window, in estimated tokens (docs/memory.md §5, "Calibration")."""
    context = call.context
    used = int(context["tokens"])
    check = estimate_check_build(
        context.get("calibration"),
        estimated_tokens=used,
        prompt_tokens=call.prompt_tokens,
        context_window=int(context["context_window"]),
    )
    window = check.window_tokens
    counts: dict[str, int] = context.get("sections") or {}
    messages: list[dict[str, Any]] = context.get("messages") or []
    sources: list[dict[str, Any]] = context.get("sources") or []
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for message, source in zip(messages, sources, strict=True):
        by_kind.setdefault(source.get("kind", ""), []).append(message)
    sections = [
        Section(
            key=key,
            label=label,
            tokens=int(counts.get(key, 0)),
            percent=percent(int(counts.get(key, 0)), window),
            text=messages_text(by_kind.get(kind, [])),
            message_count=len(by_kind.get(kind, [])),
        )
        for key, label, kind in MESSAGE_SECTIONS
    ]
    tools = context.get("tools") or []
    tool_tokens = int(counts.get("tools", 0))
    sections.append(
        Section(
            key="tools",
            label="Tool schemas",
            tokens=tool_tokens,
            percent=percent(tool_tokens, window),
            text=json.dumps(tools, ensure_ascii=False, indent=2) if tools else "",
            message_count=len(tools),
        )
    )
    overhead = used - sum(section.tokens for section in sections)
    sections.append(Section(key="overhead", label="Reply priming", tokens=overhead, percent=percent(overhead, window)))
    free = max(0, window - used)
    sections.append(Section(key="free", label="Free", tokens=free, percent=percent(free, window)))
    return RequestSnapshot(
        model_call_id=call.pk,
        turn_id=call.reply_to_id,
        step=call.step,
        mode=call.mode,
        model=call.model,
        created=call.created,
        gauge=Gauge(
            used=used,
            context_window=window,
            trigger_tokens=int(context["trigger_tokens"]),
            target_tokens=int(context["target_tokens"]),
        ),
        sections=sections,
        prompt_tokens=call.prompt_tokens,
        completion_tokens=call.completion_tokens,
        finish_reason=call.finish_reason,
        estimate_check=check,
        summary=context.get("summary") or {},
        elisions=list(context.get("elisions") or []),
        memory_path=str(context.get("path") or ""),
        waited_ms=int(context.get("waited_ms") or 0),
        repairs=[str(repair) for repair in context.get("repairs") or []],
        history_ids=_source_ids(sources, "history"),
        current_ids=_source_ids(sources, "current"),
    )


def messages_text(messages: Iterable[dict[str, Any]]) -> str:
    """Wire messages as text: per message a ``[role ...]`` line, the content as sent, its ``tool_calls`` JSON."""
    parts: list[str] = []
    for message in messages:
        header = str(message.get("role", "?"))
        if message.get("name"):
            header += f" name={message['name']}"
        if message.get("tool_call_id"):
            header += f" tool_call_id={message['tool_call_id']}"
        content = message.get("content")
        # A string, None (an assistant tool-call message) or a list of content parts.
        body = (
            (content or "") if isinstance(content, str) or content is None else json.dumps(content, ensure_ascii=False)
        )
        if message.get("tool_calls"):
            calls = json.dumps(message["tool_calls"], ensure_ascii=False, indent=2)
            body += ("\n" if body else "") + "tool_calls: " + calls
        parts.append(f"[{header}]\n{body}")
    return "\n\n".join(parts)


def _source_ids(sources: list[dict[str, Any]], kind: str) -> frozenset[int]:
    # A merged message (strict alternation, docs/memory.md F-38) stands for its "merged" parts too.
    parts = (part for source in sources for part in (source, *source.get("merged", ())))
    return frozenset(int(part["id"]) for part in parts if part.get("kind") == kind and part.get("id") is not None)
