"""What the product sends the chat model besides the history: the system prompts of both modes
and the agent's tool schemas (docs/memory.md §7)."""

from __future__ import annotations

from typing import Any

AGENT_PROMPT = (
    "You are the assistant of Kestrel Sync, a file sync and backup service. Use the kb_search tool "
    "to look up product facts (plans, prices, limits, security, troubleshooting) before answering "
    "questions about them, and the calculator tool for arithmetic. Quote numbers exactly. Answer "
    "concisely; if the knowledge base has no answer, say so."
)

QUICK_ANSWER_PROMPT = (
    "You are the support assistant of Kestrel Sync. Answer the user's question from the knowledge "
    "base passages below and the conversation so far. Quote numbers exactly. If the passages do "
    "not contain the answer, say so briefly instead of guessing."
)
# Knowledge-base passages may take this share of the engine's target, so history keeps room.
PASSAGES_TARGET_SHARE = 1 / 3
# An agent's kb_search result stays in the history (the agent may search again): a smaller share, so that the retained
# window holds whole turns after a compression (docs/memory.md §7).
AGENT_PASSAGES_TARGET_SHARE = 1 / 8
NO_PASSAGES = "(no passage matched the question)"


def system_prompt_with(knowledge: str) -> str:
    """The quick-answer system prompt carrying ``knowledge``, the formatted passages."""
    return f"{QUICK_ANSWER_PROMPT}\n\nKnowledge base passages:\n\n{knowledge}"


# Not indexed for recall (docs/memory.md §12, "The index"): the knowledge base is searched afresh, and an empty
# search's result only repeats its question, which the recall gate would then admit for that question.
UNINDEXED_TOOLS = frozenset({"kb_search"})
# How a tool result that found nothing begins: memory neither summarizes nor recalls it, nor the answer given on it.
NO_PASSAGES_FOUND = "no passages found"
EMPTY_RESULTS = (NO_PASSAGES_FOUND,)

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "kb_search",
            "description": "Search the product knowledge base. Returns the most relevant passages and their titles.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "Keywords or a question."}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with numbers, + - * / // % ** and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "For example (12.5 * 4) / 3"}},
                "required": ["expression"],
            },
        },
    },
]
