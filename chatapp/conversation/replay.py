"""Replays of recorded conversations through the live memory path (``manage.py replay``).

Each conversation becomes a fresh chat session. Recorded user messages are stored as user turns,
recorded assistant and tool messages as recorded (never generated). Before each recorded
assistant message (each model call) the memory engine runs as in the live app, and one record of
what the model would have been sent is produced.

With ``MEMORY_COMPRESSION=background`` (the default) the session's memory job runs to completion
after each stored final reply, and after any model call whose request handed it work, before the
next model call: the replay is deterministic and shows the memory the live app has once its jobs
ran (docs/memory.md §10). With ``sync`` the requests compress themselves, as before.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings

from chatapp.chats import selectors, services
from chatapp.chats.access import Owner
from chatapp.conversation import leases
from chatapp.conversation.memory_jobs import NextRequest, PreCompression
from chatapp.conversation.turn import memory_engine_build
from chatapp.llm.clients import chat_endpoint
from chatapp.models import ChatSession, Message
from memory.api import (
    AgentMemoryMiddleware,
    Compression,
    ContextRequest,
    MemoryContext,
    MemoryEngine,
    MemoryJobRunner,
    Mode,
    OrmJobStore,
)

Format = Literal["tau-bench", "locomo"]
REPLAY_OWNER = Owner(user_id=None, session_key="replay")
WIRE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
NO_TURN_YET = 2**62
SESSION_KEY = re.compile(r"session_(\d+)")


class ReplayInputError(Exception):
    """The input file is missing or is not in the announced format."""


@dataclass(frozen=True, kw_only=True)
class Conversation:
    """A recorded conversation: its name, system prompt and messages (OpenAI wire dicts)."""

    name: str
    system_prompt: str
    messages: list[dict[str, Any]]


def conversations_read(path: Path, fmt: Format) -> Iterator[Conversation]:
    """The conversations of ``path`` (a tau-bench ``trajectories.json``, or a LoCoMo
    ``conv-*.json`` file or a folder of them). Raises :class:`ReplayInputError`."""
    if fmt == "tau-bench":
        yield from _tau_bench(_load(path))
        return
    files = sorted(path.glob("conv-*.json")) if path.is_dir() else [path]
    if not files:
        raise ReplayInputError(f"no conv-*.json files in {path}")
    for file in files:
        yield locomo_conversation(_load(file), file.stem)


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
        yield Conversation(
            name=f"tau-bench-{index}-task{item.get('task_id')}-trial{item.get('trial')}",
            system_prompt=system_prompt,
            messages=messages,
        )


def locomo_conversation(data: Any, name: str) -> Conversation:
    """One LoCoMo conversation: ``speaker_a`` as user, ``speaker_b`` as assistant, an image turn
    as text with its caption, each session's first message prefixed with its date."""
    conversation = data.get("conversation", data) if isinstance(data, dict) else None
    if not isinstance(conversation, dict) or "speaker_a" not in conversation:
        raise ReplayInputError(f"{name}: a LoCoMo file has speaker_a, speaker_b and session_N lists")
    speaker_a, speaker_b = conversation["speaker_a"], conversation["speaker_b"]
    numbers = sorted(int(match.group(1)) for key in conversation if (match := SESSION_KEY.fullmatch(key)))
    messages = []
    for number in numbers:
        when = conversation.get(f"session_{number}_date_time", "")
        for position, turn in enumerate(conversation[f"session_{number}"]):
            text = turn.get("text", "")
            if turn.get("blip_caption"):
                text = f"{text} [shares an image: {turn['blip_caption']}]".strip()
            if position == 0 and when:
                text = f"[{when}] {text}"
            role = "user" if turn.get("speaker") == speaker_a else "assistant"
            messages.append({"role": role, "content": text})
    prompt = (
        f"You are {speaker_b}, chatting with your friend {speaker_a} over many sessions. "
        "Answer as yourself, consistent with everything said before."
    )
    return Conversation(name=name, system_prompt=prompt, messages=messages)


class ReplayJobs:
    """The memory jobs of a replay (:class:`memory.api.CompressionJobs`): a request never waits,
    and the work it hands over (``schedule``) is done by :meth:`run_if_due` before the next model
    call, so the replay is deterministic. ``runner`` runs the session's job, whose pipeline is
    ``step``."""

    def __init__(self, runner: MemoryJobRunner, step: PreCompression) -> None:
        self.runner = runner
        self.step = step
        self.due = False

    async def wait(self, memory_key: str, timeout_seconds: float) -> bool:
        return True

    def schedule(self, memory_key: str) -> None:
        self.due = True

    def run_if_due(self, memory_key: str, *, reply_stored: bool) -> list[dict[str, Any]]:
        """Run the job to completion when a final reply was stored since the last model call or
        a request asked for it; returns the compression events it recorded."""
        if not (self.due or reply_stored):
            return []
        self.due = False
        self.step.last_events = []
        async_to_sync(self.runner.run_now)(memory_key)
        return self.step.last_events


