"""What the offline engine answers: pure, deterministic functions of a chat request.

No randomness, no clock, no I/O. The engine can only use what is in the request, so it answers
from the visible context (system prompt, summary block, earlier user messages, tool results): a
fact that memory compression dropped is visibly forgotten (SPEC.md section 6).

Decision order for one request:

1. a summarizer prompt (it carries a ``<transcript>`` section) gets an extractive summary;
2. trailing tool results get a text answer that quotes them;
3. a user message asking to search (when ``kb_search`` is offered) or to compute (when
   ``calculator`` is offered) gets one tool call;
4. a question is answered by quoting the evidence that best overlaps it -- knowledge-base
   passages, earlier user messages, the summary block, each labelled with its source, never
   the system prompt's instructions -- or with "not found";
5. anything else is acknowledged, restating its key fact.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from memory.extractive import extractive_summary
from memory.prompts import split_summary_prompt

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


def offline_reply(messages: list[Message], *, tools: list[dict[str, Any]] | None, summary_max_tokens: int) -> OfflineReply:
    """The offline engine's reply to a Chat Completions request.

    ``messages``: the request's wire messages; ``tools``: its tool schemas (or None);
    ``summary_max_tokens``: the output cap, in tokens, of an extractive summary.
    A summary may be ``""`` when nothing in the transcript is worth keeping.
    """
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
    call = _tool_call_for(text, _tool_names(tools), messages)
    if call is not None:
        return OfflineReply(tool_calls=[call])
    return OfflineReply(text=_clip(_answer_user(text, messages[:-1]), MAX_REPLY_WORDS))


def plain_text(content: Any) -> str:
    """The text of a message ``content``: a string, None, or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


# --- tool calls -----------------------------------------------------------------------------

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
_KB_MENTION_RE = re.compile(rf"\b{_KB}\b", re.I)
_KB_PLACE_RE = re.compile(rf"\s*\b(?:in|from|on|using|according\s+to)\s+{_KB}\b", re.I)
_LEADING_ARTICLE_RE = re.compile(r"^(?:the|a|an)\s+", re.I)

_NUMBER = r"\d+(?:\.\d+)?"
_EXPRESSION_RE = re.compile(rf"[(\s]*-?{_NUMBER}[)\s]*(?:(?:\*\*|//|[-+*/%])[(\s]*-?{_NUMBER}[)\s]*)+")
_COMPUTE_VERB_RE = re.compile(r"\b(?:calculate|compute|evaluate|solve)\b", re.I)
_COMPUTE_QUESTION_RE = re.compile(r"\b(?:what\s+is|what's|how\s+much\s+is)\b", re.I)
# Dates and phone numbers look like subtractions; "2024-05-01" is an identifier, not arithmetic.
_IDENTIFIER_LIKE_RE = re.compile(r"\d+(?:-\d+){2,}")
# Typographic operators (multiplication sign, division sign, minus sign) become ASCII, and "^"
# becomes "**": the calculator tool speaks Python arithmetic, where "^" is not a power.
_OPERATOR_SPELLINGS = str.maketrans({"\u00d7": "*", "\u00f7": "/", "\u2212": "-", "^": "**"})


def _tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    return {(tool.get("function") or {}).get("name", "") for tool in tools or () if isinstance(tool, dict)}


def _tool_call_for(text: str, offered: set[str], messages: list[Message]) -> dict[str, Any] | None:
    if "kb_search" in offered and (query := search_query(text)) is not None:
        return _tool_call("kb_search", {"query": query}, messages)
    if "calculator" in offered and (expression := calculator_expression(text)) is not None:
        return _tool_call("calculator", {"expression": expression}, messages)
    return None


def search_query(text: str) -> str | None:
    """The search terms of a request to search the knowledge base, or None if it is not one.

    A request starts with a search verb ("search", "look up", "find", "what do the docs say") or
    mentions the knowledge base or docs. The query is the user's words minus the verb phrase and
    the "in the docs" phrase.
    """
    lead = _SEARCH_LEAD_RE.match(text)
    if lead is None and not _KB_MENTION_RE.search(text):
        return None
    rest = text[lead.end() :] if lead else text
    rest = _KB_PLACE_RE.sub("", rest).strip(" \t?!.,:;\"'")
    rest = _LEADING_ARTICLE_RE.sub("", rest)
    return rest or text.strip(" ?!.")


