"""What the offline engine answers (docs/memory.md §6): pure, deterministic functions of a chat request, from
the visible context only. Order: a summary or key-facts prompt, trailing tool results, a tool call, a question
(key facts, then quoted evidence), then a greeting, thanks or a statement noted in the second person."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from chatapp.llm.offline.blocks import question_and_blocks
from chatapp.llm.offline.evidence import (
    KB_SECTION_LABEL,
    STOPWORDS,
    Evidence,
    content_words,
    context_evidence,
    evidence_quote,
    evidence_score,
    passage_evidence,
    plain_text,
    word_list,
    words_needed,
)
from chatapp.llm.offline.fact_answers import answer_from_facts, facts_of
from chatapp.llm.offline.facts import extraction_reply, is_extraction_request
from chatapp.llm.offline.intents import (
    calculator_expression,
    kb_search_call,
    search_query,
    tool_call_for,
    tool_names,
)
from memory.api import ExtractiveSummarizer, split_sentences

Message = dict[str, Any]

MAX_REPLY_WORDS = 70
QUOTE_WORDS = 30
NOTHING_TO_ANSWER = "I'm the offline engine and I see no new user message to answer."
GREETING = "Hello! I'm the offline engine: I answer only from what I can see in this conversation."
WELCOME = "You're welcome."
NOT_SURE = "I'm not sure what to look for. I can only answer from what I see in this conversation."
NOT_FOUND = "I don't find anything about “{topic}” in my current context."
KB_SAYS = "The knowledge base says ({section}):"
NOT_FOUND_SEARCHED = "I don't find anything about “{topic}” in my current context or in the knowledge base."
# The engine only answers what it can quote (docs/memory.md §6), so it never computes: it points to the calculator.
NO_CALCULATOR = (
    "Quick answer has no calculator, and I only answer from what I can quote, so I don't compute “{expression}”."
    " Switch this chat to agent mode: its calculator tool does."
)


@dataclass(frozen=True, kw_only=True)
class OfflineReply:
    """Either ``text`` or ``tool_calls`` (OpenAI format), never both; ``cut``: the text ended at the request's
    ``max_tokens``, as a provider's reply that ends with ``finish_reason: "length"``."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    cut: bool = False

    @property
    def finish_reason(self) -> Literal["stop", "tool_calls", "length"]:
        if self.tool_calls:
            return "tool_calls"
        return "length" if self.cut else "stop"


def summary_prompt(messages: list[Message]) -> str | None:
    """The last message's text when it is a summarizer prompt."""
    if not messages or messages[-1].get("role") != "user":
        return None
    content = plain_text(messages[-1].get("content"))
    return content if ExtractiveSummarizer.is_prompt(content) else None


def is_summarizer_request(messages: list[Message]) -> bool:
    """Whether a request is a summary or key-facts prompt (``OFFLINE_FAIL_SUMMARY`` and ``OFFLINE_SUMMARY_DELAY``)."""
    return summary_prompt(messages) is not None or is_extraction_request(messages)


def offline_reply(
    messages: list[Message], *, tools: list[dict[str, Any]] | None, summary_max_tokens: int
) -> OfflineReply:
    """The reply to a Chat Completions request; an extractive summary is capped at ``summary_max_tokens`` tokens
    and may be ``""`` when nothing is worth keeping."""
    if is_extraction_request(messages):
        return OfflineReply(text=extraction_reply(messages))
    prompt = summary_prompt(messages)
    if prompt is not None:
        text = ExtractiveSummarizer.reply(prompt, max_tokens=summary_max_tokens, prompt=messages)
        return OfflineReply(text=text or "")
    if not messages:
        return OfflineReply(text=NOTHING_TO_ANSWER)
    last = messages[-1]
    if last.get("role") == "tool":
        return OfflineReply(text=_clip(_answer_tool_results(messages), MAX_REPLY_WORDS))
    if last.get("role") != "user":
        return OfflineReply(text=NOTHING_TO_ANSWER)
    words, merged = question_and_blocks(plain_text(last.get("content")))
    text = " ".join(words.split())
    # Blocks merged into the user's message (strict alternation) are context like any other.
    context = [*messages[:-1], *({"role": "user", "content": block.text} for block in merged)]
    offered = tool_names(tools)
    call = tool_call_for(text, offered, messages)
    if call is not None:
        return OfflineReply(tool_calls=[call])
    if "calculator" not in offered and (expression := calculator_expression(text)) is not None:
        return OfflineReply(text=NO_CALCULATOR.format(expression=_clip(expression, QUOTE_WORDS)))
    question = _question_of(text)
    if question is not None:
        searchable = "kb_search" in offered
        answer = _answer_question(question, context, complete=searchable)
        if answer is None and searchable:
            return OfflineReply(tool_calls=[kb_search_call(question, messages)])
        return OfflineReply(text=_clip(answer or _not_found(question), MAX_REPLY_WORDS))
    return OfflineReply(text=_clip(_answer_statement(text, context), MAX_REPLY_WORDS))


