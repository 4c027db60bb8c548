"""What the offline engine answers: pure, deterministic functions of a chat request.

No randomness, no clock, no I/O. The engine can only use what is in the request, so it answers
from the visible context (system prompt, key-facts block, summary block, recall block, earlier
user messages, tool results; :mod:`chatapp.llm.offline.blocks`): a fact that memory compression
dropped is visibly forgotten (docs/memory.md §6), and one the memory kept is visibly remembered.

Decision order for one request:

1. a summarizer prompt (it carries a ``<transcript>`` section) gets an extractive summary, and
   a key-facts extraction prompt (it carries ``<new_messages>``) the JSON facts of
   :mod:`chatapp.llm.offline.facts`;
2. trailing tool results get a text answer: a calculator's result; for ``kb_search``, the
   sentences of the passages that answer the user's question (or, for an explicit "search …",
   the top passage), else what the user said that answers it, else an honest "not found";
3. a user message asking to search (when ``kb_search`` is offered) or to compute (when
   ``calculator`` is offered) gets one tool call; a request to compute without the calculator
   (quick answer) is told that quick answer has none and that agent mode has;
4. a question is answered from the key facts ("Your account id is ACC-7731 (from the key
   facts)."), else by quoting the evidence that best overlaps it -- knowledge-base passages,
   earlier user messages, the summary and recall blocks, each labelled with its source, never
   the system prompt's instructions; when ``kb_search`` is offered (agent mode) only evidence
   that answers the question outright is quoted and anything else gets a ``kb_search`` call;
   without it, a question nothing answers gets "not found";
5. a greeting is greeted, thanks are acknowledged, and anything else is noted, restating its
   facts in the second person ("Noted: your name is Ada, account ACC-7731.").
"""

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
# Quick answer offers no tools, and the engine answers only from what it can quote (docs/memory.md
# §6): it does not compute arithmetic itself, it says where the calculator is.
NO_CALCULATOR = (
    "Quick answer has no calculator, and I only answer from what I can quote, so I don't compute “{expression}”."
    " Switch this chat to agent mode: its calculator tool does."
)


@dataclass(frozen=True, kw_only=True)
class OfflineReply:
    """Either ``text`` or ``tool_calls`` (OpenAI format), never both."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finish_reason(self) -> Literal["stop", "tool_calls"]:
        return "tool_calls" if self.tool_calls else "stop"


def summary_prompt(messages: list[Message]) -> str | None:
    """The last message's text when it is a summarizer prompt."""
    if not messages or messages[-1].get("role") != "user":
        return None
    content = plain_text(messages[-1].get("content"))
    return content if ExtractiveSummarizer.is_prompt(content) else None


def is_summarizer_request(messages: list[Message]) -> bool:
    """Whether a request is for the summarizer model: a summary prompt or a key-facts
    extraction prompt (the environment variables ``OFFLINE_FAIL_SUMMARY`` and
    ``OFFLINE_SUMMARY_DELAY`` apply to it)."""
    return summary_prompt(messages) is not None or is_extraction_request(messages)


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
    prompt = summary_prompt(messages)
    if prompt is not None:
        return OfflineReply(text=ExtractiveSummarizer.reply(prompt, max_tokens=summary_max_tokens) or "")
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


# --- answers from tool results ---------------------------------------------------------------


def _answer_tool_results(messages: list[Message]) -> str:
    """One answer per trailing tool result. A ``kb_search`` made for a question (not for an
    explicit "search …") is answered from the passages that answer the question, or honestly
    not at all; other results are quoted."""
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
    """The answer to an explicit "search …": the sentences of the passage that best match the
    ``query`` (as for a question), else the best sentence of the top passage, labelled "The
    knowledge base says (<document> › <section>):"."""
    wanted = _question_words(query)
    found = _quote(passages, wanted, kb_label=KB_SAYS)
    if found is not None:
        return found
    sentence, section = evidence_quote(passages[0], wanted)
    return f"{passages[0].label(section, kb_label=KB_SAYS)} “{_clip(sentence, QUOTE_WORDS)}”"