def calculator_expression(text: str) -> str | None:
    """The arithmetic to compute, or None if ``text`` does not ask for a computation.

    Asks when it contains an expression such as ``12*(3+4)`` and either is nothing but that
    expression or asks "what is / how much is / calculate ..."; "calculate <words>" without an
    expression passes the words on (the calculator tool reports what it cannot evaluate).
    """
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
    """``expression`` stripped, without the unmatched outer parentheses the regex picked up."""
    expression = expression.strip()
    while expression.startswith("(") and expression.count("(") > expression.count(")"):
        expression = expression[1:].strip()
    while expression.endswith(")") and expression.count(")") > expression.count("("):
        expression = expression[:-1].strip()
    return expression


def _tool_call(name: str, arguments: dict[str, str], messages: list[Message]) -> dict[str, Any]:
    """An OpenAI-format tool call whose id is a hash of the conversation so far: deterministic,
    yet different for the same question asked again later in the session."""
    arguments_json = json.dumps(arguments, ensure_ascii=False)
    seed = json.dumps([messages, name, arguments_json], sort_keys=True, ensure_ascii=False, default=str)
    call_id = "call_" + hashlib.sha256(seed.encode()).hexdigest()[:24]
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments_json}}


# --- answers from tool results ---------------------------------------------------------------

# chatapp.tools formats search hits as "[1] <title>\n<passage>", blank-line separated.
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

_WORD_RE = re.compile(r"[^\W_]+")
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_PARAGRAPH_SPLIT_RE = re.compile(r"\n\s*\n")
_LINE_LABEL_RE = re.compile(r"^(?:-\s+)?(?:(?:User|Assistant|System|Tool)(?:\s*\[[^\]]*\])?\s*:\s*)?")
_HEADER_RE = re.compile(r"^\[(?:Memory Summary|Raw archive)\b|^\[\d+ earlier archived messages omitted\]")
_SUMMARY_BLOCK_RE = re.compile(r"^\s*\[Memory Summary\b")
# chatapp.kb.passages_format writes knowledge-base passages as a "[n] <title>" line followed by
# the passage: in the quick-answer system prompt and in kb_search tool results.
_PASSAGE_HEAD_RE = re.compile(r"^\[\d+\][ \t]+(?P<title>[^\n]+)$", re.M)
# A short line without closing punctuation inside a passage is a Markdown heading.
_HEADING_MAX_WORDS = 8
_CLOSING_PUNCTUATION = (".", "!", "?", ":", ";", ")", "\u201d", '"')
_QUESTION_START_RE = re.compile(
    r"^(?:what|what's|who|who's|whom|whose|where|when|why|how|which|do|does|did|is|are|was|were|can|could|"
    r"would|should|will|have|has|tell\s+me|remind\s+me|recall)\b",
    re.I,
)
_GREETING_RE = re.compile(r"^(?:hi|hello|hey|howdy|good\s+(?:morning|afternoon|evening))\b[\s!.,]*(?:there)?[\s!.,]*$", re.I)
_REMEMBER_RE = re.compile(r"^(?:please\s+)?(?:remember|note|keep\s+in\s+mind)\b(?:\s+that)?[\s,:]*", re.I)
_SECOND_PERSON = {
    "i": "you", "me": "you", "my": "your", "mine": "yours", "myself": "yourself", "am": "are",
    "i'm": "you're", "i've": "you've", "i'll": "you'll", "i'd": "you'd",
}  # fmt: skip
_FIRST_PERSON_RE = re.compile(r"\b(?:i'm|i've|i'll|i'd|i|me|my|mine|myself|am)\b", re.I)
_ABOUT_THE_USER_RE = re.compile(r"\b(?:my|mine|myself)\b", re.I)
# Function words, greetings and the filler of questions ("how much ... does ... include"): they
# say what kind of answer is wanted, not what it is about.
_STOPWORDS = frozenset(
    """a an the is are was were be been being am i me my mine myself you your yours we our us he she him her his
    it its they them their what whats which who whom whose when where why how do does did done can could would
    should will shall may might must have has had of to in on at for from by with about into and or but not no yes
    this that these those there here please tell remind know remember recall say said again so if then than as just
    any some all let lets s t d ll re ve m also still now ok okay much many include includes included including
    get gets got give gives hello hi hey thanks thank kind sort""".split()
)

