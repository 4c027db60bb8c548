"""What the offline engine recognises a user message as asking for: a knowledge-base search or a
calculation, turned into one OpenAI tool call. Pure and deterministic."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

Message = dict[str, Any]


_KB = r"(?:the\s+)?(?:knowledge\s*base|kb|docs|documentation|documents)"


_FILLER = r"(?:(?:please|hey|ok|okay|so|now|and|can\s+you|could\s+you|would\s+you|will\s+you)[\s,]+)*"


_SEARCH_LEAD_RE = re.compile(
    rf"^{_FILLER}(?:"
    rf"(?:search|look\s*-?\s*up|find)\b(?:\s+(?:in|on|through))?(?:\s+{_KB}\b)?(?:\s+(?:for|about|on|regarding)\b)?"
    rf"|what\s+(?:does|do|did)\s+{_KB}\s+say\b(?:\s+(?:about|on|regarding)\b)?"
    rf"|(?:where|how)\s+(?:can|do|could)\s+i\s+find\b"
    rf")\s*",
    re.I,
)


_KB_PLACE_RE = re.compile(rf"\s*\b(?:in|from|on|using|according\s+to)\s+{_KB}\b", re.I)


# The docs named, or as a place to look ("in the docs"); "I signed the documents" is no request.
_KB_MENTION_RE = re.compile(
    rf"\b(?:knowledge\s*base|kb|documentation)\b|{_KB_PLACE_RE.pattern}|\b{_KB}\s+(?:say|says|said)\b", re.I
)


_LEADING_ARTICLE_RE = re.compile(r"^(?:the|a|an)\s+", re.I)


_NUMBER = r"\d+(?:\.\d+)?"


_EXPRESSION_RE = re.compile(rf"[(\s]*-?{_NUMBER}[)\s]*(?:(?:\*\*|//|[-+*/%])[(\s]*-?{_NUMBER}[)\s]*)+")


_COMPUTE_VERB_RE = re.compile(r"\b(?:calculate|compute|evaluate|solve)\b", re.I)


_COMPUTE_QUESTION_RE = re.compile(r"\b(?:what\s+is|what's|how\s+much\s+is)\b", re.I)


# Dates and phone numbers look like subtractions ("2024-05-01").
_IDENTIFIER_LIKE_RE = re.compile(r"\d+(?:-\d+){2,}")


# Typographic operators become ASCII, "^" becomes "**": the calculator speaks Python arithmetic.
_OPERATOR_SPELLINGS = str.maketrans({"\u00d7": "*", "\u00f7": "/", "\u2212": "-", "^": "**"})


def tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    return {(tool.get("function") or {}).get("name", "") for tool in tools or () if isinstance(tool, dict)}


def tool_call_for(text: str, offered: set[str], messages: list[Message]) -> dict[str, Any] | None:
    if "kb_search" in offered and (query := search_query(text)) is not None:
        return _tool_call("kb_search", {"query": query}, messages)
    if "calculator" in offered and (expression := calculator_expression(text)) is not None:
        return _tool_call("calculator", {"expression": expression}, messages)
    return None


def kb_search_call(question: str, messages: list[Message]) -> dict[str, Any]:
    """The ``kb_search`` call for a question the context does not answer (agent mode, docs/memory.md §7)."""
    return _tool_call("kb_search", {"query": question.strip(" \t?!.")}, messages)


def search_query(text: str) -> str | None:
    """The terms of a request to search ("look up …", "what do the docs say about …"), or None if it is not one."""
    lead = _SEARCH_LEAD_RE.match(text)
    if lead is None and not _KB_MENTION_RE.search(text):
        return None
    rest = text[lead.end() :] if lead else text
    rest = _KB_PLACE_RE.sub("", rest).strip(" \t?!.,:;\"'")
    rest = _LEADING_ARTICLE_RE.sub("", rest)
    return rest or text.strip(" ?!.")


def calculator_expression(text: str) -> str | None:
    """The arithmetic ``text`` asks for (an expression, alone or after "what is" or "calculate"), or None;
    "calculate <words>" passes the words on for the calculator to refuse."""
    normalized = text.translate(_OPERATOR_SPELLINGS)
    matches = [_balanced(match.group()) for match in _EXPRESSION_RE.finditer(normalized)]
    expression = max(matches, key=len, default="")
    verb = _COMPUTE_VERB_RE.search(normalized)
    bare = normalized.strip(" ?!.=") == expression
    asked = bare or verb or _COMPUTE_QUESTION_RE.search(normalized)
    if expression and asked and not _IDENTIFIER_LIKE_RE.fullmatch(expression):
        return expression
    if verb:
        return normalized[verb.end() :].strip(" :?!.") or None
    return None


def _balanced(expression: str) -> str:
    expression = expression.strip()
    while expression.startswith("(") and expression.count("(") > expression.count(")"):
        expression = expression[1:].strip()
    while expression.endswith(")") and expression.count(")") > expression.count("("):
        expression = expression[:-1].strip()
    return expression


def _tool_call(name: str, arguments: dict[str, str], messages: list[Message]) -> dict[str, Any]:
    """A tool call whose id hashes the conversation: deterministic, yet new when the question is asked again."""
    arguments_json = json.dumps(arguments, ensure_ascii=False)
    seed = json.dumps([messages, name, arguments_json], sort_keys=True, ensure_ascii=False, default=str)
    call_id = "call_" + hashlib.sha256(seed.encode()).hexdigest()[:24]
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments_json}}
