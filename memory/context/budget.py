"""The token budget of one model request (docs/memory.md §1 and §3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from memory.tokens.calibration import MAX_FACTOR, MIN_FACTOR

SummaryRole = Literal["system", "user"]
# The summary block's header and message overhead take about 25 tokens; leave room for text too.
MIN_SUMMARY_RESERVE = 64
# Default room left for the model's reply (tokens): an eighth of the window, at most this much.
MAX_DEFAULT_REPLY_RESERVE = 4096
Mode = Literal["agent", "quick-answer"]


@dataclass(frozen=True, kw_only=True)
class MemoryBudget:
    """Token budget of one model request; every figure is in tokens.

    ``context_window``: the model's maximum input. Compression starts when the estimated request
    exceeds ``trigger_tokens = context_window * trigger_ratio`` (default 0.5) and aims at
    ``target_tokens = trigger_tokens * target_ratio`` (default 0.6), docs/memory.md §1.
    ``summary_max_tokens``: the hard cap on the summary; the back-scan keeps
    ``summary_reserve_tokens`` free for the summary block (the cap, limited to a quarter of the
    target so a small window still retains recent messages, and at least 64, enough for the
    block's header). ``summary_ratio``: the summary may grow by at most this share of the text it
    folds in (default 0.3, docs/memory.md §3 step 4). ``preserve_turns`` (agent mode, default 5):
    whole recent turns the engine tries to keep verbatim; the budget always wins.
    ``summarizer_context_window``: bounds one summarizer request (input plus output).
    ``summary_role="user"`` is for providers that accept one leading system message only: the
    summary block and any later system message of the history are then sent as user messages.
    ``strict_alternation``: for chat templates that reject two user or two assistant messages in
    a row, neighbours of the same role are merged in the model-facing copy (docs/memory.md F-38).
    ``reply_reserve_tokens``: room kept free for the model's reply; when the current turn alone is
    over the target, its content is elided (or its older steps folded) only down to
    ``request_limit_tokens = context_window - reply_reserve_tokens`` (docs/memory.md I5). None
    means an eighth of the window, at most 4,096.
    ``facts_max_tokens`` / ``facts_share`` / ``facts_min_tokens``: the key-facts block may take
    ``facts_share`` of the target (default 8 %), at most ``facts_max_tokens`` (default 400) and
    at least ``facts_min_tokens`` (default 96, at most a quarter of the target) tokens
    (docs/memory.md §11); a share or maximum of 0 turns the block off. ``recall_share``: the recall block may take this share of the target
    (default 25 %, docs/memory.md §12), reserved only when something was recalled; 0 turns
    recall off. ``recall_fill``: a request under the trigger lets the recall block grow past its
    share into the room left under the trigger, for admitted items that did not fit (default
    True; docs/memory.md §12, "Budget").
    ``token_factor``: provider tokens per token of our estimate for this model (default 1.0,
    within [0.5, 2.0]; docs/memory.md §5, "Calibration"). The budget treats a request estimated at
    ``E`` tokens as ``E × token_factor``; equivalently the window, trigger, target and request
    limit are expressed in estimated tokens by dividing by it (:attr:`window_tokens`). Every
    other figure here is in estimated tokens, except ``context_window`` and the reply reserve.
    Raises ``ValueError`` for a window under 64 tokens, ratios outside (0, 1], an unknown role,
    a reply reserve that is negative or leaves no room under the window, or a ``token_factor``
    outside its bounds.
    """

    context_window: int
    trigger_ratio: float = 0.5
    target_ratio: float = 0.6
    summary_max_tokens: int = 2000
    summary_role: SummaryRole = "system"
    preserve_turns: int = 5
    summarizer_context_window: int | None = None
    summary_ratio: float = 0.3
    strict_alternation: bool = False
    reply_reserve_tokens: int | None = None
    facts_max_tokens: int = 400
    facts_share: float = 0.08
    facts_min_tokens: int = 96
    recall_share: float = 0.25
    recall_fill: bool = True
    token_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.context_window < 64:
            raise ValueError(f"context_window must be at least 64 tokens, got {self.context_window}")
        if not all(0 < ratio <= 1 for ratio in (self.trigger_ratio, self.target_ratio, self.summary_ratio)):
            raise ValueError("trigger_ratio, target_ratio and summary_ratio must be in (0, 1]")
        if self.summary_role not in ("system", "user"):
            raise ValueError(f"summary_role must be 'system' or 'user', got {self.summary_role!r}")
        if self.reply_reserve_tokens is not None and not 0 <= self.reply_reserve_tokens < self.context_window:
            raise ValueError(f"reply_reserve_tokens must be in [0, context_window), got {self.reply_reserve_tokens}")
        if self.facts_max_tokens < 0 or not 0 <= self.facts_share <= 1 or not 0 <= self.recall_share <= 1:
            raise ValueError("facts_max_tokens must be >= 0, facts_share and recall_share in [0, 1]")
        if not MIN_FACTOR <= self.token_factor <= MAX_FACTOR:
            raise ValueError(f"token_factor must be in [{MIN_FACTOR}, {MAX_FACTOR}], got {self.token_factor}")

    @property
    def window_tokens(self) -> int:
        """The context window in tokens of our estimate: ``context_window / token_factor``
        (docs/memory.md §5, "Calibration"); ``context_window`` itself at factor 1.0."""
        return int(self.context_window / self.token_factor)

    @property
    def trigger_tokens(self) -> int:
        return int(self.window_tokens * self.trigger_ratio)

    @property
    def target_tokens(self) -> int:
        return int(self.trigger_tokens * self.target_ratio)

    @property
    def summary_reserve_tokens(self) -> int:
        return max(MIN_SUMMARY_RESERVE, min(self.summary_max_tokens, self.target_tokens // 4))

    @property
    def facts_budget_tokens(self) -> int:
        """The key-facts block's budget in tokens (docs/memory.md §11):
        ``min(facts_share * target, facts_max_tokens)``, raised to ``facts_min_tokens`` (at most a
        quarter of the target) so that a small window still pins a few facts; 0 when
        ``facts_share`` or ``facts_max_tokens`` is 0 (the block is off)."""
        if not self.facts_share or not self.facts_max_tokens:
            return 0
        share = min(int(self.target_tokens * self.facts_share), self.facts_max_tokens)
        return max(0, share, min(self.facts_min_tokens, self.target_tokens // 4))

    @property
    def facts_pinned_tokens(self) -> int:
        """What the facts the user pinned may take of the key-facts block when that is more than
        :attr:`facts_budget_tokens`: a quarter of the target, in tokens (docs/memory.md §11)."""
        return self.target_tokens // 4 if self.facts_budget_tokens else 0

    @property
    def recall_budget_tokens(self) -> int:
        """The recall block's budget in tokens: ``recall_share`` of the target (docs/memory.md §12)."""
        return max(0, int(self.target_tokens * self.recall_share))

    @property
    def summarizer_window(self) -> int:
        return self.summarizer_context_window or self.context_window

    @property
    def reply_reserve(self) -> int:
        """Tokens kept free for the reply (see ``reply_reserve_tokens``)."""
        if self.reply_reserve_tokens is not None:
            return self.reply_reserve_tokens
        return min(MAX_DEFAULT_REPLY_RESERVE, self.context_window // 8)

    @property
    def request_limit_tokens(self) -> int:
        """The most a request whose current turn alone is over the target may take (estimated
        tokens): the window minus the reply reserve, divided by ``token_factor``. Elision and
        in-turn folding aim here, not at the target (docs/memory.md I5)."""
        return int((self.context_window - self.reply_reserve) / self.token_factor)
