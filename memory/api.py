"""What other apps may use of the memory engine: everything here, nothing else.

The chat app imports only this module (checked by import-linter, see pyproject.toml). Names are
grouped by role; each is documented where it is defined.
"""

from __future__ import annotations

from memory.context.budget import MemoryBudget, Mode, SummaryRole
from memory.context.builder import AgentMemoryMiddleware, MemoryEngine
from memory.context.request import (
    Compression,
    CompressionJobs,
    ContextRequest,
    FactsLoader,
    IncrementLoader,
    MemoryContext,
    RecallLoader,
)
from memory.facts.block import FACTS_HEADER, FactsBlock
from memory.facts.extraction import (
    EXTRACTION_MARKER,
    EXTRACTION_SCHEMA,
    EXTRACTION_SCHEMA_NAME,
    ExtractionError,
    ExtractionInput,
    Validation,
    extraction_prompt,
    parse_extraction,
    validate_extraction,
)
from memory.facts.rules import message_rule_facts, rule_facts, tool_call_facts, value_spans
from memory.facts.values import FACT_KINDS, FactCandidate, KeyFact
from memory.jobs.runner import JobRun, MemoryJobRunner
from memory.jobs.state import JobState, JobStep
from memory.messages import Message, to_wire
from memory.models import CompressionEvent
from memory.ports import Embedder, Summarizer, SummaryReply, SummaryRequest
from memory.recall.block import RECALL_HEADER, recall_report
from memory.recall.pieces import IndexPiece, message_pieces, message_text
from memory.recall.rank import recall_anchors, recall_scored
from memory.recall.values import RecallCandidate, RecallInput, RecallItem, RecallResult, ScoredCandidate, TermRarity
from memory.storage.calibration import token_calibration_get, token_calibration_record
from memory.storage.facts import (
    KeyFactNotFound,
    key_fact_edit,
    key_fact_hide,
    key_fact_list,
    key_fact_list_active,
    key_fact_pin,
    key_facts_apply,
    key_facts_store_rule,
)
from memory.storage.index import (
    LexicalHits,
    memory_index_status,
    memory_item_embeddings_exist,
    memory_item_embeddings_known,
    memory_item_embeddings_save,
    memory_items_unembedded,
    memory_items_unembedded_exist,
    memory_items_write,
    recall_cache_clear,
    recall_candidates,
    recall_lexical_hits,
    recall_neighbors,
    recall_term_rarity,
)
from memory.storage.job_state import OrmJobStore, memory_job_state_get
from memory.storage.summaries import (
    OrmSummaryStore,
    compression_event_list,
    compression_event_list_after,
    session_memory_delete,
    session_summary_get,
    session_summary_kind,
    summarizer_health_get,
)
from memory.summary.archive import RAW_ARCHIVE_MARKER, summary_block
from memory.summary.chain import METHOD_EXTRACTIVE, METHOD_LLM, SummarizerChain, summary_kind
from memory.summary.extractive import ExtractiveSummarizer, extractive_summary
from memory.summary.prompts import split_summary_prompt
from memory.summary.store import CompressionRecord, InMemorySummaryStore, Summary, SummaryStore
from memory.text.fulltext import SEARCH_STOPWORDS
from memory.text.sentences import split_sentences
from memory.tokens.calibration import MAX_FACTOR, MIN_FACTOR, MIN_SAMPLE_TOKENS, Calibration
from memory.tokens.counter import TokenCounter, get_counter

__all__ = [
    "EXTRACTION_MARKER",
    "EXTRACTION_SCHEMA",
    "EXTRACTION_SCHEMA_NAME",
    "FACTS_HEADER",
    "FACT_KINDS",
    "METHOD_EXTRACTIVE",
    "METHOD_LLM",
    "RAW_ARCHIVE_MARKER",
    "RECALL_HEADER",
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
    "compression_event_list_after",
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
    "session_summary_kind",
    "split_sentences",
    "split_summary_prompt",
    "summarizer_health_get",
    "summary_block",
    "summary_kind",
    "to_wire",
    "tool_call_facts",
    "validate_extraction",
    "value_spans",
]

# The recall index (docs/memory.md §12).
__all__ += [
    "Embedder",
    "IndexPiece",
    "LexicalHits",
    "RecallCandidate",
    "RecallInput",
    "RecallItem",
    "RecallResult",
    "ScoredCandidate",
    "TermRarity",
    "memory_index_status",
    "memory_item_embeddings_exist",
    "memory_item_embeddings_known",
    "memory_item_embeddings_save",
    "memory_items_unembedded",
    "memory_items_unembedded_exist",
    "memory_items_write",
    "message_pieces",
    "message_text",
    "recall_anchors",
    "recall_cache_clear",
    "recall_candidates",
    "recall_lexical_hits",
    "recall_neighbors",
    "recall_report",
    "recall_scored",
    "recall_term_rarity",
]

# Token-estimate calibration (docs/memory.md §5, "Calibration").
__all__ += [
    "MAX_FACTOR",
    "MIN_FACTOR",
    "MIN_SAMPLE_TOKENS",
    "Calibration",
    "token_calibration_get",
    "token_calibration_record",
]