def _answer_tool_results(messages: list[Message]) -> str:
    """One answer per trailing tool result: a ``kb_search`` for a question answers it (or says not found), others
    are quoted."""
    results: list[Message] = []
    index = len(messages) - 1
    while index >= 0 and messages[index].get("role") == "tool":
        results.insert(0, messages[index])
        index -= 1
    caller = messages[index] if index >= 0 else {}
    calls = {call.get("id"): call for call in caller.get("tool_calls") or ()}
    asked = _current_user_words(messages[:index])
    question = _question_of(asked) if search_query(asked) is None else None
    parts = []
    for result in results:
        call = calls.get(result.get("tool_call_id"))
        name = result.get("name") or ((call or {}).get("function") or {}).get("name")
        passages = passage_evidence(plain_text(result.get("content"))) if name == "kb_search" else []
        if question is not None and name == "kb_search":
            parts.append(
                _answer_from_passages(question, passages)
                or _answer_from_memory(question, _without_question(messages[:index]))
                or _not_found(question, searched=True)
            )
        elif passages:
            query = str(_json_object(((call or {}).get("function") or {}).get("arguments")).get("query", asked))
            parts.append(_search_result(query, passages))
        else:
            parts.append(_describe_result(result, call))
    return " ".join(parts)


def _search_result(query: str, passages: list[Evidence]) -> str:
    """The answer to an explicit "search …": the best-matching passage's sentences, else the top passage's best."""
    wanted = _question_words(query)
    found = _quote(passages, wanted, kb_label=KB_SAYS)
    if found is not None:
        return found
    sentence, section = evidence_quote(passages[0], wanted)
    return f"{passages[0].label(section, kb_label=KB_SAYS)} “{_clip(sentence, QUOTE_WORDS)}”"


def _without_question(messages: list[Message]) -> list[Message]:
    """``messages`` without the last user message's own words (no evidence for itself), keeping its merged blocks."""
    for position in range(len(messages) - 1, -1, -1):
        if messages[position].get("role") == "user":
            _, merged = question_and_blocks(plain_text(messages[position].get("content")))
            blocks = [{"role": "user", "content": block.text} for block in merged]
            return [*messages[:position], *blocks, *messages[position + 1 :]]
    return messages


