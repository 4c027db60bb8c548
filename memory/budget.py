"""The token budget of one model request (docs/memory.md §1 and §3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SummaryRole = Literal["system", "user"]
# The summary block's header and message overhead take about 25 tokens; leave room for text too.
MIN_SUMMARY_RESERVE = 64
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
    Raises ``ValueError`` for a window under 64 tokens, ratios outside (0, 1] or an unknown role.
    """

    context_window: int
    trigger_ratio: float = 0.5
    target_ratio: float = 0.6
    summary_max_tokens: int = 2000
    summary_role: SummaryRole = "system"
    preserve_turns: int = 5
    summarizer_context_window: int | None = None
    summary_ratio: float = 0.3

    def __post_init__(self) -> None:
        if self.context_window < 64:
            raise ValueError(f"context_window must be at least 64 tokens, got {self.context_window}")
        if not all(0 < ratio <= 1 for ratio in (self.trigger_ratio, self.target_ratio, self.summary_ratio)):
            raise ValueError("trigger_ratio, target_ratio and summary_ratio must be in (0, 1]")
        if self.summary_role not in ("system", "user"):
            raise ValueError(f"summary_role must be 'system' or 'user', got {self.summary_role!r}")

    @property
    def trigger_tokens(self) -> int:
        return int(self.context_window * self.trigger_ratio)

    @property
    def target_tokens(self) -> int:
        return int(self.trigger_tokens * self.target_ratio)

    @property
    def summary_reserve_tokens(self) -> int:
        return max(MIN_SUMMARY_RESERVE, min(self.summary_max_tokens, self.target_tokens // 4))

    @property
    def summarizer_window(self) -> int:
        return self.summarizer_context_window or self.context_window
