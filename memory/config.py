"""Every setting of the memory engine in one frozen value (docs/configuration.md lists them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from memory.context.budget import MemoryBudget, SummaryRole
from memory.context.request import Compression
from memory.facts.scope import FactsScope

RecallScope = Literal["chat", "owner"]


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """The engine's settings, built once per use by the owning app; figures in tokens and seconds. ``calibrate``: learn
    the estimate's factor (docs/memory.md §5); the budget (§3, §11, §12); the summarizer and its failover (§4); when
    compression runs (§10); key facts (§11: ``facts_scope`` ``owner`` shares personal facts across the owner's chats);
    recall (§12), ``recall_deadline_seconds`` None waiting for the embedding, as replays do, ``recall_cache_mb`` the
    process's cache of owners' vectors, in MiB."""

    chat_model: str
    context_window: int
    calibrate: bool = False
    trigger_ratio: float = 0.5
    target_ratio: float = 0.6
    summary_max_tokens: int = 2000
    summary_role: SummaryRole = "system"
    preserve_turns: int = 5
    strict_alternation: bool = False
    facts_share: float = 0.08
    facts_max_tokens: int = 400
    facts_min_tokens: int = 96
    recall_share: float = 0.25
    recall_fill: bool = True
    summary_model: str = ""
    summary_context_window: int = 0
    failover_context_window: int | None = None
    summary_attempts: int = 3
    summary_timeout_seconds: float = 60.0
    compression: Compression = "background"
    sync_wait_seconds: float = 0.25
    precompress_tokens: int = 200
    job_debounce_seconds: float = 0.2
    job_lease_seconds: float = 30.0
    job_idle_seconds: float = 15.0
    job_batch_turns: int = 4
    facts_extraction: bool = True
    facts_max_batches: int | None = 3
    facts_scope: FactsScope = "owner"
    recall_scope: RecallScope = "owner"
    recall_deadline_seconds: float | None = 0.15
    recall_cache_mb: int = 256
    unindexed_tools: frozenset[str] = field(default_factory=frozenset)
    # How a tool result that found nothing begins (memory.messages.found_nothing).
    empty_results: tuple[str, ...] = ()

    def budget(self, token_factor: float = 1.0) -> MemoryBudget:
        """The request budget of the chat model, with the estimate calibration ``token_factor``."""
        return MemoryBudget(
            context_window=self.context_window,
            trigger_ratio=self.trigger_ratio,
            target_ratio=self.target_ratio,
            summary_max_tokens=self.summary_max_tokens,
            summary_role=self.summary_role,
            preserve_turns=self.preserve_turns,
            summarizer_context_window=self.summary_context_window or self.context_window,
            strict_alternation=self.strict_alternation,
            facts_share=self.facts_share,
            facts_max_tokens=self.facts_max_tokens,
            facts_min_tokens=self.facts_min_tokens,
            recall_share=self.recall_share,
            recall_fill=self.recall_fill,
            token_factor=token_factor,
        )

    @property
    def summarizer_windows(self) -> list[int]:
        """The context windows of the summarizer and, when configured, its failover (tokens)."""
        primary = self.summary_context_window or self.context_window
        return [primary] if self.failover_context_window is None else [primary, self.failover_context_window]
