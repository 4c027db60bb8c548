"""What the offline engine answers: pure, deterministic functions of a chat request.

No randomness, no clock, no I/O. The engine can only use what is in the request, so it answers
from the visible context (system prompt, summary block, earlier user messages, tool results): a
fact that memory compression dropped is visibly forgotten (docs/memory.md §6).

Decision order for one request:

1. a summarizer prompt (it carries a ``<transcript>`` section) gets an extractive summary, and
   a key-facts extraction prompt (it carries ``<new_messages>``) the JSON facts of
   :mod:`chatapp.llm.offline.facts`;
2. trailing tool results get a text answer that quotes them;
3. a user message asking to search (when ``kb_search`` is offered) or to compute (when
   ``calculator`` is offered) gets one tool call;
4. a question is answered by quoting the evidence that best overlaps it -- knowledge-base
   passages, earlier user messages, the summary block, each labelled with its source, never
   the system prompt's instructions -- or with "not found";
5. anything else is acknowledged, restating its key fact.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from chatapp.llm.offline.evidence import (
    KB_SECTION_LABEL,
    SENTENCE_SPLIT_RE,
    SOURCE_LABELS,
    STOPWORDS,
    content_words,
    context_evidence,
    evidence_quote,
    evidence_score,
    plain_text,
    word_list,
)
from chatapp.llm.offline.facts import extraction_reply, is_extraction_request
from chatapp.llm.offline.intents import search_query, tool_call_for, tool_names
from memory.api import extractive_summary, split_summary_prompt

Message = dict[str, Any]

MAX_REPLY_WORDS = 70
QUOTE_WORDS = 30
NOTHING_TO_ANSWER = "I'm the offline engine and I see no new user message to answer."
GREETING = "Hello! I'm the offline engine: I answer only from what I can see in this conversation."


@dataclass(frozen=True, kw_only=True)
class OfflineReply:
    """Either ``text`` or ``tool_calls`` (OpenAI format), never both."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finish_reason(self) -> Literal["stop", "tool_calls"]:
        return "tool_calls" if self.tool_calls else "stop"


def summary_prompt_parts(messages: list[Message]) -> tuple[str, str] | None:
    """``(previous summary, transcript)`` when the last message is a summarizer prompt."""
    if not messages or messages[-1].get("role") != "user":
        return None
    return split_summary_prompt(plain_text(messages[-1].get("content")))


def is_summarizer_request(messages: list[Message]) -> bool:
    """Whether a request is for the summarizer model: a summary prompt or a key-facts
    extraction prompt (``OFFLINE_FAIL_SUMMARY`` and ``OFFLINE_SUMMARY_DELAY_SECONDS`` apply)."""
    return summary_prompt_parts(messages) is not None or is_extraction_request(messages)


def offline_reply(
    messages: list[Message], *, tools: list[dict[str, Any]] | None, summary_max_tokens: int
) -> OfflineReply:
    """The offline engine's reply to a Chat Completions request.

    ``messages``: the request's wire messages; ``tools``: its tool schemas (or None);
    ``summary_max_tokens``: the output cap, in tokens, of an extractive summary.
    A summary may be ``""`` when nothing in the transcript is worth keeping.
    """
    if is_extraction_request(messages):
        return OfflineReply(text=extraction_reply(messages))
    summary_parts = summary_prompt_parts(messages)
    if summary_parts is not None:
        previous, transcript = summary_parts
        return OfflineReply(text=extractive_summary(previous, transcript, max_tokens=summary_max_tokens))
    if not messages:
        return OfflineReply(text=NOTHING_TO_ANSWER)
    last = messages[-1]
    if last.get("role") == "tool":
        return OfflineReply(text=_clip(_answer_tool_results(messages), MAX_REPLY_WORDS))
    if last.get("role") != "user":
        return OfflineReply(text=NOTHING_TO_ANSWER)
    text = " ".join(plain_text(last.get("content")).split())
    call = tool_call_for(text, tool_names(tools), messages)
    if call is not None:
        return OfflineReply(tool_calls=[call])
    return OfflineReply(text=_clip(_answer_user(text, messages[:-1]), MAX_REPLY_WORDS))


# --- tool calls -----------------------------------------------------------------------------


# --- answers from tool results ---------------------------------------------------------------

# chatapp.conversation.tools formats search hits as "[1] <title>\n<passage>", blank-line separated.
_FIRST_PASSAGE_RE = re.compile(r"^\[1\]\s*(?P<title>[^\n]*)\n(?P<text>.*?)(?:\n\n\[2\]|\Z)", re.S)


def _answer_tool_results(messages: list[Message]) -> str:
    """One sentence per trailing tool result, quoting it."""
    results: list[Message] = []
    index = len(messages) - 1
    while index >= 0 and messages[index].get("role") == "tool":
        results.insert(0, messages[index])
        index -= 1
    caller = messages[index] if index >= 0 else {}
    calls = {call.get("id"): call for call in caller.get("tool_calls") or ()}
    return " ".join(_describe_result(result, calls.get(result.get("tool_call_id"))) for result in results)


