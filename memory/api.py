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
    FactsLoader,
    IncrementLoader,
    MemoryContext,
    MemoryEngine,
    RecallLoader,
)
from memory.extractive import ExtractiveSummarizer, extractive_summary
from memory.facts import (
    EXTRACTION_MARKER,
    EXTRACTION_SCHEMA,
    EXTRACTION_SCHEMA_NAME,
    FACT_KINDS,
    ExtractionError,
    ExtractionInput,
    FactCandidate,
    FactsBlock,
    KeyFact,
    Validation,
    extraction_prompt,
    message_rule_facts,
    parse_extraction,
    rule_facts,
    tool_call_facts,
    validate_extraction,
)
from memory.fulltext import SEARCH_STOPWORDS
from memory.index import IndexPiece, message_pieces
from memory.jobs import JobRun, JobState, JobStep, MemoryJobRunner
from memory.models import CompressionEvent
from memory.prompts import split_summary_prompt
from memory.recall import (
    Embedder,
    RecallCandidate,
    RecallInput,
    RecallItem,
    RecallResult,
    message_text,
    recall_report,
)
from memory.services import (
    KeyFactNotFound,
    OrmJobStore,
    OrmSummaryStore,
    compression_event_list,
    key_fact_edit,
    key_fact_hide,
    key_fact_list,
    key_fact_list_active,
    key_fact_pin,
    key_facts_apply,
    key_facts_store_rule,
    memory_index_status,
    memory_item_embeddings_save,
    memory_items_unembedded,
    memory_items_unembedded_exist,
    memory_items_write,
    memory_job_state_get,
    recall_cache_clear,
    recall_candidates,
    session_memory_delete,
    session_summary_get,
    summarizer_health_get,
)
from memory.store import CompressionRecord, InMemorySummaryStore, Summary, SummaryStore
from memory.summarizer import Summarizer, SummarizerChain, SummaryReply, SummaryRequest
from memory.tokens import TokenCounter, get_counter

__all__ = [
    "EXTRACTION_MARKER",
    "EXTRACTION_SCHEMA",
    "EXTRACTION_SCHEMA_NAME",
    "FACT_KINDS",
    "RAW_ARCHIVE_MARKER",
    "SEARCH_STOPWORDS",
    "AgentMemoryMiddleware",
    "Compression",
    "CompressionEvent",
    "CompressionJobs",
    "CompressionRecord",
    "ContextRequest",
    "ExtractionError",
    "ExtractionInput",
    "ExtractiveSummarizer",
    "FactCandidate",
    "FactsBlock",
    "FactsLoader",
    "InMemorySummaryStore",
    "IncrementLoader",
    "JobRun",
    "JobState",
    "JobStep",
    "KeyFact",
    "KeyFactNotFound",
    "MemoryBudget",
    "MemoryContext",
    "MemoryEngine",
    "MemoryJobRunner",
    "Message",
    "Mode",
    "OrmJobStore",
    "OrmSummaryStore",
    "RecallLoader",
    "Summarizer",
    "SummarizerChain",
    "Summary",
    "SummaryReply",
    "SummaryRequest",
    "SummaryRole",
    "SummaryStore",
    "TokenCounter",
    "Validation",
    "compression_event_list",
    "extraction_prompt",
    "extractive_summary",
    "get_counter",
    "key_fact_edit",
    "key_fact_hide",
    "key_fact_list",
    "key_fact_list_active",
    "key_fact_pin",
    "key_facts_apply",
    "key_facts_store_rule",
    "memory_job_state_get",
    "message_rule_facts",
    "parse_extraction",
    "rule_facts",
    "session_memory_delete",
    "session_summary_get",
    "split_summary_prompt",
    "summarizer_health_get",
    "to_wire",
    "tool_call_facts",
    "validate_extraction",
]

# The recall index (docs/memory.md §12).
__all__ += [
    "Embedder",
    "IndexPiece",
    "RecallCandidate",
    "RecallInput",
    "RecallItem",
    "RecallResult",
    "memory_index_status",
    "memory_item_embeddings_save",
    "memory_items_unembedded",
    "memory_items_unembedded_exist",
    "memory_items_write",
    "message_pieces",
    "message_text",
    "recall_cache_clear",
    "recall_candidates",
    "recall_report",
]