def _without_question(messages: list[Message]) -> list[Message]:
    """``messages`` without the words of the last user message (the question being answered,
    never evidence for itself), keeping the memory blocks merged into it as context."""
    for position in range(len(messages) - 1, -1, -1):
        if messages[position].get("role") == "user":
            _, merged = question_and_blocks(plain_text(messages[position].get("content")))
            blocks = [{"role": "user", "content": block.text} for block in merged]
            return [*messages[:position], *blocks, *messages[position + 1 :]]
    return messages


def _current_user_words(messages: list[Message]) -> str:
    """The words of the last user message of ``messages`` (the current turn's question), without
    memory blocks merged into it; ``""`` when there is none."""
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


# --- questions ---------------------------------------------------------------------------------

_QUESTION_START_RE = re.compile(
    r"^(?:what|what's|who|who's|whom|whose|where|when|why|how|which|do|does|did|is|are|was|were|can|could|"
    r"would|should|will|have|has|tell\s+me|remind\s+me|recall)\b",
    re.I,
)
_ABOUT_THE_USER_RE = re.compile(r"\b(?:my|mine|myself|our|ours)\b", re.I)
# "how long", "how often": the second word says what kind of answer is wanted, not its topic.
_HOW_MEASURE_RE = re.compile(r"\bhow\s+(?:long|often|far|soon)\b", re.I)
# Words of a question that say nothing about what is asked: the filler of questions about the
# conversation, and verbs that only link the asker to the topic ("What encryption do you use?",
# "Which plans do you offer?"), which a passage on the topic rarely repeats.
_QUESTION_FILLER = frozenset(
    content_words(
        "gave given told mentioned earlier before previously already currently actually"
        " use used uses using offer offers offered provide provides provided"
    )
)


def _question_of(text: str) -> str | None:
    """The question ``text`` asks, or None when it asks none: its sentences ending with "?"
    (greetings and statements around them left out), else the whole text when it opens with a
    question word ("Is my data encrypted", "Tell me about …")."""
    sentences = [s for s in split_sentences(text) if not _GREETING_RE.match(s)]
    asked = [sentence for sentence in sentences if sentence.endswith("?")]
    if asked:
        return " ".join(asked)
    if sentences and _QUESTION_START_RE.match(sentences[0]):
        return " ".join(sentences)
    return None


def _question_words(question: str) -> set[str]:
    """The content words of ``question`` that say what it is about (:func:`content_words`
    without the filler of questions about the conversation, "gave", "earlier", "how long")."""
    return content_words(_HOW_MEASURE_RE.sub("how", question)) - _QUESTION_FILLER


def _not_found(question: str, *, searched: bool = False) -> str:
    """The honest answer when nothing in the request (and, ``searched``, nothing the knowledge
    base search returned) answers ``question``, naming what was looked for."""
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
    """The answer to ``question`` from what ``context`` holds, or None when nothing answers it.

    In this order: a fact of the key-facts block (:func:`answer_from_facts`); else the evidence
    (:func:`context_evidence`) that shares the most content words with the question, quoted with
    its source ("From the conversation summary: “…”", "From an earlier message (2024-05-20,
    #12): “…”", "From the knowledge base (Kestrel Sync plans and pricing › Free plan): “…”").

    Evidence must cover most of the question's content words (60 %, at most 3 needed), so that
    "favourite colour" is not answered with "favourite food" once the colour was forgotten; a
    passage counts its title and headings, but must also have a sentence with one of the words
    (its heading's count), which is what gets quoted. A question about the user ("my", "our") is
    answered from the conversation, the summary and recall first; the knowledge base answers it
    only when the question has two or more content words and one passage holds them all ("Is my
    data encrypted?" yes, "What's my name?" never from a passage about device names). Ties go to
    the evidence with the best sentence, then to what the user said (conversation, summary,
    recall: the two most recent, oldest first, so a later correction comes last), then to the
    best-ranked passage (first in the prompt). A question with no content word gets a request
    to rephrase.

    ``complete`` (agent mode, where the knowledge base can still be searched): only evidence
    that answers the question outright may be quoted (:func:`_covers`); anything less is left to
    a ``kb_search``, so that a passage an earlier search brought in ("Deleted files stay in the
    trash … on Free and Personal plans …") never answers a new question it merely shares words
    with ("Is there a free plan?").
    """
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
    """Whether ``item`` answers a question about ``wanted`` outright: one of its sentences holds
    every one of the words (its heading's count), and for a knowledge-base passage that
    sentence's heading (the document title before the first heading) names one of them, so the
    passage is about what is asked, not about something that mentions it."""
    return any(
        wanted <= words and (item.source != "kb" or bool(wanted & content_words(section)))
        for words, section in zip(item.sentence_words, item.sections, strict=True)
    )