def _describe_result(result: Message, call: dict[str, Any] | None) -> str:
    function = (call or {}).get("function") or {}
    name = result.get("name") or function.get("name") or "tool"
    arguments = _json_object(function.get("arguments"))
    content = plain_text(result.get("content")).strip()
    if not content:
        return f"The {name} tool returned nothing."
    if content.lower().startswith("error:"):
        return f"The {name} tool reported an {_clip(content, QUOTE_WORDS)}"
    if name == "calculator":
        return f"The calculator says {arguments.get('expression', 'the expression')} = {_clip(content, QUOTE_WORDS)}."
    passage = _FIRST_PASSAGE_RE.match(content) if name == "kb_search" else None
    if passage is not None:
        title, text = passage.group("title").strip(), " ".join(passage.group("text").split())
        return f"The knowledge base says ({title}): “{_clip(text, QUOTE_WORDS)}”"
    return f"The {name} tool returned: {_clip(content, QUOTE_WORDS)}"


def _json_object(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# --- answers from the visible context ---------------------------------------------------------

_QUESTION_START_RE = re.compile(
    r"^(?:what|what's|who|who's|whom|whose|where|when|why|how|which|do|does|did|is|are|was|were|can|could|"
    r"would|should|will|have|has|tell\s+me|remind\s+me|recall)\b",
    re.I,
)
_GREETING_RE = re.compile(
    r"^(?:hi|hello|hey|howdy|good\s+(?:morning|afternoon|evening))\b[\s!.,]*(?:there)?[\s!.,]*$", re.I
)
_REMEMBER_RE = re.compile(r"^(?:please\s+)?(?:remember|note|keep\s+in\s+mind)\b(?:\s+that)?[\s,:]*", re.I)
_SECOND_PERSON = {
    "i": "you", "me": "you", "my": "your", "mine": "yours", "myself": "yourself", "am": "are",
    "i'm": "you're", "i've": "you've", "i'll": "you'll", "i'd": "you'd",
}  # fmt: skip
_FIRST_PERSON_RE = re.compile(r"\b(?:i'm|i've|i'll|i'd|i|me|my|mine|myself|am)\b", re.I)
_ABOUT_THE_USER_RE = re.compile(r"\b(?:my|mine|myself)\b", re.I)


def _answer_user(text: str, context: list[Message]) -> str:
    if not text:
        return "I received an empty message."
    if _GREETING_RE.match(text):
        return GREETING
    if text.endswith("?") or _QUESTION_START_RE.match(text):
        return _answer_question(text, context)
    # Without a kb_search tool (quick-answer mode) the retrieved passages are in the context.
    if (query := search_query(text)) is not None:
        return _answer_question(query, context)
    return _acknowledge(text)


def _answer_question(question: str, context: list[Message]) -> str:
    """Quote the evidence (:func:`context_evidence`) that shares the most content words with
    ``question``, each quote labelled with its source (:data:`SOURCE_LABELS`; a passage also
    names its section: "From the knowledge base (Free plan): “It includes 5 GB of storage...”").

    Evidence must cover most of the question's content words (60 %, at most 3 needed), so that
    "favourite colour" is not answered with "favourite food" once the colour was forgotten; a
    passage counts its title and headings, but must also have a sentence with one of the words
    (its heading's count), which is what gets quoted. A question about the user ("my", "mine")
    is answered from the conversation and the summary only: the knowledge base knows nothing
    about them ("What's my name?" is not about a device name). Ties go to the evidence with the
    best sentence, then to what the user said (conversation, summary: the two most recent,
    oldest first, so a later correction comes last), then to the best-ranked passage (first in
    the prompt).
    """
    wanted = content_words(question)
    if not wanted:
        return "I'm not sure what to look for. I can only answer from what I see in this conversation."
    needed = min(3, math.ceil(0.6 * len(wanted)))
    evidence = context_evidence(context)
    if _ABOUT_THE_USER_RE.search(question):
        evidence = [item for item in evidence if item.source != "kb"]
    scored = [(evidence_score(item, wanted), item) for item in evidence]
    best = max((score for score, _ in scored), default=(0, 0))
    if best[0] < needed or best[1] < 1:
        topic = " ".join(dict.fromkeys(word for word in word_list(question) if word not in STOPWORDS))
        return f"I don't find anything about “{topic}” in my current context."
    tied = [item for score, item in scored if score == best]
    chosen = [item for item in tied if item.source != "kb"][-2:] or tied[:1]
    parts: list[str] = []
    for index, item in enumerate(chosen):
        sentence, section = evidence_quote(item, wanted)
        if item.source == "kb":
            parts.append(KB_SECTION_LABEL.format(section=section) if section else SOURCE_LABELS["kb"])
        elif index == 0 or chosen[index - 1].source != item.source:
            parts.append(SOURCE_LABELS[item.source])
        parts.append(f"“{_clip(sentence, QUOTE_WORDS)}”")
    return " ".join(parts)


def _acknowledge(text: str) -> str:
    """Restate the statement's first sentence as a fact about the user ("Noted: your name is Ada.")."""
    first = SENTENCE_SPLIT_RE.split(text, maxsplit=1)[0]
    fact = _REMEMBER_RE.sub("", first).strip(" .!")
    fact = _FIRST_PERSON_RE.sub(lambda match: _SECOND_PERSON[match.group().lower()], fact)
    return f"Noted: {_clip(fact, QUOTE_WORDS)}." if fact else "Noted."


def _clip(text: str, words: int) -> str:
    """``text`` cut to at most ``words`` words, marking the cut with an ellipsis."""
    parts = text.split()
    return text.strip() if len(parts) <= words else " ".join(parts[:words]) + "…"
