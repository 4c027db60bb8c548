"""Reads of the memory inspector (docs/memory.md §8): what the last request to the chat model
contained and why, the session's key facts and where that request had them (docs/memory.md §11),
the session's summary and its versions, the compression timeline and the summarizer's health.

Every token figure comes from the data that built the request -- the ``ModelCall.context``
snapshot (``MemoryContext.as_dict()`` plus the tool schemas) and the memory app's stored
summary and compression events -- never from a second estimate. Synchronous ORM code; async
callers use ``database_sync_to_async``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.urls import reverse
from django.utils import timezone

from chatapp.chats.memory import memory_engine, memory_key_of, session_of
from chatapp.llm.embeddings import embedder_choice
from chatapp.llm.offline.transport import OFFLINE_MODEL
from chatapp.models import Message, ModelCall
from memory.api import CompressionRecord, KeyFact

# How many compression events the timeline (and the summary's version history) shows.
TIMELINE_MAX_EVENTS = 100

# (section key, label, source kind of its messages in ``context["sources"]``), in request order.
MESSAGE_SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("system", "System prompt", "system"),
    ("facts", "Key facts", "facts"),
    ("summary", "Summary", "summary"),
    ("recall", "Recalled", "recall"),
    ("retained", "Retained window", "history"),
    ("current", "Current turn", "current"),
)

# How a summary was written: the type stored (none / llm / raw), except that an ``llm`` result
# every successful attempt of which came from an extractive summarizer (the offline engine copies
# sentences; no language model wrote it) is ``extractive``.
SUMMARY_KIND_EXTRACTIVE = "extractive"
SUMMARY_TYPE_LABELS = {
    "none": "none yet",
    "llm": "LLM summary",
    SUMMARY_KIND_EXTRACTIVE: "extractive summary",
    "raw": "raw archive",
}
HEALTH_LABELS = {
    "idle": "idle",
    "ok": "ok",
    "retrying": "retrying",
    "failover": "failover",
    "raw_archive": "raw archive",
}
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
JOB_STATUS_LABELS = {
    "idle": "idle",
    "queued": "queued",
    "batched": "batched: starts when the chat goes idle",
    "running": "running",
    "failed": "failed",
}
# Where a current key fact was in the last request (its snapshot's "facts" groups, docs/memory.md §11).
FACT_PINNED = "pinned"
FACT_IN_WINDOW = "in_window"
FACT_OVER_BUDGET = "over_budget"
FACT_STATUS_LABELS = {
    FACT_PINNED: "pinned in the block",
    FACT_IN_WINDOW: "in the window",
    FACT_OVER_BUDGET: "not pinned (budget)",
}
MARK_SUMMARIZED = "summarized"
MARK_RETAINED = "retained"
MARK_CURRENT = "current"
# A note the app wrote in place of a reply: shown, never sent to the model (docs/memory.md F-37).
MARK_NOT_SENT = "not-sent"
# Stored after the last request was built (above all, the reply to it): the next request carries it.
MARK_NEXT = "next"
MARK_LABELS = {
    MARK_SUMMARIZED: "in summary",
    MARK_RETAINED: "retained window",
    MARK_CURRENT: "current turn",
    MARK_NOT_SENT: "not sent to the model",
    MARK_NEXT: "next request",
}
# The gauge's level (Gauge.level) in words: the bar's colour and pattern never say it alone.
GAUGE_LEVEL_LABELS = {
    "low": "under the target",
    "mid": "over the target",
    "high": "over the trigger",
    "over": "over the context window",
}


@dataclass(frozen=True, kw_only=True)
class Gauge:
    """The request size against the context window; all figures in tokens."""

    used: int
    context_window: int
    trigger_tokens: int
    target_tokens: int

    @property
    def used_percent(self) -> float:
        """``used`` as a share of the window, capped at 100 (for the bar's width)."""
        return min(100.0, _percent(self.used, self.context_window))

    @property
    def trigger_percent(self) -> float:
        return _percent(self.trigger_tokens, self.context_window)

    @property
    def target_percent(self) -> float:
        return _percent(self.target_tokens, self.context_window)

    @property
    def level(self) -> str:
        """``low`` (at most the target), ``mid`` (up to the trigger), ``high`` (over the trigger,
        within the window) or ``over`` (over the window): the gauge's colour and pattern."""
        if self.used > self.context_window:
            return "over"
        if self.used > self.trigger_tokens:
            return "high"
        if self.used > self.target_tokens:
            return "mid"
        return "low"

    @property
    def level_label(self) -> str:
        """:attr:`level` in words (``under the target``, ``over the target``, ``over the
        trigger``, ``over the context window``), shown beside the bar and read by screen readers."""
        return GAUGE_LEVEL_LABELS[self.level]

    @property
    def value_text(self) -> str:
        """The whole gauge in one sentence for assistive technology (the meter's
        ``aria-valuetext``): used and window, the level, then the marks with their figures."""
        return (
            f"{self.used:,} of {self.context_window:,} tokens, {self.level_label}; "
            f"target {self.target_tokens:,}, trigger {self.trigger_tokens:,}, window {self.context_window:,}"
        )


@dataclass(frozen=True, kw_only=True)
class Section:
    """One part of a request: ``tokens`` as the engine counted them, ``percent`` of the context
    window, ``text`` the exact text sent (``""`` for the free space and the reply priming)."""

    key: str
    label: str
    tokens: int
    percent: float
    text: str = ""
    message_count: int = 0


@dataclass(frozen=True, kw_only=True)
class MarkBasis:
    """What decides a transcript message's mark: the summary's ``boundary`` (covered: id at most
    the boundary) and the ids the last request sent as retained window and as current turn."""

    boundary: int | None = None
    history_ids: frozenset[int] = frozenset()
    current_ids: frozenset[int] = frozenset()

    @property
    def newest_id(self) -> int | None:
        """The largest message id the last request covered (its summary's boundary, its retained
        window and its current turn); None before any request and any summary."""
        ids = [*self.history_ids, *self.current_ids]
        if self.boundary is not None:
            ids.append(self.boundary)
        return max(ids, default=None)

    def mark(self, message_id: int) -> str:
        """``summarized``, ``retained``, ``current``; ``next`` for a message stored after the last
        request was built -- above all the reply to it, which no request has carried yet, so every
        bubble says where it stands; ``""`` for an older message the last request did not carry."""
        if self.boundary is not None and message_id <= self.boundary:
            return MARK_SUMMARIZED
        if message_id in self.history_ids:
            return MARK_RETAINED
        if message_id in self.current_ids:
            return MARK_CURRENT
        newest = self.newest_id
        if newest is None or message_id > newest:
            return MARK_NEXT
        return ""

    def mark_of(self, message_id: int, origin: str) -> str:
        """:meth:`mark`, except :data:`MARK_NOT_SENT` for a row of ``origin`` ``app``, which no
        request ever holds nor any summary covers (docs/memory.md F-37)."""
        return MARK_NOT_SENT if origin == Message.Origin.APP else self.mark(message_id)


@dataclass(frozen=True, kw_only=True)
class EstimateCheck:
    """Our estimate of one request against the provider's ``usage.prompt_tokens`` and the
    calibration the request was budgeted with (docs/memory.md §5, "Calibration"); tokens.

    ``estimated_tokens``: the engine's estimate; ``prompt_tokens``: the provider's figure (None
    until the reply ended, or when it reports none); ``factor``: provider tokens per estimated
    token the budget applied; ``context_window`` the model's window and ``window_tokens`` the
    same in estimated tokens; ``enabled``: ``LLM_TOKEN_CALIBRATION``; ``offline``: the offline
    engine, which counts with our own tokenizer, so the page shows no comparison; ``recorded``:
    the call was recorded with its calibration (False for calls older than calibration)."""

    estimated_tokens: int
    prompt_tokens: int | None
    factor: float = 1.0
    context_window: int
    window_tokens: int
    enabled: bool = False
    offline: bool = False
    recorded: bool = False

    @property
    def shown(self) -> bool:
        """Whether the page compares the figures: not for the offline engine."""
        return not self.offline

    @property
    def ratio(self) -> float | None:
        """This request's provider figure per estimated token (None when not reported)."""
        if self.prompt_tokens is None or self.estimated_tokens <= 0:
            return None
        return self.prompt_tokens / self.estimated_tokens

    @property
    def difference(self) -> int | None:
        """Provider-reported minus estimated tokens (None when not reported)."""
        return None if self.prompt_tokens is None else self.prompt_tokens - self.estimated_tokens


def estimate_check_build(
    calibration: dict[str, Any] | None, *, estimated_tokens: int, prompt_tokens: int | None, context_window: int
) -> EstimateCheck:
    """The :class:`EstimateCheck` of a request from the ``calibration`` its record or its
    ``memory.context`` event carries (``{factor, window_tokens, enabled, offline}``, see
    :func:`chatapp.llm.calibration.calibration_report`; None for calls older than calibration)."""
    calibration = calibration or {}
    return EstimateCheck(
        estimated_tokens=estimated_tokens,
        prompt_tokens=prompt_tokens,
        factor=float(calibration.get("factor") or 1.0),
        context_window=context_window,
        window_tokens=int(calibration.get("window_tokens") or context_window),
        enabled=bool(calibration.get("enabled")),
        offline=bool(calibration.get("offline")),
        recorded=bool(calibration),
    )


@dataclass(frozen=True, kw_only=True)
class RequestSnapshot:
    """The last request sent to the chat model, from its ``ModelCall`` record.

    ``gauge.used`` is the engine's estimate (``ModelCall.estimated_tokens``); ``prompt_tokens``
    what the provider reported (None until the reply ended, or when it reports nothing).
    ``summary`` is the summary state the request was built with.
    """

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
    def prompt_tokens_difference(self) -> int | None:
        """Provider-reported minus estimated prompt tokens (None when not reported)."""
        return None if self.prompt_tokens is None else self.prompt_tokens - self.gauge.used


@dataclass(frozen=True, kw_only=True)
class AttemptStep:
    """One entry of an :class:`AttemptLog`: a summarizer try (``kind`` ``try``: its ``number``
    in its layer, ``ok``, and for a failed one ``error_index``, the 1-based position of its error
    in :attr:`AttemptLog.errors` when the log has several) or the backoff wait before one
    (``kind`` ``wait``). ``ms``: milliseconds."""

    kind: str
    ms: int
    number: int = 0
    ok: bool = True
    error_index: int | None = None


@dataclass(frozen=True, kw_only=True)
class AttemptGroup:
    """Consecutive tries of one summarizer: ``phase`` ``primary`` or ``failover``, its ``model``,
    and its tries with the waits between them, in order."""

    phase: str
    model: str
    steps: list[AttemptStep]


@dataclass(frozen=True, kw_only=True)
class ErrorLine:
    """One distinct error of an :class:`AttemptLog` and how many tries failed with it."""

    text: str
    count: int


@dataclass(frozen=True, kw_only=True)
class AttemptLog:
    """A compression's summarizer attempts as the inspector lists them: each distinct error once
    (``errors``, first seen first), the tries and backoff waits in order (``groups``), and
    milliseconds that add up: ``total_ms = tries_ms + waits_ms + other_ms``, where ``other_ms`` is
    the rest of the compression's recorded duration (transcript, raw archive, bookkeeping; also
    the waits of attempts recorded before waits were)."""

    groups: list[AttemptGroup]
    errors: list[ErrorLine]
    tries: int
    failed: int
    tries_ms: int
    waits_ms: int
    other_ms: int

    @property
    def total_ms(self) -> int:
        return self.tries_ms + self.waits_ms + self.other_ms


# An endpoint's error names the endpoint, then quotes the provider's message, which may name the
# same engine again ("LLMError: The offline engine failed with HTTP 500: offline engine: ...",
# after the exception's class as the summarizer records it). A label with a colon (an endpoint's
# URL) never matches.
_REPEATED_LABEL = re.compile(r"^(?P<head>(?:\w+: )?(?:The )?(?P<label>[^:]+?) [^:]*?: )(?P=label): ", re.IGNORECASE)


def error_text(text: str) -> str:
    """A summarizer error as the inspector shows it: ``text`` with the engine's name said once
    (``LLMError: The offline engine failed with HTTP 500: injected`` for ``... HTTP 500: offline
    engine: injected``); any other text unchanged. Pure."""
    return _REPEATED_LABEL.sub(r"\g<head>", text, count=1)


def attempt_log_build(attempts: Iterable[dict[str, Any]], *, duration_ms: int) -> AttemptLog:
    """The :class:`AttemptLog` of a compression event's ``attempts`` (``{"model", "phase",
    "number", "latency_ms", "ok", "error", "wait_ms"}``, :class:`memory.summarizer.Attempt`) and
    its ``duration_ms``. Pure. A try numbered 1, or of another phase or model, starts a new group
    (a long transcript is summarized in chunks, each with its own tries). When the parts add up to
    more than ``duration_ms`` (an event that recorded no duration, or rounding to whole
    milliseconds), ``other_ms`` is 0 and the total is the parts' sum. Errors are tidied by
    :func:`error_text`."""
    rows = list(attempts)
    distinct: dict[str, int] = {}
    for row in rows:
        if not row.get("ok"):
            error = error_text(str(row.get("error") or "(no message)"))
            distinct[error] = distinct.get(error, 0) + 1
    numbered = len(distinct) > 1
    indexes = {error: index for index, error in enumerate(distinct, 1)}
    groups: list[AttemptGroup] = []
    for row in rows:
        phase, model, number = str(row.get("phase") or ""), str(row.get("model") or ""), int(row.get("number") or 0)
        last = groups[-1] if groups else None
        if last is None or number <= 1 or (last.phase, last.model) != (phase, model):
            last = AttemptGroup(phase=phase, model=model, steps=[])
            groups.append(last)
        wait_ms = int(row.get("wait_ms") or 0)
        if wait_ms > 0:
            last.steps.append(AttemptStep(kind="wait", ms=wait_ms))
        ok = bool(row.get("ok"))
        error_index = None if ok else indexes.get(error_text(str(row.get("error") or "(no message)")))
        last.steps.append(
            AttemptStep(
                kind="try",
                ms=int(row.get("latency_ms") or 0),
                number=number,
                ok=ok,
                error_index=error_index if numbered else None,
            )
        )
    tries_ms = sum(int(row.get("latency_ms") or 0) for row in rows)
    waits_ms = sum(int(row.get("wait_ms") or 0) for row in rows)
    return AttemptLog(
        groups=groups,
        errors=[ErrorLine(text=text, count=count) for text, count in distinct.items()],
        tries=len(rows),
        failed=sum(distinct.values()),
        tries_ms=tries_ms,
        waits_ms=waits_ms,
        other_ms=max(0, duration_ms - tries_ms - waits_ms),
    )


@dataclass(frozen=True, kw_only=True)
class SummaryVersion:
    """One write of the summary: a compression event of kind ``compression``. ``tokens_before``
    and ``tokens_after`` are the request's size around it; ``previous_chars`` is the length of the
    summary it replaced, in characters (0 for the first; None when that version is older than the
    events read)."""

    version: int | None
    created_at: datetime
    result_type: str
    degraded: bool
    messages_summarized: int
    boundary_before: int | None
    boundary_after: int | None
    tokens_before: int
    tokens_after: int
    content: str
    previous_chars: int | None = None
    summary_kind: str = ""

    @property
    def result_label(self) -> str:
        """How this version was written, in words (see :func:`summary_kind`)."""
        kind = self.summary_kind or self.result_type
        return SUMMARY_TYPE_LABELS.get(kind, kind)


@dataclass(frozen=True, kw_only=True)
class CurrentSummary:
    """The session's stored summary now (``summary_type`` none/llm/raw; ``boundary`` the id of
    the last message it covers) and its versions, newest first. ``summary_kind``: how it was
    written (:func:`summary_kind`; ``""`` when its version is not among the events read)."""

    summary_type: str
    content: str
    boundary: int | None
    compressed_count: int
    version: int
    versions: list[SummaryVersion] = field(default_factory=list)
    summary_kind: str = ""

    @property
    def kind(self) -> str:
        """``none``, ``llm``, ``extractive`` or ``raw``: the stored type, told apart by who wrote it."""
        return self.summary_kind or self.summary_type

    @property
    def type_label(self) -> str:
        """``LLM summary``, ``extractive summary``, ``raw archive`` or ``none yet``."""
        return SUMMARY_TYPE_LABELS.get(self.kind, self.kind)


@dataclass(frozen=True, kw_only=True)
class TimelineEvent:
    """One compression event as the timeline shows it; ``attempts`` are the summarizer tries
    ``{"model", "phase", "number", "latency_ms", "ok", "error"}``, ``notes`` plain sentences."""

    id: int
    kind: str
    created_at: datetime
    tokens_before: int
    tokens_after: int
    trigger_tokens: int
    target_tokens: int
    messages_summarized: int
    duration_ms: int
    result_type: str
    degraded: bool
    boundary_before: int | None
    boundary_after: int | None
    summary_version: int | None
    attempts: list[dict[str, Any]]
    notes: list[str]
    origin: str = "request"
    summary_kind: str = ""

    @property
    def result_label(self) -> str:
        return SUMMARY_TYPE_LABELS.get(self.summary_kind, self.summary_kind)

    @property
    def attempt_log(self) -> AttemptLog:
        """Its attempts with their waits, each error once (:func:`attempt_log_build`)."""
        return attempt_log_build(self.attempts, duration_ms=self.duration_ms)

    @property
    def kind_label(self) -> str:
        return self.kind.replace("_", " ")


@dataclass(frozen=True, kw_only=True)
class Health:
    """The summarizer's health as of the last compression (``memory.services.summarizer_health_get``).
    ``event_id``: that compression event in the timeline, where its attempts and error are listed
    (None when the timeline does not hold it)."""

    status: str
    last_error: str
    attempts: list[dict[str, Any]]
    at: datetime | None
    event_id: int | None = None

    @property
    def label(self) -> str:
        return HEALTH_LABELS.get(self.status, self.status)

    @property
    def error(self) -> str:
        """``last_error`` as the inspector shows it (:func:`error_text`)."""
        return error_text(self.last_error)

    @property
    def failed_attempts(self) -> int:
        return sum(1 for attempt in self.attempts if not attempt.get("ok"))


@dataclass(frozen=True, kw_only=True)
class MemoryJob:
    """The session's memory job (docs/memory.md §10): ``status`` idle / queued (pending in this
    process) / running (here, or holding its lease on another worker) / failed (the last job had a
    failed step); ``last_error`` of the last job; ``watermarks`` step name → message id;
    ``attempts`` step name → its last attempt ``{step, at, ok, error, duration_ms,
    watermark_before, watermark_after}``; ``runs``: jobs that had work, so far."""

    status: str
    last_error: str
    watermarks: dict[str, Any]
    attempts: dict[str, dict[str, Any]]
    runs: int

    @property
    def label(self) -> str:
        return JOB_STATUS_LABELS.get(self.status, self.status)


@dataclass(frozen=True, kw_only=True)
class FactRow:
    """One key fact as the inspector lists it: ``status`` is where the last request had it
    (:data:`FACT_PINNED`, :data:`FACT_IN_WINDOW`, :data:`FACT_OVER_BUDGET`, or ``""`` when that
    request did not consider it or recorded no facts); ``replaced_by`` is, for a superseded
    fact, the fact that superseded it (None when unknown)."""

    fact: KeyFact
    status: str = ""
    replaced_by: KeyFact | None = None

    @property
    def status_label(self) -> str:
        return FACT_STATUS_LABELS.get(self.status, "")

    @property
    def note(self) -> str:
        """The fact's one-line ``text`` when it says more than the value: ``""`` for a rule's
        fact, whose text only restates its key and value (docs/memory.md §11)."""
        text = self.fact.text
        return "" if self.fact.extractor == "rule" or not text or text == self.fact.value else text

    @property
    def extractor_label(self) -> str:
        """Who found the fact: ``rule``, ``LLM (<model>)``, ``offline engine (no language model)``
        (the offline engine answers extraction requests with patterns) or ``you`` (an edited value)."""
        extractor = self.fact.extractor
        if extractor == "user":
            return "you"
        if extractor.startswith("llm:"):
            model = extractor.removeprefix("llm:")
            return "offline engine (no language model)" if model == OFFLINE_MODEL else f"LLM ({model})"
        return extractor


@dataclass(frozen=True, kw_only=True)
class KeyFacts:
    """The inspector's Key facts section of one session (docs/memory.md §11).

    ``current``: facts neither superseded nor hidden, those the owner pinned first, then newest
    first; ``superseded``: facts a newer value of their slot replaced (kept, never deleted),
    newest first; ``hidden``: facts the owner hid (whether superseded or not), newest first.
    ``request``: the last request's ``facts`` snapshot ``{"pinned", "in_window", "over_budget":
    [fact ids], "tokens": n}`` (None before the first request, or for a request recorded without
    it). ``error``: what was wrong with the owner's last input (``""`` when nothing), about fact
    ``error_fact_id``.
    """

    session_id: int
    current: list[FactRow] = field(default_factory=list)
    superseded: list[FactRow] = field(default_factory=list)
    hidden: list[FactRow] = field(default_factory=list)
    request: dict[str, Any] | None = None
    error: str = ""
    error_fact_id: int | None = None

    @property
    def block_tokens(self) -> int | None:
        """The size of the last request's key-facts block in tokens (None when not recorded)."""
        return None if self.request is None else int(self.request.get("tokens") or 0)

    @property
    def over_budget_count(self) -> int:
        return sum(1 for row in self.current if row.status == FACT_OVER_BUDGET)

    @property
    def fact_ids(self) -> frozenset[int]:
        """The ids of every fact listed (current, superseded and hidden)."""
        return frozenset(row.fact.id for row in (*self.current, *self.superseded, *self.hidden))


def key_facts_build(*, session_id: int, facts: Iterable[KeyFact], request: dict[str, Any] | None) -> KeyFacts:
    """The Key facts section from every stored fact of the session (``facts``: current,
    superseded and hidden, as ``memory.api.key_fact_list`` returns them or a ``memory.facts``
    event carries them) and the last request's ``facts`` snapshot (see :class:`KeyFacts`). Pure."""
    rows = list(facts)
    by_id = {fact.id: fact for fact in rows}
    statuses: dict[int, str] = {}
    if request is not None:
        for status in (FACT_OVER_BUDGET, FACT_IN_WINDOW, FACT_PINNED):
            statuses.update({int(fact_id): status for fact_id in request.get(status) or ()})
    newest_first = sorted(rows, key=lambda fact: -fact.id)
    current, superseded, hidden = [], [], []
    for fact in newest_first:
        row = FactRow(
            fact=fact,
            status=statuses.get(fact.id, "") if fact.active else "",
            replaced_by=by_id.get(fact.superseded_by) if fact.superseded_by is not None else None,
        )
        if fact.hidden_by_user:
            hidden.append(row)
        elif fact.invalidated_at is not None:
            superseded.append(row)
        else:
            current.append(row)
    current.sort(key=lambda row: not row.fact.pinned_by_user)
    return KeyFacts(session_id=session_id, current=current, superseded=superseded, hidden=hidden, request=request)


def key_facts_get(*, session_id: int, request: dict[str, Any] | None) -> KeyFacts:
    """The Key facts section of chat session ``session_id`` as stored, with the ``facts``
    snapshot ``request`` of its last request (no access check: callers authorize)."""
    facts = memory_engine().facts(memory_key_of(session_id))
    return key_facts_build(session_id=session_id, facts=facts, request=request)


def key_facts_of_call(call: ModelCall | None) -> dict[str, Any] | None:
    """The ``facts`` snapshot of a recorded model call (None without a call, for a call recorded
    before the key facts were kept, and for one built without a facts loader: ``{}``)."""
    facts = call.context.get("facts") if call is not None else None
    return facts if isinstance(facts, dict) and facts else None


def key_facts_section_get(*, session_id: int) -> KeyFacts:
    """The Key facts section of chat session ``session_id``, with the ``facts`` snapshot of its
    newest model call (no access check: callers authorize)."""
    last_call = ModelCall.objects.filter(session_id=session_id).order_by("-id").first()
    return key_facts_get(session_id=session_id, request=key_facts_of_call(last_call))


def key_fact_from_dict(data: dict[str, Any]) -> KeyFact:
    """A fact from its JSON form (``KeyFact.as_dict()``, as a ``memory.facts`` event carries it).
    Raises ``KeyError`` for a missing ``id``, ``key`` or ``value``."""
    return KeyFact(
        id=int(data["id"]),
        kind=str(data.get("kind") or "other"),
        key=str(data["key"]),
        value=str(data["value"]),
        text=str(data.get("text") or ""),
        source_message_id=_int_or_none(data.get("source_message_id")),
        excerpt=str(data.get("excerpt") or ""),
        extractor=str(data.get("extractor") or "rule"),
        valid_from=_datetime_or_none(data.get("valid_from")),
        invalidated_at=_datetime_or_none(data.get("invalidated_at")),
        superseded_by=_int_or_none(data.get("superseded_by")),
        pinned_by_user=bool(data.get("pinned_by_user")),
        hidden_by_user=bool(data.get("hidden_by_user")),
        last_seen_message_id=_int_or_none(data.get("last_seen_message_id")),
        replaces=str(data.get("replaces") or ""),
    )


@dataclass(frozen=True, kw_only=True)
class RecallEntry:
    """One candidate of a request's recall as the inspector lists it (an entry of
    :func:`memory.api.recall_report`'s ``items``, ``rejected`` or ``over_budget``).

    ``session_id``: the chat its message is in (None when its memory key names no chat);
    ``same_chat``: that chat is the inspected one; ``message_ids``: its stored messages, oldest
    first; ``lexical_rank`` (1 = the best full-text hit) and ``dense_rank`` (1 = the best cosine)
    are None when that side did not find it; ``cosine`` is None without an embedding; ``rrf``
    the fused rank, ``decay`` the age factor (0.9..1), ``score`` = ``rrf * decay``; ``reason``
    the admission gate's verdict in words (docs/memory.md §12); ``context_of``: for an item
    brought as the context of a recalled one (not gated, no score), that item's id, else None.
    """

    item_id: int
    session_id: int | None
    same_chat: bool
    chat_title: str
    message_ids: tuple[int, ...]
    role: str
    created_at: datetime | None
    text: str
    lexical_rank: int | None
    cosine: float | None
    dense_rank: int | None
    rrf: float
    decay: float
    score: float
    reason: str
    context_of: int | None = None

    @property
    def message_id(self) -> int | None:
        """The message the entry links to: its newest (a tool result's own, not its call's)."""
        return self.message_ids[-1] if self.message_ids else None

    @property
    def href(self) -> str:
        """A link to the message: the transcript anchor ``#message-N`` in the same chat, that
        chat's page with the anchor for another chat of the owner, ``""`` when unknown."""
        if self.message_id is None:
            return ""
        anchor = f"#message-{self.message_id}"
        if self.same_chat:
            return anchor
        if self.session_id is None:
            return ""
        return reverse("session-detail", kwargs={"session_id": self.session_id}) + anchor


@dataclass(frozen=True, kw_only=True)
class RecallSection:
    """The inspector's Recall section of one session (docs/memory.md §12): what recall brought
    into the last request and why.

    ``request``: that request's recall report (:func:`memory.api.recall_report`; None before
    the first request, or for one recorded without recall); ``embedder``: the embedder the
    settings select now (``{backend, model, reason}``, :func:`chatapp.llm.embeddings.embedder_choice`);
    ``index``: the session's own index (``{items, embedded, models}``,
    :func:`memory.api.memory_index_status`; None when not read); ``items`` the recalled entries
    in block order, ``rejected`` the best refused ones, ``over_budget`` admitted ones left out
    for the token budget (best score first).
    """

    session_id: int
    request: dict[str, Any] | None
    embedder: dict[str, str]
    index: dict[str, Any] | None = None
    items: list[RecallEntry] = field(default_factory=list)
    rejected: list[RecallEntry] = field(default_factory=list)
    over_budget: list[RecallEntry] = field(default_factory=list)

    @property
    def query(self) -> str:
        return "" if self.request is None else str(self.request.get("query") or "")

    @property
    def model(self) -> str | None:
        """The embedding model the last request's search used; None: lexical only."""
        return None if self.request is None else self.request.get("model") or None

    @property
    def lexical_only(self) -> bool:
        """The last request's search was full-text only (no embedder, or it failed or was late)."""
        return self.request is not None and self.model is None

    @property
    def latency_ms(self) -> int:
        return 0 if self.request is None else int(self.request.get("latency_ms") or 0)

    @property
    def tokens(self) -> int:
        """The size of the last request's recall block in tokens (0: no block)."""
        return 0 if self.request is None else int(self.request.get("tokens") or 0)

    @property
    def notes(self) -> list[str]:
        return [] if self.request is None else [str(note) for note in self.request.get("notes") or []]


def recall_build(
    *,
    session_id: int,
    request: dict[str, Any] | None,
    embedder: dict[str, str],
    index: dict[str, Any] | None = None,
) -> RecallSection:
    """The Recall section from a request's recall report ``request`` (see
    :class:`RecallSection`; a ``memory.context`` event's ``recall`` or a ``ModelCall``'s
    ``context["recall"]``). Pure; entries whose ``item_id`` is missing are skipped."""

    def entries(key: str) -> list[RecallEntry]:
        found = request.get(key) if request is not None else None
        return [_recall_entry(entry, session_id=session_id) for entry in found or () if "item_id" in entry]

    return RecallSection(
        session_id=session_id,
        request=request,
        embedder=embedder,
        index=index,
        items=entries("items"),
        rejected=entries("rejected"),
        over_budget=entries("over_budget"),
    )


def _recall_entry(entry: dict[str, Any], *, session_id: int) -> RecallEntry:
    memory_key = str(entry.get("memory_key") or "")
    chat_id = session_of(memory_key) if memory_key.isdigit() else None
    cosine = entry.get("cosine")
    return RecallEntry(
        item_id=int(entry["item_id"]),
        session_id=chat_id,
        same_chat=chat_id == session_id,
        chat_title=str(entry.get("chat_title") or ""),
        message_ids=tuple(int(i) for i in entry.get("message_ids") or ()),
        role=str(entry.get("role") or ""),
        created_at=_datetime_or_none(entry.get("created_at")),
        text=str(entry.get("text") or ""),
        lexical_rank=_int_or_none(entry.get("lexical_rank")),
        cosine=None if cosine is None else float(cosine),
        dense_rank=_int_or_none(entry.get("dense_rank")),
        rrf=float(entry.get("rrf") or 0.0),
        decay=float(entry.get("decay") or 0.0),
        score=float(entry.get("score") or 0.0),
        reason=str(entry.get("reason") or ""),
        context_of=_int_or_none(entry.get("context_of")),
    )


def recall_of_call(call: ModelCall | None) -> dict[str, Any] | None:
    """The recall report of a recorded model call (None without a call, for a call recorded
    before recall was kept, and for one built without recall: ``{}``)."""
    recall = call.context.get("recall") if call is not None else None
    return recall if isinstance(recall, dict) and recall else None


def recall_get(*, session_id: int, request: dict[str, Any] | None) -> RecallSection:
    """The Recall section of chat session ``session_id`` with the recall report ``request`` of
    its last request, the embedder the settings select and the session's index status (one
    query; no access check: callers authorize)."""
    return recall_build(
        session_id=session_id,
        request=request,
        embedder=embedder_choice().as_dict(),
        index=memory_engine().index_status(memory_key_of(session_id)),
    )


def recall_section_get(*, session_id: int) -> RecallSection:
    """The Recall section of chat session ``session_id``, with the recall report of its newest
    model call (no access check: callers authorize)."""
    last_call = ModelCall.objects.filter(session_id=session_id).order_by("-id").first()
    return recall_get(session_id=session_id, request=recall_of_call(last_call))


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _datetime_or_none(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


@dataclass(frozen=True, kw_only=True)
class InspectorState:
    """Everything the inspector panel shows for one session. ``can_compress``: whether "Compress
    now" has something to fold (a message before the newest user message that the summary does
    not cover yet); the button is disabled otherwise."""

    session_id: int
    request: RequestSnapshot | None
    summary: CurrentSummary
    timeline: list[TimelineEvent]
    health: Health
    job: MemoryJob
    key_facts: KeyFacts
    can_compress: bool
    recall: RecallSection | None = None

    @property
    def basis(self) -> MarkBasis:
        """The basis of the transcript's marks: the stored boundary and the last request's ids."""
        return MarkBasis(
            boundary=self.summary.boundary,
            history_ids=self.request.history_ids if self.request else frozenset(),
            current_ids=self.request.current_ids if self.request else frozenset(),
        )


def inspector_state_get(*, session_id: int) -> InspectorState:
    """The inspector's state for chat session ``session_id`` (no access check: callers authorize).

    ``request`` is the session's newest ``ModelCall`` (None before the first), ``key_facts``
    every key fact of the session with that call's key-facts groups, ``recall`` that call's
    recall (docs/memory.md §12) with the embedder and the index status; the timeline and the
    summary versions cover the newest ``TIMELINE_MAX_EVENTS`` compression events, newest first.
    """
    memory_key = memory_key_of(session_id)
    engine = memory_engine()
    events = engine.events(memory_key, limit=TIMELINE_MAX_EVENTS)[::-1]
    stored = engine.summary(memory_key)
    versions = summary_versions_build(events)
    written = next((version for version in versions if version.version == stored.version), None)
    summary = CurrentSummary(
        summary_type=stored.summary_type,
        content=stored.content,
        boundary=stored.last_message_id,
        compressed_count=stored.compressed_count,
        version=stored.version,
        versions=versions,
        summary_kind=written.summary_kind if written is not None and written.result_type == stored.summary_type else "",
    )
    health = engine.health(memory_key)
    # The event the health is read from: the newest compression or superseded one.
    health_event = next((event for event in events if event.kind in ("compression", "superseded")), None)
    last_call = ModelCall.objects.filter(session_id=session_id).order_by("-id").first()
    job = engine.job_state(memory_key)
    job_status: str = engine.job_activity(memory_key) or job.status
    last_error = job.last_error
    if job_status == "running" and job.lease_expires_at is not None and job.lease_expires_at < timezone.now():
        job_status, last_error = "failed", "the worker running it stopped before it finished (its lease ran out)"
    # What "Compress now" folds (chatapp.conversation.compress): the messages before the newest
    # user message, past the summary's boundary.
    messages = Message.objects.filter(session_id=session_id)
    last_user_id = messages.filter(role=Message.Role.USER).order_by("-id").values_list("id", flat=True).first()
    can_compress = (
        last_user_id is not None and messages.filter(id__lt=last_user_id, id__gt=stored.last_message_id or 0).exists()
    )
    return InspectorState(
        session_id=session_id,
        can_compress=can_compress,
        request=request_snapshot_build(last_call) if last_call is not None else None,
        key_facts=key_facts_get(session_id=session_id, request=key_facts_of_call(last_call)),
        recall=recall_get(session_id=session_id, request=recall_of_call(last_call)),
        summary=summary,
        timeline=[_timeline_event(event) for event in events],
        health=Health(
            status=health["status"],
            last_error=health["last_error"],
            attempts=list(health["attempts"]),
            at=datetime.fromisoformat(health["at"]) if health["at"] else None,
            event_id=health_event.id if health_event is not None else None,
        ),
        job=MemoryJob(
            status=job_status,
            last_error=last_error,
            watermarks=dict(job.watermarks),
            attempts=dict(job.attempts),
            runs=job.runs,
        ),
    )


def message_marks_get(*, session_id: int, basis: MarkBasis) -> dict[int, str]:
    """``{message id: mark}`` for every message of the session (see :meth:`MarkBasis.mark_of`)."""
    rows = Message.objects.filter(session_id=session_id).order_by("id").values_list("id", "origin")
    return {message_id: basis.mark_of(message_id, origin) for message_id, origin in rows}


def request_snapshot_build(call: ModelCall) -> RequestSnapshot:
    """The inspector's view of one recorded model call (pure: reads only ``call``'s fields).

    Sections are the engine's own per-section counts; ``Reply priming`` is the rest of the
    estimate (the tokens every request adds for the reply to start) and ``Free`` what is left of
    the context window, so the rows add up to the window exactly. The gauge's window is the
    context window in estimated tokens (divided by the calibration factor the request was
    budgeted with, docs/memory.md §5, "Calibration"), the unit of every other figure.
    """
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
            percent=_percent(int(counts.get(key, 0)), window),
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
            percent=_percent(tool_tokens, window),
            text=json.dumps(tools, ensure_ascii=False, indent=2) if tools else "",
            message_count=len(tools),
        )
    )
    overhead = used - sum(section.tokens for section in sections)
    sections.append(Section(key="overhead", label="Reply priming", tokens=overhead, percent=_percent(overhead, window)))
    free = max(0, window - used)
    sections.append(Section(key="free", label="Free", tokens=free, percent=_percent(free, window)))
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
    """Wire messages as readable text: per message a ``[role ...]`` line, then the content exactly
    as sent, then its ``tool_calls`` as JSON. Messages are separated by a blank line."""
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


