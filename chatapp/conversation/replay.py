"""Replays of recorded conversations (tau-bench, LoCoMo) through the live memory path (``manage.py replay``): one
record per model call, the memory job run between calls, then LoCoMo's questions (docs/replay.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal

from asgiref.sync import async_to_sync, sync_to_async
from django.utils import timezone as django_timezone

from chatapp.chats import selectors, services
from chatapp.chats.access import Owner
from chatapp.chats.memory import ChatConversations, memory_config, memory_engine, memory_key_of, session_scope_key
from chatapp.conversation import leases
from chatapp.llm.clients import chat_endpoint
from chatapp.models import Message, TurnLease
from memory.api import ContextRequest, MemoryConfig, MemoryContext, NextRequest, Notice, TurnRecall

Format = Literal["tau-bench", "locomo"]
# Scope key ``anon:replay``: with MEMORY_RECALL_SCOPE=owner, replays recall from earlier ones (docs/replay.md).
REPLAY_OWNER = Owner(user_id=None, session_key="replay")
WIRE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
NO_TURN_YET = 2**62
# A question's id in its request: above every stored id, never stored.
QUESTION_ID = NO_TURN_YET + 1
# 4 single-hop, 1 multi-hop, 2 temporal, 3 open-domain; 5 (adversarial) has no answer.
QUESTION_CATEGORIES = (1, 2, 3, 4)
SESSION_KEY = re.compile(r"session_(\d+)")
# LoCoMo's session times ("1:56 pm on 8 May, 2023") and tau-bench's stated time ("The current time is
# 2024-05-15 15:00:00 EST."): the recorded "now" of a replay's requests (docs/memory.md F-52).
LOCOMO_TIME = re.compile(r"(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})", re.IGNORECASE)
STATED_TIME = re.compile(r"current time is (\d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})?)\s*([A-Z]{2,5})?")
ZONES = {"EST": -5, "EDT": -4, "CST": -6, "CDT": -5, "MST": -7, "MDT": -6, "PST": -8, "PDT": -7, "UTC": 0, "GMT": 0}


class ReplayInputError(Exception):
    """The input file is missing or not in the announced format."""


@dataclass(frozen=True, kw_only=True)
class Question:
    """An annotated LoCoMo question; ``evidence``: dialogue ids such as ``"D1:3"``."""

    text: str
    answer: str
    category: int
    evidence: list[str]
    conversation: str


@dataclass(frozen=True, kw_only=True)
class Conversation:
    """A recorded conversation (OpenAI wire messages); LoCoMo's also have ``turn_ids`` (dialogue ids, aligned with
    ``messages``) and ``questions``; ``times``: each message's recorded time (aware), empty when unknown."""

    name: str
    system_prompt: str
    messages: list[dict[str, Any]]
    turn_ids: list[str] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    times: list[datetime] = field(default_factory=list)


def locomo_time(text: str) -> datetime | None:
    """A LoCoMo session time as an aware datetime in the default time zone; None when unreadable."""
    match = LOCOMO_TIME.search(text or "")
    if match is None:
        return None
    hour, minute, half, day, month, year = match.groups()
    try:
        naive = datetime.strptime(f"{day} {month[:3]} {year} {hour}:{minute} {half}", "%d %b %Y %I:%M %p")
    except ValueError:
        return None
    return django_timezone.make_aware(naive, django_timezone.get_default_timezone())


def stated_time(system_prompt: str) -> datetime | None:
    """The time a system prompt states ("The current time is 2024-05-15 15:00:00 EST."), aware; None when none."""
    match = STATED_TIME.search(system_prompt or "")
    if match is None:
        return None
    moment = datetime.fromisoformat(match.group(1))
    zone = match.group(2)
    if zone in ZONES:
        return moment.replace(tzinfo=timezone(timedelta(hours=ZONES[zone]), zone))
    return django_timezone.make_aware(moment, django_timezone.get_default_timezone())


