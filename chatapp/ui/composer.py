"""The composer's token count: how many tokens the message being typed takes, against the room
the chat's context window leaves for one message, counted by the server with the chat model's
own tokenizer (docs/memory.md §5) before anything is sent.

The room is what the window keeps free for a new question once memory has done all it can: the
context window (in estimated tokens, after the estimate calibration, docs/memory.md §5) minus
what every request of this chat carries whatever happens -- the system prompt (in quick-answer
mode with the share kept for the knowledge-base passages), the tool schemas (agent mode), the
reply priming, the key-facts block as the last request had it, the summary block (the stored
one, or the summary reserve when the history may still be folded into it) and the recall
block's budget. The retained window is not counted: compression folds it into the summary to
make room. A user message is never shortened (docs/memory.md I5), so a request over the window
is not sent (the turn ends with a context-overflow error): that is the limit shown. The room is
an estimate on the safe side (recall may take less than its budget), so a message over it is a
warning and may still be sent. The character limit (``CHAT_MAX_MESSAGE_CHARS``) is the socket's
own check (error ``too_long``): the page disables Send while the text is over it. The composer
shows whichever limit the message breaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from chatapp.chats.memory import memory_engine, memory_key_of, next_request_of_mode
from chatapp.llm.clients import chat_endpoint
from chatapp.models import ChatSession, Message, ModelCall

# What the composer says about the message: nothing typed, fits, or too large to be sent.
STATE_EMPTY = "empty"
STATE_OK = "ok"
STATE_OVER_WINDOW = "over_window"
STATE_OVER_CHARS = "over_chars"


@dataclass(frozen=True, kw_only=True)
class ComposerCount:
    """The composer's count for one text in one chat.

    ``tokens``: the text as a user message costs in a request (content and per-message
    overhead), counted with the chat model's tokenizer; None when the text is over
    ``max_chars`` (it is not counted: the socket refuses it anyway). ``room``: the most tokens
    one message may take in this chat now (see the module docstring), at least 0.
    ``chars``/``max_chars``: the text's length and the socket's limit, in characters.
    ``context_window``: the chat model's window in tokens, for the explanation.
    """

    session_id: int
    tokens: int | None
    room: int
    chars: int
    max_chars: int
    context_window: int

    @property
    def state(self) -> str:
        """``empty``, ``ok``, ``over_window`` (more tokens than the room: the request would
        probably overflow the window and be refused) or ``over_chars`` (more characters than the
        socket accepts: it is refused)."""
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
    """The composer's count of ``text`` in ``session`` (no access check: callers authorize).
    Reads the stored summary, whether the chat has messages and its newest model call (three
    queries, plus the stored calibration when it applies); never raises for any text."""
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
