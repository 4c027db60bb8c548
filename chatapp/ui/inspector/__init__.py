"""The memory inspector (docs/memory.md §8), one module per panel. Every token figure comes from the data that
built the request (the ``ModelCall.context`` snapshot, the stored summary and compression events), never from a
second estimate. Synchronous ORM code; async callers use ``database_sync_to_async``."""

from chatapp.ui.inspector.attempts import attempt_log_build, error_text
from chatapp.ui.inspector.facts import (
    FACT_IN_WINDOW,
    FACT_OVER_BUDGET,
    FACT_PINNED,
    FactRow,
    KeyFacts,
    key_fact_from_dict,
    key_facts_build,
    key_facts_section_get,
)
from chatapp.ui.inspector.gauge import EstimateCheck, Gauge, Section, estimate_check_build
from chatapp.ui.inspector.marks import MARK_FOLDED, MARK_LABELS, MARK_NEXT, MARK_NOT_SENT, MarkBasis
from chatapp.ui.inspector.recall import RecallSection, recall_build, recall_section_get
from chatapp.ui.inspector.request import MESSAGE_SECTIONS, PATH_LABELS, messages_text, request_snapshot_build
from chatapp.ui.inspector.state import InspectorState, inspector_state_get
from chatapp.ui.inspector.summary import SUMMARY_TYPE_LABELS

__all__ = [
    "FACT_IN_WINDOW",
    "FACT_OVER_BUDGET",
    "FACT_PINNED",
    "MARK_FOLDED",
    "MARK_LABELS",
    "MARK_NEXT",
    "MARK_NOT_SENT",
    "MESSAGE_SECTIONS",
    "PATH_LABELS",
    "SUMMARY_TYPE_LABELS",
    "EstimateCheck",
    "FactRow",
    "Gauge",
    "InspectorState",
    "KeyFacts",
    "MarkBasis",
    "RecallSection",
    "Section",
    "attempt_log_build",
    "error_text",
    "estimate_check_build",
    "inspector_state_get",
    "key_fact_from_dict",
    "key_facts_build",
    "key_facts_section_get",
    "messages_text",
    "recall_build",
    "recall_section_get",
    "request_snapshot_build",
]