Source = Literal["kb", "conversation", "summary"]
SOURCE_LABELS: dict[Source, str] = {
    "kb": "From the knowledge base:",
    "conversation": "From our conversation:",
    "summary": "From the conversation summary:",
}
KB_SECTION_LABEL = "From the knowledge base ({section}):"


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """Something the engine may quote: a knowledge-base passage or one sentence of the
    conversation or of the summary block.

    ``sentences``: what may be quoted (a single sentence for conversation and summary);
    ``sections``: for each sentence, the passage heading it stands under (the document title
    before the first heading; ``""`` outside passages); ``sentence_words``: for each sentence,
    its content words and its heading's; ``words``: the content words of all of it, title
    included; ``topic``: those of the title and headings alone.
    """

    source: Source
    sentences: tuple[str, ...]
    sections: tuple[str, ...]
    sentence_words: tuple[frozenset[str], ...]
    words: frozenset[str]
    topic: frozenset[str] = frozenset()


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
    scored = [(_score(item, wanted), item) for item in evidence]
    best = max((score for score, _ in scored), default=(0, 0))
    if best[0] < needed or best[1] < 1:
        topic = " ".join(dict.fromkeys(word for word in _words(question) if word not in _STOPWORDS))
        return f"I don't find anything about “{topic}” in my current context."
    tied = [item for score, item in scored if score == best]
    chosen = [item for item in tied if item.source != "kb"][-2:] or tied[:1]
    parts: list[str] = []
    for index, item in enumerate(chosen):
        sentence, section = _quote(item, wanted)
        if item.source == "kb":
            parts.append(KB_SECTION_LABEL.format(section=section) if section else SOURCE_LABELS["kb"])
        elif index == 0 or chosen[index - 1].source != item.source:
            parts.append(SOURCE_LABELS[item.source])
        parts.append(f"“{_clip(sentence, QUOTE_WORDS)}”")
    return " ".join(parts)


def context_evidence(context: list[Message]) -> list[Evidence]:
    """What the engine may quote, oldest first.

    - the first system message (the system prompt): only its knowledge-base passages, never
      its instructions, which are no answer to anything;
    - the summary block (any role): each sentence, as the summary;
    - user messages and later system messages: each sentence, as the conversation;
    - tool results: kb_search passages as the knowledge base, anything else as the conversation.

    Its own earlier replies are left out so it never quotes itself; questions and headers carry
    no facts and are left out too.
    """
    evidence: list[Evidence] = []
    for index, message in enumerate(context):
        role = message.get("role")
        text = plain_text(message.get("content"))
        if role not in ("system", "user", "tool"):
            continue
        if _SUMMARY_BLOCK_RE.match(text):
            evidence += _sentences("summary", text)
        elif role == "system" and index == 0:
            evidence += _passages(text)
        elif role == "tool":
            evidence += _passages(text) or _sentences("conversation", text)
        else:
            evidence += _sentences("conversation", text)
    return evidence


