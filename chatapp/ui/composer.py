"""The composer's token count (docs/memory.md §5): the typed message against the room for one message, the window
minus what every request carries (system prompt with passages or tools, key facts, summary or its reserve, recall
budget). The retained window is not subtracted (compression makes room), so over the room is only a warning."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from chatapp.chats.memory import memory_engine, memory_key_of, next_request_of_mode
from chatapp.llm.clients import chat_endpoint
from chatapp.models import ChatSession, Message, ModelCall

STATE_EMPTY = "empty"
STATE_OK = "ok"
STATE_OVER_WINDOW = "over_window"
STATE_OVER_CHARS = "over_chars"


@dataclass(frozen=True, kw_only=True)
class ComposerCount:
    """``tokens`` of the text as a user message (None over ``max_chars``, which the socket refuses) against
    ``room``, the most one message may take now (tokens, at least 0); ``chars`` in characters."""

    session_id: int
    tokens: int | None
    room: int
    chars: int
    max_chars: int
    context_window: int

    @property
    def state(self) -> str:
        """``empty``, ``ok``, ``over_window`` (would probably overflow) or ``over_chars`` (the socket refuses it)."""
        if self.chars > self.max_chars:
            return STATE_OVER_CHARS
        if not self.chars:
            return STATE_EMPTY
        if self.tokens is not None and self.tokens > self.room:
            return STATE_OVER_WINDOW
        return STATE_OK

    @property
    def percent(self) -> float:
        """``tokens`` as a share of ``room``, 0 to 100 (for the small bar)."""
        if not self.tokens or self.room <= 0:
            return 100.0 if self.tokens else 0.0
        return min(100.0, round(100.0 * self.tokens / self.room, 1))


def composer_count_get(*, session: ChatSession, text: str) -> ComposerCount:
    """Three queries, plus the calibration when it applies; never raises for any text (callers authorize)."""
    endpoint = chat_endpoint()
    engine = memory_engine()
    engine.use_token_factor(engine.token_factor())
    budget, counter = engine.budget, engine.counter
    system_prompt, tools, reserve_share = next_request_of_mode(session.mode)
    passages = int(budget.target_tokens * reserve_share)
    fixed = counter.count_request([{"role": "system", "content": system_prompt}], tools) + passages
    stored = engine.summary_block_tokens(engine.summary(memory_key_of(session.pk)))
    has_history = Message.objects.filter(session_id=session.pk).exists()
    summary_tokens = max(stored, budget.summary_reserve_tokens if has_history else 0)
    # Only the figure, not the whole snapshot (which holds every message the call sent).
    last_facts = (
        ModelCall.objects.filter(session_id=session.pk)
        .order_by("-id")
        .values_list("context__facts__tokens", flat=True)
        .first()
    )
    facts_tokens = int(last_facts or 0)
    room = budget.window_tokens - fixed - summary_tokens - facts_tokens - budget.recall_budget_tokens
    max_chars = settings.CHAT_MAX_MESSAGE_CHARS
    tokens = counter.count_message({"role": "user", "content": text}) if text and len(text) <= max_chars else None
    return ComposerCount(
        session_id=session.pk,
        tokens=tokens,
        room=max(0, room),
        chars=len(text),
        max_chars=max_chars,
        context_window=endpoint.context_window,
    )
