"""What other apps may use of the memory engine: everything here, nothing else (checked by
import-linter). The engine, its config, the request and report values, the three ports, and the
few pieces of the wire format an app that imitates a model needs (the offline engine)."""

from __future__ import annotations

from memory.config import MemoryConfig
from memory.context.request import ContextRequest, MemoryContext
from memory.engine import MemoryEngine
from memory.facts.block import FACTS_HEADER
from memory.facts.extraction import EXTRACTION_MARKER
from memory.facts.rules import message_rule_facts, value_spans
from memory.facts.values import FactCandidate, KeyFact
from memory.jobs.runner import in_memory_job
from memory.messages import Message, to_wire
from memory.ports import (
    ConversationSource,
    Embedder,
    NextRequest,
    Notice,
    StoredMessages,
    Summarizer,
    SummaryReply,
    SummaryRequest,
)
from memory.recall.block import RECALL_HEADER
from memory.recall.search import TurnRecall
from memory.storage.facts import KeyFactNotFound
from memory.summary.extractive import ExtractiveSummarizer
from memory.summary.store import CompressionRecord, Summary
from memory.text.fulltext import SEARCH_STOPWORDS
from memory.text.sentences import split_sentences
from memory.tokens.counter import TokenCounter, get_counter

__all__ = [
    "EXTRACTION_MARKER",
    "FACTS_HEADER",
    "RECALL_HEADER",
    "SEARCH_STOPWORDS",
    "CompressionRecord",
    "ContextRequest",
    "ConversationSource",
    "Embedder",
    "ExtractiveSummarizer",
    "FactCandidate",
    "KeyFact",
    "KeyFactNotFound",
    "MemoryConfig",
    "MemoryContext",
    "MemoryEngine",
    "Message",
    "NextRequest",
    "Notice",
    "StoredMessages",
    "Summarizer",
    "Summary",
    "SummaryReply",
    "SummaryRequest",
    "TokenCounter",
    "TurnRecall",
    "get_counter",
    "in_memory_job",
    "message_rule_facts",
    "split_sentences",
    "to_wire",
    "value_spans",
]
