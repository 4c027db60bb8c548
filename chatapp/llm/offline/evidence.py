"""What the offline engine may quote, with content words for matching a question: knowledge-base passages and
sentences of user messages, the summary and the recall block (key facts are answered, not quoted). Pure."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from chatapp.llm.offline.blocks import message_blocks, recall_items
from chatapp.llm.prompts import NO_PASSAGES_FOUND
from memory.api import split_sentences

Message = dict[str, Any]
# System prompts whose passages are remembered (each a few kilobytes).
PASSAGES_CACHE_ENTRIES = 128


def plain_text(content: Any) -> str:
    """The text of a message ``content``: a string, None, or a list of ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


_WORD_RE = re.compile(r"[^\W_]+")


_PARAGRAPH_SPLIT_RE = re.compile(r"\n\s*\n")


_LINE_LABEL_RE = re.compile(r"^(?:-\s+)?(?:(?:User|Assistant|System|Tool)(?:\s*\[[^\]]*\])?\s*:\s*)?")


# A recalled tool result starts with its call: "kb_search({...}) -> " (memory.recall, the index).
_TOOL_HEADER_RE = re.compile(r"^[A-Za-z_][\w.-]*(?:\(.*?\))?\s*->\s*", re.S)


# A summary line the assistant wrote ("- Assistant [tools: kb_search]: ..."): never quoted back as a fact.
_ASSISTANT_LINE_RE = re.compile(r"^(?:-\s+)?Assistant(?:\s*\[[^\]]*\])?\s*:")


# Words asking for an identifier ("booking reference"); a non-kb sentence with an identifier-like value has them.
ID_WORDS = frozenset({"id", "ids", "number", "numbers", "code", "codes", "reference", "identifier", "no"})


# 4+ characters with a digit and letters or "-#_./" ("ACC-7731", "#W2378156"), or 3+ digits.
_IDENTIFIER_RE = re.compile(r"(?<![\w#-])#?(?=[\w./-]*\d)[A-Za-z0-9][\w./-]{2,}[A-Za-z0-9](?![\w-])|\b\d{3,}\b")


_HEADER_RE = re.compile(r"^\[(?:Memory Summary|Raw archive)\b|^\[\d+ earlier archived messages omitted\]")


# A passage opens with a "[n] <title>" line (chatapp.kb.search.passages_format).
_PASSAGE_HEAD_RE = re.compile(r"^\[\d+\][ \t]+(?P<title>[^\n]+)$", re.M)


# A short line without closing punctuation inside a passage is a Markdown heading.
_HEADING_MAX_WORDS = 8


_CLOSING_PUNCTUATION = (".", "!", "?", ":", ";", ")", "\u201d", '"')


# Function words, greetings and question filler ("how much ... does ... include"): not what a question is about.
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "i",
        "me",
        "my",
        "mine",
        "myself",
        "you",
        "your",
        "yours",
        "we",
        "our",
        "us",
        "he",
        "she",
        "him",
        "her",
        "his",
        "it",
        "its",
        "they",
        "them",
        "their",
        "what",
        "whats",
        "which",
        "who",
        "whom",
        "whose",
        "when",
        "where",
        "why",
        "how",
        "do",
        "does",
        "did",
        "done",
        "can",
        "could",
        "would",
        "should",
        "will",
        "shall",
        "may",
        "might",
        "must",
        "have",
        "has",
        "had",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "from",
        "by",
        "with",
        "about",
        "into",
        "and",
        "or",
        "but",
        "not",
        "no",
        "yes",
        "this",
        "that",
        "these",
        "those",
        "there",
        "here",
        "please",
        "tell",
        "remind",
        "know",
        "remember",
        "recall",
        "say",
        "said",
        "again",
        "so",
        "if",
        "then",
        "than",
        "as",
        "just",
        "any",
        "some",
        "all",
        "let",
        "lets",
        "s",
        "t",
        "d",
        "ll",
        "re",
        "ve",
        "m",
        "also",
        "still",
        "now",
        "ok",
        "okay",
        "much",
        "many",
        "include",
        "includes",
        "included",
        "including",
        "get",
        "gets",
        "got",
        "give",
        "gives",
        "hello",
        "hi",
        "hey",
        "thanks",
        "thank",
        "kind",
        "sort",
    ]
)


Source = Literal["kb", "conversation", "summary", "recall"]


SOURCE_LABELS: dict[Source, str] = {
    "kb": "From the knowledge base:",
    "conversation": "From our conversation:",
    "summary": "From the conversation summary:",
    "recall": "From an earlier message:",
}


KB_SECTION_LABEL = "From the knowledge base ({section}):"
# A reply writes a recalled message's id as the page does (``#12``), not as the block does (``msg 12``).
RECALL_LABEL = "From an earlier message ({where}):"
_BLOCK_MESSAGE_ID = re.compile(r"\bmsg (\d+)\b")


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """A passage or one sentence. Per sentence: ``sections`` its heading (the title before the first, ``""``
    outside passages) and ``sentence_words`` its and its heading's content words; ``topic``: title and headings'."""

    source: Source
    sentences: tuple[str, ...]
    sections: tuple[str, ...]
    sentence_words: tuple[frozenset[str], ...]
    words: frozenset[str]
    topic: frozenset[str] = frozenset()
    title: str = ""
    where: str = ""

    def label(self, section: str, *, kb_label: str = KB_SECTION_LABEL) -> str:
        """The quote's introduction: a passage's document › ``section``, a recalled message's date and ``#id``."""
        if self.source == "kb":
            place = self.title if section in ("", self.title) else f"{self.title} › {section}"
            return kb_label.format(section=place) if place else SOURCE_LABELS["kb"]
        if self.source == "recall" and self.where:
            return RECALL_LABEL.format(where=_BLOCK_MESSAGE_ID.sub(r"#\1", self.where))
        return SOURCE_LABELS[self.source]