def _current_user_words(messages: list[Message]) -> str:
    """The words of the last user message, without merged memory blocks; ``""`` when there is none."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return " ".join(question_and_blocks(plain_text(message.get("content")))[0].split())
    return ""


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
    if name == "kb_search" and content.startswith("no passages found"):
        return f"I searched the knowledge base for “{arguments.get('query', '')}” and found nothing."
    return f"The {name} tool returned: {_clip(content, QUOTE_WORDS)}"


def _json_object(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


_QUESTION_START_RE = re.compile(
    r"^(?:what|what's|who|who's|whom|whose|where|when|why|how|which|do|does|did|is|are|was|were|can|could|"
    r"would|should|will|have|has|tell\s+me|remind\s+me|recall)\b",
    re.I,
)
_ABOUT_THE_USER_RE = re.compile(r"\b(?:my|mine|myself|our|ours)\b", re.I)
# "how long", "how often": the second word says what kind of answer is wanted, not its topic.
_HOW_MEASURE_RE = re.compile(r"\bhow\s+(?:long|often|far|soon)\b", re.I)
# Filler of questions about the conversation, and verbs linking the asker to the topic ("What encryption do you
# use?"), which a passage on the topic rarely repeats.
_QUESTION_FILLER = frozenset(
    content_words(
        "gave given told mentioned earlier before previously already currently actually"
        " use used uses using offer offers offered provide provides provided"
    )
)


def _question_of(text: str) -> str | None:
    """The question ``text`` asks, or None: its sentences ending in "?", else all of it when it opens with a question
    word ("Tell me about …")."""
    sentences = [s for s in split_sentences(text) if not _GREETING_RE.match(s)]
    asked = [sentence for sentence in sentences if sentence.endswith("?")]
    if asked:
        return " ".join(asked)
    if sentences and _QUESTION_START_RE.match(sentences[0]):
        return " ".join(sentences)
    return None


def _question_words(question: str) -> set[str]:
    """The content words saying what ``question`` is about, without its filler."""
    return content_words(_HOW_MEASURE_RE.sub("how", question)) - _QUESTION_FILLER


def _not_found(question: str, *, searched: bool = False) -> str:
    """The honest "not found" (``searched``: not in the knowledge base either), naming what was looked for."""
    cleaned = _HOW_MEASURE_RE.sub("how", question)
    topic = " ".join(
        dict.fromkeys(
            word
            for word in word_list(cleaned)
            if word not in STOPWORDS and not (content_words(word) & _QUESTION_FILLER)
        )
    )
    return (NOT_FOUND_SEARCHED if searched else NOT_FOUND).format(topic=topic)


def _answer_question(question: str, context: list[Message], *, complete: bool = False) -> str | None:
    """The answer from ``context``: a key fact, else the best-covering evidence quoted with its source; None when
    nothing answers. ``complete`` (agent mode, knowledge base still searchable): only evidence that answers outright
    (:func:`_covers`), anything less is left to ``kb_search``."""
    wanted = _question_words(question)
    if not wanted:
        return NOT_SURE
    evidence = context_evidence(context)
    facts = [fact for message in context for fact in facts_of(message)]
    answer = answer_from_facts(question, wanted, facts, evidence)
    if answer is not None:
        return answer
    if complete:
        evidence = [item for item in evidence if _covers(item, wanted)]
    if not _ABOUT_THE_USER_RE.search(question):
        return _quote(evidence, wanted)
    remembered = _quote([item for item in evidence if item.source != "kb"], wanted)
    return remembered or _answer_from_passages(question, [item for item in evidence if item.source == "kb"])


def _covers(item: Evidence, wanted: set[str]) -> bool:
    """Whether a sentence of ``item`` holds every ``wanted`` word and, in a passage, its heading names one: the
    passage is about what is asked, not merely mentioning it."""
    return any(
        wanted <= words and (item.source != "kb" or bool(wanted & content_words(section)))
        for words, section in zip(item.sentence_words, item.sections, strict=True)
    )


def _answer_from_memory(question: str, context: list[Message]) -> str | None:
    """The quote of what the user said that answers ``question``, or None; earlier passages are left out, as the
    knowledge base was just asked this very question."""
    wanted = _question_words(question)
    if not wanted:
        return None
    return _quote([item for item in context_evidence(context) if item.source != "kb"], wanted)


def _answer_from_passages(question: str, passages: list[Evidence]) -> str | None:
    """The quote of ``passages`` answering ``question``, or None; a question about the user needs 2+ words, all
    in one passage."""
    wanted = _question_words(question)
    if not wanted:
        return None
    if _ABOUT_THE_USER_RE.search(question):
        if len(wanted) < 2:
            return None
        passages = [item for item in passages if wanted <= item.words]
    return _quote(passages, wanted)


def _quote(evidence: list[Evidence], wanted: set[str], *, kb_label: str = KB_SECTION_LABEL) -> str | None:
    """The quote of the best-matching ``evidence``, or None; ties go to the user's two latest, else the first."""
    scored = [(evidence_score(item, wanted), item) for item in evidence]
    best = max((score for score, _ in scored), default=(0, 0))
    if best[0] < words_needed(wanted) or best[1] < 1:
        return None
    tied = [item for score, item in scored if score == best]
    chosen = [item for item in tied if item.source != "kb"][-2:] or tied[:1]
    parts: list[str] = []
    previous = ""
    for item in chosen:
        quotes = _evidence_quotes(item, wanted)
        label = item.label(quotes[0][1], kb_label=kb_label)
        if label != previous or item.source == "kb":
            parts.append(label)
        previous = label
        parts += [f"“{_clip(sentence, QUOTE_WORDS)}”" for sentence, _ in quotes]
    return " ".join(parts)