def summary_versions_build(events: list[CompressionRecord]) -> list[SummaryVersion]:
    """The summary's versions from compression events (newest first, as given), each with the
    size of the summary it replaced: the next older version's, 0 for version 1."""
    writes = [event for event in events if event.kind == "compression"]
    versions: list[SummaryVersion] = []
    for index, event in enumerate(writes):
        older = writes[index + 1] if index + 1 < len(writes) else None
        if older is not None:
            previous: int | None = len(older.summary_content)
        else:
            previous = 0 if event.summary_version == 1 else None
        versions.append(replace(_summary_version(event), previous_chars=previous))
    return versions


def _summary_version(event: CompressionRecord) -> SummaryVersion:
    return SummaryVersion(
        version=event.summary_version,
        created_at=_datetime_or_none(event.created_at) or timezone.now(),
        result_type=event.result_type,
        degraded=event.degraded,
        messages_summarized=event.messages_summarized,
        boundary_before=event.boundary_before,
        boundary_after=event.boundary_after,
        tokens_before=event.tokens_before,
        tokens_after=event.tokens_after,
        content=event.summary_content,
        summary_kind=event.summary_kind,
    )


def _timeline_event(event: CompressionRecord) -> TimelineEvent:
    return TimelineEvent(
        id=event.id or 0,
        kind=event.kind,
        created_at=_datetime_or_none(event.created_at) or timezone.now(),
        tokens_before=event.tokens_before,
        tokens_after=event.tokens_after,
        trigger_tokens=event.trigger_tokens,
        target_tokens=event.target_tokens,
        messages_summarized=event.messages_summarized,
        duration_ms=event.duration_ms,
        result_type=event.result_type,
        degraded=event.degraded,
        boundary_before=event.boundary_before,
        boundary_after=event.boundary_after,
        summary_version=event.summary_version,
        attempts=list(event.attempts or []),
        notes=[_note_text(note) for note in event.notes or []],
        origin=event.origin,
        summary_kind=event.summary_kind,
    )


def _note_text(note: Any) -> str:
    if isinstance(note, str):
        return note
    if isinstance(note, dict) and "elisions" in note:
        return f"elided {len(note['elisions'])} message(s) of the current turn"
    return json.dumps(note, ensure_ascii=False)


def _percent(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole > 0 else 0.0
