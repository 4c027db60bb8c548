"""What other apps may use of the memory engine: everything here, nothing else.

The chat app imports only this module (checked by import-linter, see pyproject.toml). Names are
grouped by role; each is documented where it is defined.
"""

from __future__ import annotations

from memory.budget import MemoryBudget, Mode, SummaryRole
from memory.core import RAW_ARCHIVE_MARKER, Message, to_wire
from memory.engine import (
    AgentMemoryMiddleware,
    Compression,
    CompressionJobs,
    ContextRequest,
    IncrementLoader,
    MemoryContext,
    MemoryEngine,
)
from memory.extractive import ExtractiveSummarizer, extractive_summary
from memory.jobs import JobRun, JobState, MemoryJobRunner
from memory.models import CompressionEvent
from memory.prompts import split_summary_prompt
from memory.services import (
    OrmJobStore,
    OrmSummaryStore,
    compression_event_list,
    memory_job_state_get,
    session_memory_delete,
    session_summary_get,
    summarizer_health_get,
)
from memory.store import CompressionRecord, InMemorySummaryStore, Summary, SummaryStore
from memory.summarizer import Summarizer, SummarizerChain, SummaryReply, SummaryRequest
from memory.tokens import TokenCounter, get_counter

__all__ = [
    "RAW_ARCHIVE_MARKER",
    "AgentMemoryMiddleware",
    "Compression",
    "CompressionEvent",
    "CompressionJobs",
    "CompressionRecord",
    "ContextRequest",
    "ExtractiveSummarizer",
    "InMemorySummaryStore",
    "IncrementLoader",
    "JobRun",
    "JobState",
    "MemoryBudget",
    "MemoryContext",
    "MemoryEngine",
    "MemoryJobRunner",
    "Message",
    "Mode",
    "OrmJobStore",
    "OrmSummaryStore",
    "Summarizer",
    "SummarizerChain",
    "Summary",
    "SummaryReply",
    "SummaryRequest",
    "SummaryRole",
    "SummaryStore",
    "TokenCounter",
    "compression_event_list",
    "extractive_summary",
    "get_counter",
    "memory_job_state_get",
    "session_memory_delete",
    "session_summary_get",
    "split_summary_prompt",
    "summarizer_health_get",
    "to_wire",
]