def _answer_from_memory(question: str, context: list[Message]) -> str | None:
    """The quote of what the user said (the conversation, the summary, the recall block) that
    answers ``question`` by the rules of :func:`_answer_question`, or None: the agent's answer
    when its ``kb_search`` found nothing better. Knowledge-base passages from earlier searches
    are left out: the knowledge base was just asked this very question."""
    wanted = _question_words(question)
    if not wanted:
        return None
    return _quote([item for item in context_evidence(context) if item.source != "kb"], wanted)


def _answer_from_passages(question: str, passages: list[Evidence]) -> str | None:
    """The quote of the knowledge-base ``passages`` that answers ``question``, with the rules of
    :func:`_answer_question` (a question about the user needs every one of 2+ words in one
    passage), or None."""
    wanted = _question_words(question)
    if not wanted:
        return None
    if _ABOUT_THE_USER_RE.search(question):
        if len(wanted) < 2:
            return None
        passages = [item for item in passages if wanted <= item.words]
    return _quote(passages, wanted)


def _quote(evidence: list[Evidence], wanted: set[str], *, kb_label: str = KB_SECTION_LABEL) -> str | None:
    """The quote of the best-matching ``evidence`` (see :func:`_answer_question`), or None;
    ``kb_label`` introduces a passage (``{section}``: its document and section)."""
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
    """``[(sentence, section)]`` to quote from ``item``: its best sentence
    (:func:`evidence_quote`), and for a passage a second sentence of the same section when the
    first misses question words that the second has ("Is my data encrypted?": the sentence on
    encryption, then the one on the data)."""
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


# --- statements ----------------------------------------------------------------------------------

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
# How many sentences of a statement the acknowledgement restates.
NOTED_SENTENCES = 2


def _answer_statement(text: str, context: list[Message]) -> str:
    """The reply to a message that asks no question: a greeting for a greeting, "You're
    welcome." for thanks; without a ``kb_search`` tool (quick-answer mode), a request to search
    is answered from the retrieved passages in the context; anything else is noted
    (:func:`_acknowledge`)."""
    if not text:
        return "I received an empty message."
    if _GREETING_RE.match(text):
        return GREETING
    if _THANKS_RE.match(text):
        return WELCOME
    if (query := search_query(text)) is not None:
        return _answer_question(query, context) or _not_found(query)
    return _acknowledge(text)


# Words that start a later noted sentence in lowercase once it follows "; " (names stay as typed).
_JOINED_LOWERCASE = frozenset({"He", "She", "It", "They", "We", "This", "That", "These", "Those", "There"})


def _acknowledge(text: str) -> str:
    """Restate the statement as facts about the user, in the second person, leaving out
    greetings and thanks: "Hi! My name is Ada, account ACC-7731." is noted as "Noted: your name
    is Ada, account ACC-7731."; at most :data:`NOTED_SENTENCES` sentences, joined by "; "."""
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
    """``text`` cut to at most ``words`` words, marking the cut with an ellipsis."""
    parts = text.split()
    return text.strip() if len(parts) <= words else " ".join(parts[:words]) + "…"