def _evidence_quotes(item: Evidence, wanted: set[str]) -> list[tuple[str, str]]:
    """``[(sentence, section)]``: the best sentence, plus for a passage one of the same section with the words the
    first misses, in passage order."""
    sentence, section = evidence_quote(item, wanted)
    quotes = [(sentence, section)]
    if item.source != "kb":
        return quotes
    first = item.sentences.index(sentence)
    missing = wanted - item.sentence_words[first] - item.topic
    extra = [
        index
        for index in range(len(item.sentences))
        if index != first and item.sections[index] == section and missing & item.sentence_words[index]
    ]
    if extra:
        best = max(extra, key=lambda index: (len(missing & item.sentence_words[index]), -index))
        quotes.insert(0 if best < first else 1, (item.sentences[best], section))
    return quotes


_GREETING_RE = re.compile(
    r"^(?:hi|hello|hey|howdy|good\s+(?:morning|afternoon|evening))\b[\s!.,]*(?:there)?[\s!.,]*$", re.I
)
_GREETING_LEAD_RE = re.compile(
    r"^(?:hi|hello|hey|howdy|good\s+(?:morning|afternoon|evening))(?:\s+there)?[\s,!.]+", re.I
)
_THANKS_RE = re.compile(
    r"^(?:many\s+|thanks?,?\s+)?(?:thanks|thank\s+you|thx|cheers)(?:\s+(?:a\s+lot|so\s+much|very\s+much))?[\s!.,]*$",
    re.I,
)
_REMEMBER_RE = re.compile(r"^(?:please\s+)?(?:remember|note|keep\s+in\s+mind)\b(?:\s+that)?[\s,:]*", re.I)
_SECOND_PERSON = {
    "i was": "you were", "i wasn't": "you weren't", "i wasn’t": "you weren’t",
    "i": "you", "me": "you", "my": "your", "mine": "yours", "myself": "yourself", "am": "are",
    "i'm": "you're", "i've": "you've", "i'll": "you'll", "i'd": "you'd",
    "i’m": "you’re", "i’ve": "you’ve", "i’ll": "you’ll", "i’d": "you’d",
    "we": "you", "us": "you", "our": "your", "ours": "yours", "ourselves": "yourselves",
    "we're": "you're", "we've": "you've", "we'll": "you'll", "we’re": "you’re", "we’ve": "you’ve",
}  # fmt: skip
_FIRST_PERSON_RE = re.compile(
    r"\b(?:i\s+was(?:n['’]t)?|i['’]m|i['’]ve|i['’]ll|i['’]d|we['’]re|we['’]ve|we['’]ll"
    r"|i|me|my|mine|myself|am|we|us|our|ours|ourselves)\b",
    re.I,
)
NOTED_SENTENCES = 2


def _answer_statement(text: str, context: list[Message]) -> str:
    """The reply to a message asking no question: greeted, thanked, a "search …" answered from the context's
    passages (quick answer), else noted."""
    if not text:
        return "I received an empty message."
    if _GREETING_RE.match(text):
        return GREETING
    if _THANKS_RE.match(text):
        return WELCOME
    if (query := search_query(text)) is not None:
        return _answer_question(query, context) or _not_found(query)
    return _acknowledge(text)


# Lowercased after "; " (names stay as typed).
_JOINED_LOWERCASE = frozenset({"He", "She", "It", "They", "We", "This", "That", "These", "Those", "There"})


def _acknowledge(text: str) -> str:
    """The statement restated in the second person ("My name is Ada." → "Noted: your name is Ada."): up to
    :data:`NOTED_SENTENCES` sentences, greetings and thanks left out."""
    sentences: list[str] = []
    for piece in split_sentences(text):
        sentence = piece.strip()
        if not sentence or _GREETING_RE.match(sentence) or _THANKS_RE.match(sentence):
            continue
        sentence = _REMEMBER_RE.sub("", _GREETING_LEAD_RE.sub("", sentence)).strip(" .!")
        if sentences and sentence.split(" ", 1)[0] in _JOINED_LOWERCASE:  # "; he said", not "; He said"
            sentence = sentence[0].lower() + sentence[1:]
        if sentence:
            sentences.append(sentence)
    if not sentences:
        return WELCOME if _THANKS_RE.search(text) or "thank" in text.lower() else GREETING
    fact = "; ".join(sentences[:NOTED_SENTENCES])
    fact = _FIRST_PERSON_RE.sub(lambda match: _SECOND_PERSON[" ".join(match.group().lower().split())], fact)
    return f"Noted: {_clip(fact, QUOTE_WORDS)}."


def _clip(text: str, words: int) -> str:
    """``text`` cut to at most ``words`` words, with an ellipsis."""
    parts = text.split()
    return text.strip() if len(parts) <= words else " ".join(parts[:words]) + "…"