def conversations_read(path: Path, fmt: Format) -> Iterator[Conversation]:
    """The conversations of ``path`` in the layouts of docs/replay.md. Raises :class:`ReplayInputError`."""
    if fmt == "tau-bench":
        yield from _tau_bench(_load(path))
        return
    files = sorted(path.glob("conv-*.json")) if path.is_dir() else [path]
    if not files:
        raise ReplayInputError(f"no conv-*.json files in {path}")
    for file in files:
        data = _load(file)
        if not isinstance(data, list):
            yield locomo_conversation(data, file.stem)
            continue
        if not data:
            raise ReplayInputError(f"{file} holds an empty list: no conversation to replay")
        for position, item in enumerate(data, start=1):
            named = item.get("sample_id") if isinstance(item, dict) else None
            yield locomo_conversation(item, str(named or f"{file.stem}-{position}"))


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReplayInputError(f"{path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ReplayInputError(f"{path} is not readable JSON: {exc}") from None


def _tau_bench(data: Any) -> Iterator[Conversation]:
    if not isinstance(data, list) or not all(isinstance(item, dict) and "traj" in item for item in data):
        raise ReplayInputError("a tau-bench file is a JSON list of items with a 'traj' list")
    for index, item in enumerate(data):
        traj = item["traj"]
        system_prompt = traj[0]["content"] if traj and traj[0].get("role") == "system" else ""
        messages = [{k: m[k] for k in WIRE_KEYS if m.get(k) is not None} for m in traj[1 if system_prompt else 0 :]]
        when = stated_time(system_prompt)
        yield Conversation(
            name=f"tau-bench-{index}-task{item.get('task_id')}-trial{item.get('trial')}",
            system_prompt=system_prompt,
            messages=messages,
            times=[when] * len(messages) if when is not None else [],
        )


_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def speaker_name(speaker: str) -> str:
    """``speaker`` as an OpenAI message ``name``: ``[A-Za-z0-9_-]``, at most 64 characters."""
    return _NAME_UNSAFE.sub("_", speaker.strip())[:64].strip("_")


def locomo_conversation(data: Any, name: str) -> Conversation:
    """One LoCoMo conversation: ``speaker_a`` as user, ``speaker_b`` as assistant, each named (docs/replay.md), each
    message timed at its session's date (its first message prefixed with the date only when that cannot be read)."""
    conversation = data.get("conversation", data) if isinstance(data, dict) else None
    if not isinstance(conversation, dict) or "speaker_a" not in conversation:
        raise ReplayInputError(f"{name}: a LoCoMo file has speaker_a, speaker_b and session_N lists")
    speaker_a, speaker_b = conversation["speaker_a"], conversation["speaker_b"]
    numbers = sorted(int(match.group(1)) for key in conversation if (match := SESSION_KEY.fullmatch(key)))
    messages, turn_ids, times = [], [], []
    moments = {number: locomo_time(conversation.get(f"session_{number}_date_time", "")) for number in numbers}
    known = all(moment is not None for moment in moments.values())
    for number in numbers:
        when, moment = conversation.get(f"session_{number}_date_time", ""), moments[number]
        for position, turn in enumerate(conversation[f"session_{number}"]):
            text = turn.get("text", "")
            if turn.get("blip_caption"):
                text = f"{text} [shares an image: {turn['blip_caption']}]".strip()
            if position == 0 and when and not known:
                text = f"[{when}] {text}"
            role = "user" if turn.get("speaker") == speaker_a else "assistant"
            messages.append({"role": role, "content": text, "name": speaker_name(str(turn.get("speaker") or ""))})
            turn_ids.append(str(turn.get("dia_id", "")))
            times.append(moment)
    prompt = (
        f"You are {speaker_b}, chatting with your friend {speaker_a} over many sessions. "
        "Answer as yourself, consistent with everything said before."
    )
    # The questions sit beside the sessions, or beside "conversation" in the original layout.
    qa = data.get("qa") or conversation.get("qa") or []
    questions = [
        Question(
            text=str(item["question"]),
            answer=str(item["answer"]),
            category=item["category"],
            evidence=[
                part.strip() for entry in item.get("evidence", []) for part in str(entry).split(";") if part.strip()
            ],
            conversation=name,
        )
        for item in qa
        if isinstance(item, dict)
        and item.get("category") in QUESTION_CATEGORIES
        and "answer" in item
        and "question" in item
    ]
    return Conversation(
        name=name,
        system_prompt=prompt,
        messages=messages,
        turn_ids=turn_ids,
        questions=questions,
        times=[moment for moment in times if moment is not None] if known else [],
    )


class ReplayConversations(ChatConversations):
    """Chat sessions for a replay: the recorded system prompt in planned requests, and the job's compressions kept in
    ``compressions`` instead of sent to sockets."""

    def __init__(self, system_prompt: str) -> None:
        super().__init__(run_sync=sync_to_async)
        self.system_prompt = system_prompt
        self.compressions: list[dict[str, Any]] = []
        # The recorded time of the replay's current model call (None: the recording has none, no dates).
        self.now: datetime | None = None

    async def next_request(self, memory_key: str) -> NextRequest | None:
        planned = await super().next_request(memory_key)
        if planned is None:
            return None
        request = replace(planned.request, system_prompt=self.system_prompt, tools=None, now=self.now)
        return replace(planned, request=request, reserve_share=0.0)

    async def notify(self, memory_key: str, notice: Notice) -> None:
        self.compressions.extend(record.as_dict() for record in notice.compressions)


class ReplayJobs:
    """A request never waits; work it hands over runs before the next model call, so replays are deterministic."""

    def __init__(self) -> None:
        self.due = False

    async def wait(self, memory_key: str, timeout_seconds: float) -> bool:
        return True

    def schedule(self, memory_key: str) -> None:
        self.due = True


def conversation_replay(
    conversation: Conversation, *, config: MemoryConfig, mode: Literal["agent", "quick-answer"]
) -> Iterator[dict[str, Any]]:
    """The replay records of ``conversation`` (:meth:`ReplaySession.records`)."""
    yield from ReplaySession(conversation, config=config, mode=mode).records()


class ReplaySession:
    """One conversation replayed into a fresh session; ``message_ids`` align with ``conversation.messages``."""

    def __init__(
        self,
        conversation: Conversation,
        *,
        config: MemoryConfig,
        mode: Literal["agent", "quick-answer"],
        owner: Owner = REPLAY_OWNER,
    ) -> None:
        self.conversation = conversation
        self.mode: Literal["agent", "quick-answer"] = mode
        session = services.chat_session_create(owner=owner, mode=mode, title=conversation.name[:200])
        self.session_id: int = session.pk
        self.memory_key = memory_key_of(session.pk)
        self.scope_key = session_scope_key(session)
        self.source = ReplayConversations(conversation.system_prompt)
        self.jobs = ReplayJobs()
        self.engine = memory_engine(
            config=config, source=self.source, run_sync=sync_to_async, compression_jobs=self.jobs
        )
        self.message_ids: list[int] = []
        self.calls = 0
        self._session = session
        self._open_turn: int | None = None

    def _jobs_run_if_due(self, *, reply_stored: bool) -> list[dict[str, Any]]:
        """Run the memory job to completion if due; returns the compressions it recorded."""
        if not (self.jobs.due or reply_stored):
            return []
        self.jobs.due = False
        self.source.compressions = []
        async_to_sync(self.engine.run_jobs)(self.memory_key)
        return self.source.compressions

    def records(self) -> Iterator[dict[str, Any]]:
        """Store the conversation, yielding before each assistant message the record of that model call
        (docs/replay.md); an unanswered user turn's lease is released at the next one (F-26)."""
        conversation, session = self.conversation, self._session
        turn_message_id: int | None = None
        recall: TurnRecall | None = None
        reply_stored = False
        for index, message in enumerate(conversation.messages):
            if conversation.times:
                self.source.now = conversation.times[index]
            if message["role"] == "assistant":
                job_events = self._jobs_run_if_due(reply_stored=reply_stored)
                reply_stored = not message.get("tool_calls")
                context = self._build(turn_message_id, recall=recall)
                yield {**self._record(context), "job_events": job_events}
            if message["role"] == "user":
                self._unanswered_turn_end()
                stored, _ = leases.user_message_submit(
                    session=session,
                    client_message_id=f"replay-{index}",
                    text=message.get("content") or "",
                    name=message.get("name", ""),
                    created=self.source.now,
                )
                turn_message_id = self._open_turn = stored.pk
                recall = self.engine.recall(
                    memory_key=self.memory_key,
                    scope_key=self.scope_key,
                    question=stored.content or "",
                    now=self.source.now,
                )
                self.message_ids.append(stored.pk)
            else:
                reply = services.reply_message_store(
                    session_id=self.session_id,
                    reply_to_id=turn_message_id,
                    role=message["role"],
                    content=message.get("content"),
                    tool_calls=message.get("tool_calls"),
                    tool_call_id=message.get("tool_call_id", ""),
                    name=message.get("name", ""),
                )
                self.message_ids.append(reply.pk)
                self._timed(reply.pk)
                if message["role"] == "assistant" and not message.get("tool_calls"):
                    self._open_turn = None  # the final reply deleted the lease

    def questions(self, questions: list[Question]) -> Iterator[dict[str, Any]]:
        """Records of each question asked as the next user turn, never stored, plus its ``question`` object
        (docs/replay.md, "Questions"); the memory job runs once before the first only."""
        turn_ids = dict(zip(self.conversation.turn_ids, self.message_ids, strict=False))
        self._unanswered_turn_end()
        job_events = self._jobs_run_if_due(reply_stored=True)
        for question in questions:
            recall = self.engine.recall(
                memory_key=self.memory_key, scope_key=self.scope_key, question=question.text, now=self.source.now
            )
            context = self._build(NO_TURN_YET, recall=recall, question=question.text)
            record = self._record(context)
            record["sources"] = _unstored(record["sources"])
            own = question.conversation == self.conversation.name
            yield {
                **record,
                "job_events": job_events,
                "question": {
                    "text": question.text,
                    "answer": question.answer,
                    "category": question.category,
                    "evidence": question.evidence,
                    "evidence_message_ids": [turn_ids[e] for e in question.evidence if own and e in turn_ids],
                    "conversation": question.conversation,
                },
            }
            job_events = []

    def _timed(self, message_id: int) -> None:
        """Give the stored message its recorded time (when the recording has times)."""
        if self.source.now is not None:
            Message.objects.filter(pk=message_id).update(created=self.source.now)

    def _unanswered_turn_end(self) -> None:
        if self._open_turn is not None:
            TurnLease.objects.filter(user_message_id=self._open_turn).delete()
            self._open_turn = None

    def _build(
        self, turn_message_id: int | None, *, recall: TurnRecall | None, question: str | None = None
    ) -> MemoryContext:
        """The context of the next model call, exactly as a live turn builds it."""
        # Before the first user message the whole session is the increment.
        last_id = turn_message_id if turn_message_id is not None else NO_TURN_YET
        session_id = self.session_id

        async def load_increment(boundary: int | None) -> list[dict[str, Any]]:
            rows: list[dict[str, Any]] = await sync_to_async(selectors.message_list_for_context)(
                session_id=session_id, boundary=boundary, turn_message_id=last_id
            )
            if question is not None:  # the question is the current turn; the engine counts its tokens
                rows.append({"id": QUESTION_ID, "role": "user", "content": question, "token_count": None})
            return rows

        request = ContextRequest(
            memory_key=self.memory_key,
            system_prompt=self.conversation.system_prompt,
            load_increment=load_increment,
            load_recall=recall,
            mode=self.mode,
            now=self.source.now,
            scope_key=self.scope_key,
        )

        async def build() -> MemoryContext:
            if recall is not None:
                recall.prefetch()  # as a live turn does when it opens
            if self.mode == "agent":
                return await self.engine.before_model(request)
            return await self.engine.context(request)

        context: MemoryContext = async_to_sync(build)()
        return context

    def _record(self, context: MemoryContext) -> dict[str, Any]:
        report = context.as_dict()
        copied = ("context_window", "trigger_tokens", "target_tokens", "messages", "sources", "tokens")
        record = {
            "conversation": self.conversation.name,
            "call": self.calls,
            **{key: report[key] for key in copied},
            "summary": {
                "type": context.summary.summary_type,
                "last_message_id": context.summary.last_message_id,
                "compressed_count": context.summary.compressed_count,
            },
            "stored_message_ids": list(
                Message.objects.filter(session_id=self.session_id).order_by("id").values_list("id", flat=True)
            ),
            **{key: report[key] for key in ("events", "overflow", "path", "facts", "recall")},
        }
        self.calls += 1
        return record


def _unstored(sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``sources`` with :data:`QUESTION_ID` as null, merged sources included."""
    fixed = []
    for source in sources:
        source = {**source, "id": None} if source.get("id") == QUESTION_ID else dict(source)
        if "merged" in source:
            source["merged"] = _unstored(source["merged"])
        fixed.append(source)
    return fixed


def replay_config(context_window: int | None) -> MemoryConfig:
    """The live memory settings, optionally another window (tokens); no calibration (no model is called), and every
    extraction batch and the recall embedding awaited, so records do not depend on load."""
    endpoint = chat_endpoint()
    if context_window is not None:
        endpoint = replace(endpoint, context_window=context_window)
    return replace(memory_config(endpoint), calibrate=False, facts_max_batches=None, recall_deadline_seconds=None)