def conversation_replay(
    conversation: Conversation, *, engine: MemoryEngine, mode: Literal["agent", "quick-answer"]
) -> Iterator[dict[str, Any]]:
    """Store ``conversation`` message by message in a fresh session; before each assistant
    message yield the replay record of that model call (see the README's replay contract).
    In background mode the session's memory job runs between model calls (see the module
    docstring)."""
    session = services.chat_session_create(owner=REPLAY_OWNER, mode=mode, title=conversation.name[:200])
    memory_key = ChatSession.memory_key_for(session.pk)
    compression: Compression = "background" if settings.MEMORY_COMPRESSION == "background" else "sync"
    jobs: ReplayJobs | None = None
    if compression == "background":
        engine = copy.copy(engine)

        def recorded_prompt(_mode: str, _engine: MemoryEngine) -> NextRequest:
            return conversation.system_prompt, None, 0

        step = PreCompression(engine_build=lambda: engine, next_request=recorded_prompt, orm=sync_to_async)
        runner = MemoryJobRunner(store=OrmJobStore(), steps=[step], owner="replay", debounce_seconds=0)
        jobs = ReplayJobs(runner, step)
        engine.jobs = jobs
    turn_message_id: int | None = None
    reply_stored = False
    call = 0
    for index, message in enumerate(conversation.messages):
        if message["role"] == "assistant":
            job_events = jobs.run_if_due(memory_key, reply_stored=reply_stored) if jobs is not None else []
            reply_stored = not message.get("tool_calls")
            context = _build(engine, session.pk, conversation.system_prompt, turn_message_id, mode, compression)
            yield {**_record(conversation.name, call, engine, context, session.pk), "job_events": job_events}
            call += 1
        if message["role"] == "user":
            stored, _ = leases.user_message_submit(
                session=session, client_message_id=f"replay-{index}", text=message.get("content") or ""
            )
            turn_message_id = stored.pk
        else:
            services.reply_message_store(
                session_id=session.pk,
                reply_to_id=turn_message_id,
                role=message["role"],
                content=message.get("content"),
                tool_calls=message.get("tool_calls"),
                tool_call_id=message.get("tool_call_id", ""),
                name=message.get("name", ""),
            )


def _build(
    engine: MemoryEngine,
    session_id: int,
    system_prompt: str,
    turn_message_id: int | None,
    mode: Mode,
    compression: Compression,
) -> MemoryContext:
    # Before the first user message (a LoCoMo conversation may open with speaker_b) every stored
    # message belongs to no turn: the whole session is the increment.
    last_id = turn_message_id if turn_message_id is not None else NO_TURN_YET

    async def load_increment(boundary: int | None) -> list[dict[str, Any]]:
        return await sync_to_async(selectors.message_list_for_context)(
            session_id=session_id, boundary=boundary, turn_message_id=last_id
        )

    request = ContextRequest(
        memory_key=ChatSession.memory_key_for(session_id),
        system_prompt=system_prompt,
        load_increment=load_increment,
        mode=mode,
        compression=compression,
    )
    if mode == "agent":
        return async_to_sync(AgentMemoryMiddleware(engine).before_model)(request)
    return async_to_sync(engine.build_context)(request)


def _record(name: str, call: int, engine: MemoryEngine, context: MemoryContext, session_id: int) -> dict[str, Any]:
    return {
        "conversation": name,
        "call": call,
        "context_window": context.context_window,
        "trigger_tokens": context.trigger_tokens,
        "target_tokens": context.target_tokens,
        "messages": context.messages,
        "sources": context.sources,
        "tokens": context.tokens,
        "summary": {
            "type": context.summary.summary_type,
            "last_message_id": context.summary.last_message_id,
            "compressed_count": context.summary.compressed_count,
        },
        "stored_message_ids": list(
            Message.objects.filter(session_id=session_id).order_by("id").values_list("id", flat=True)
        ),
        "events": context.events,
        "overflow": context.overflow,
        "path": context.path,
    }


def replay_engine(context_window: int | None) -> MemoryEngine:
    """The live app's memory engine, optionally at another context window (tokens)."""
    endpoint = chat_endpoint()
    if context_window is not None:
        endpoint = replace(endpoint, context_window=context_window)
    return memory_engine_build(endpoint)