def _passages(text: str) -> list[Evidence]:
    """The knowledge-base passages (``[n] title`` blocks) of ``text``; none when it has no such
    block. A short line without closing punctuation is a heading: a section, not a sentence."""
    heads = list(_PASSAGE_HEAD_RE.finditer(text))
    passages: list[Evidence] = []
    for number, head in enumerate(heads):
        body = text[head.end() : heads[number + 1].start() if number + 1 < len(heads) else len(text)]
        title = head.group("title").strip()
        section = title
        heading_words: frozenset[str] = frozenset()
        topic = set(content_words(title))
        sentences: list[tuple[str, str, frozenset[str]]] = []
        for paragraph in _PARAGRAPH_SPLIT_RE.split(body):
            paragraph = " ".join(paragraph.split())
            if _is_heading(paragraph):
                section, heading_words = paragraph, frozenset(content_words(paragraph))
                topic |= heading_words
                continue
            for sentence in _SENTENCE_SPLIT_RE.split(paragraph):
                if sentence:
                    sentences.append((sentence, section, heading_words | content_words(sentence)))
        if sentences:
            passages.append(
                Evidence(
                    source="kb",
                    sentences=tuple(sentence for sentence, _, _ in sentences),
                    sections=tuple(section for _, section, _ in sentences),
                    sentence_words=tuple(words for _, _, words in sentences),
                    words=frozenset(topic.union(*(words for _, _, words in sentences))),
                    topic=frozenset(topic),
                )
            )
    return passages


def _is_heading(paragraph: str) -> bool:
    return 0 < len(paragraph.split()) <= _HEADING_MAX_WORDS and not paragraph.endswith(_CLOSING_PUNCTUATION)


def _sentences(source: Source, text: str) -> list[Evidence]:
    """One piece of evidence per factual sentence of ``text`` (line labels such as ``- User:``
    removed; questions and summary headers skipped)."""
    evidence: list[Evidence] = []
    for piece in _SENTENCE_SPLIT_RE.split(text):
        sentence = _LINE_LABEL_RE.sub("", piece.strip()).strip()
        if sentence and not sentence.endswith("?") and not _HEADER_RE.match(sentence):
            words = frozenset(content_words(sentence))
            evidence.append(
                Evidence(source=source, sentences=(sentence,), sections=("",), sentence_words=(words,), words=words)
            )
    return evidence


def _score(item: Evidence, wanted: set[str]) -> tuple[int, int]:
    """``(words of the question in the evidence, most of them in one of its sentences)``."""
    return len(wanted & item.words), max(len(wanted & words) for words in item.sentence_words)


def _quote(item: Evidence, wanted: set[str]) -> tuple[str, str]:
    """``(sentence, section)``: the sentence of ``item`` to quote and the heading it stands under.

    The sentence with the most question words that the title and headings do not already say
    (for "How much storage does the Free plan include?" under "Free plan": the one with
    "storage"), then the most question words (its heading's included), then the earliest.
    """

    def rank(index: int) -> tuple[int, int, int]:
        found = wanted & item.sentence_words[index]
        return len(found - item.topic), len(found), -index

    best = max(range(len(item.sentences)), key=rank)
    return item.sentences[best], item.sections[best]


def content_words(text: str) -> set[str]:
    """Lower-cased words of ``text`` without stop words, with plural endings folded."""
    stems = (_stem(word) for word in _words(text) if word not in _STOPWORDS)
    return {stem for stem in stems if stem not in _STOPWORDS}


def _words(text: str) -> list[str]:
    return [word.lower() for word in _WORD_RE.findall(text)]


def _stem(word: str) -> str:
    """``word`` with a plural ending and a final "e" folded ("plans" -> "plan", "copies" -> "copy",
    "caches" and "cache" -> "cach"): stemming-lite, so that a question and a passage meet on the
    same word whatever its number."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("sses", "xes", "ches", "shes")):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def _acknowledge(text: str) -> str:
    """Restate the statement's first sentence as a fact about the user ("Noted: your name is Ada.")."""
    first = _SENTENCE_SPLIT_RE.split(text, maxsplit=1)[0]
    fact = _REMEMBER_RE.sub("", first).strip(" .!")
    fact = _FIRST_PERSON_RE.sub(lambda match: _SECOND_PERSON[match.group().lower()], fact)
    return f"Noted: {_clip(fact, QUOTE_WORDS)}." if fact else "Noted."


def _clip(text: str, words: int) -> str:
    """``text`` cut to at most ``words`` words, marking the cut with an ellipsis."""
    parts = text.split()
    return text.strip() if len(parts) <= words else " ".join(parts[:words]) + "…"