def context_evidence(context: list[Message]) -> list[Evidence]:
    """What the engine may quote, oldest first: the system prompt's passages (never its instructions), summary and
    recall sentences (not the assistant's), tool results (not a search that found nothing) and user messages; never
    its own replies or questions."""
    evidence: list[Evidence] = []
    for index, message in enumerate(context):
        role = message.get("role")
        text = plain_text(message.get("content"))
        if role not in ("system", "user", "tool"):
            continue
        if role == "system" and index == 0:
            evidence += _passages(text)
            continue
        if role == "tool":
            # A search that found nothing is no evidence of anything, as a model would read it.
            if not text.strip().lower().startswith(NO_PASSAGES_FOUND):
                evidence += _passages(text) or _sentences("conversation", text)
            continue
        for block in message_blocks(text):
            if block.kind == "summary":
                evidence += _sentences("summary", block.text)
            elif block.kind == "recall":
                for item in recall_items(block.text):
                    if item.role == "tool":
                        body = _TOOL_HEADER_RE.sub("", item.text, count=1)
                        evidence += _passages(body) or _sentences("recall", body, where=item.where)
                    elif item.role == "user":
                        evidence += _sentences("recall", item.text, where=item.where)
            elif block.kind == "text":
                evidence += _sentences("conversation", block.text)
    return evidence


def passage_evidence(text: str) -> list[Evidence]:
    """The ``[n] title`` passages of a ``kb_search`` result or quick-answer prompt; none without such a block."""
    return _passages(text)


def _passages(text: str) -> list[Evidence]:
    """Cached per text: the same system prompt recurs across turns, and evidence is immutable."""
    return list(_passages_of(text))


@lru_cache(maxsize=PASSAGES_CACHE_ENTRIES)
def _passages_of(text: str) -> tuple[Evidence, ...]:
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
            for sentence in split_sentences(paragraph):
                if sentence:
                    sentences.append((sentence, section, heading_words | content_words(sentence)))
        if sentences:
            passages.append(
                Evidence(
                    source="kb",
                    title=title,
                    sentences=tuple(sentence for sentence, _, _ in sentences),
                    sections=tuple(section for _, section, _ in sentences),
                    sentence_words=tuple(words for _, _, words in sentences),
                    words=frozenset(topic.union(*(words for _, _, words in sentences))),
                    topic=frozenset(topic),
                )
            )
    return tuple(passages)


def _is_heading(paragraph: str) -> bool:
    return 0 < len(paragraph.split()) <= _HEADING_MAX_WORDS and not paragraph.endswith(_CLOSING_PUNCTUATION)


def _sentences(source: Source, text: str, *, where: str = "") -> list[Evidence]:
    """One piece per factual sentence, line labels removed; a sentence with an identifier-like value also has
    the :data:`ID_WORDS` ("account id" meets "account ACC-7731")."""
    evidence: list[Evidence] = []
    for line in text.splitlines():
        if source == "summary" and _ASSISTANT_LINE_RE.match(line.strip()):
            continue
        for piece in split_sentences(_LINE_LABEL_RE.sub("", line.strip())):
            sentence = piece.strip()
            if sentence and not sentence.endswith("?") and not _HEADER_RE.match(sentence):
                words = frozenset(content_words(sentence))
                if _IDENTIFIER_RE.search(sentence):
                    words |= _ID_STEMS
                evidence.append(
                    Evidence(
                        source=source,
                        sentences=(sentence,),
                        sections=("",),
                        sentence_words=(words,),
                        words=words,
                        where=where,
                    )
                )
    return evidence


def evidence_score(item: Evidence, wanted: set[str]) -> tuple[int, int]:
    """``(words of the question in the evidence, most of them in one of its sentences)``."""
    return len(wanted & item.words), max(len(wanted & words) for words in item.sentence_words)


def words_needed(wanted: set[str]) -> int:
    """How many of the question's words evidence must cover: most of them (60 %), at most 3."""
    return min(3, math.ceil(0.6 * len(wanted)))


def evidence_quote(item: Evidence, wanted: set[str]) -> tuple[str, str]:
    """``(sentence, section)`` to quote: most question words the headings do not already say, then most question
    words, then the earliest."""

    def rank(index: int) -> tuple[int, int, int]:
        found = wanted & item.sentence_words[index]
        return len(found - item.topic), len(found), -index

    best = max(range(len(item.sentences)), key=rank)
    return item.sentences[best], item.sections[best]


def content_words(text: str) -> set[str]:
    """Lower-cased words of ``text`` without stop words, with plural endings folded."""
    stems = (_stem(word) for word in word_list(text) if word not in STOPWORDS)
    return {stem for stem in stems if stem not in STOPWORDS}


def word_list(text: str) -> list[str]:
    return [word.lower() for word in _WORD_RE.findall(text)]


def _stem(word: str) -> str:
    """``word`` with a plural ending and a final "e" folded ("copies" -> "copy", "caches" -> "cach")."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("sses", "xes", "ches", "shes")):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


# The content words of ID_WORDS, as sentences are matched on them (after content_words exists).
_ID_STEMS = frozenset(content_words(" ".join(sorted(ID_WORDS))))
