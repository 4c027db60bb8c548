"""Budget settings of the memory engine (SPEC.md sections 1 and 3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SummaryRole = Literal["system", "user"]
# The summary block's header and message overhead take about 25 tokens; leave room for text too.
MIN_SUMMARY_RESERVE = 64
Mode = Literal["agent", "quick-answer"]


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """Token budget of one model request.

    ``context_window`` is the model's maximum input in tokens. Compression starts when the
    estimated request exceeds ``trigger_tokens = context_window * trigger_ratio`` (SPEC default
    0.5) and aims at ``target_tokens = trigger_tokens * target_ratio`` (SPEC default 0.6).
    ``summary_max_tokens`` is the hard cap on the summary block; the reserve the back-scan keeps
    free for it is ``summary_reserve_tokens`` (the cap, limited to a quarter of the target so a
    small window still retains recent messages; at least 64 tokens, enough for the block's header). ``preserve_turns`` (agent mode, SPEC default 5)
    is the number of whole recent turns the engine tries to keep verbatim; the budget always wins.
    ``summarizer_context_window`` bounds one summarizer request (input plus output, tokens).
    ``summary_role="user"`` is for providers that accept one leading system message only: the
    summary block and any later system message of the history are then sent as user messages.
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
        if not 0 < self.trigger_ratio <= 1 or not 0 < self.target_ratio <= 1:
            raise ValueError("trigger_ratio and target_ratio must be in (0, 1]")
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
