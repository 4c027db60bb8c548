"""The token budget of one model request (docs/memory.md §1 and §3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from memory.tokens.calibration import MAX_FACTOR, MIN_FACTOR

SummaryRole = Literal["system", "user"]
# The summary block's header and overhead take about 25 tokens; leave room for text too.
MIN_SUMMARY_RESERVE = 64
# Default room for the reply: an eighth of the window, at most this many tokens.
MAX_DEFAULT_REPLY_RESERVE = 4096
Mode = Literal["agent", "quick-answer"]


@dataclass(frozen=True, kw_only=True)
class MemoryBudget:
    """Token budget of one model request (docs/memory.md §1, §3), in estimated tokens except ``context_window`` and
    the reply reserve (§5 "Calibration"); key facts §11, recall §12, reply reserve I5, ``summary_role`` F-10,
    alternation F-38. Raises ``ValueError`` for a window under 64 tokens, a ratio outside (0, 1], an unknown role, a
    reply reserve outside [0, window) or a ``token_factor`` out of bounds."""

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
        """``context_window / token_factor``: the window in tokens of our estimate (§5 "Calibration")."""
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
        """``facts_share`` of the target, at most ``facts_max_tokens``, at least the floor (§11); 0: off."""
        if not self.facts_share or not self.facts_max_tokens:
            return 0
        share = min(int(self.target_tokens * self.facts_share), self.facts_max_tokens)
        return max(0, share, min(self.facts_min_tokens, self.target_tokens // 4))

    @property
    def facts_pinned_tokens(self) -> int:
        """What the user's pinned facts may take when over the facts budget: a quarter of the target."""
        return self.target_tokens // 4 if self.facts_budget_tokens else 0

    @property
    def recall_budget_tokens(self) -> int:
        return max(0, int(self.target_tokens * self.recall_share))

    @property
    def summarizer_window(self) -> int:
        return self.summarizer_context_window or self.context_window

    @property
    def reply_reserve(self) -> int:
        if self.reply_reserve_tokens is not None:
            return self.reply_reserve_tokens
        return min(MAX_DEFAULT_REPLY_RESERVE, self.context_window // 8)

    @property
    def request_limit_tokens(self) -> int:
        """What a turn over the target may take: window minus reply reserve, in estimated tokens (I5)."""
        return int((self.context_window - self.reply_reserve) / self.token_factor)
