"""Recall: verbatim earlier messages brought back into a request because they match the current
question (docs/memory.md §12).

This module is pure (no ORM, no I/O): the values recall works with (:class:`RecallItem`,
:class:`RecallCandidate`), the :class:`Embedder` port, and how a stored message is cut into
indexed pieces (:func:`split_for_index`). The index itself lives in the database
(:class:`memory.models.MemoryItem`, :func:`memory.services.recall_candidates`).
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal, Protocol

from memory.tokens import TokenCounter

if TYPE_CHECKING:
    import numpy as np

EmbedKind = Literal["query", "passage"]

# Largest piece of a message that is indexed as one item, in tokens (docs/memory.md §12).
INDEX_PIECE_TOKENS = 120
# Tokens of a tool call's arguments kept in the header of each piece of its result.
CALL_ARGS_TOKENS = 40
# Tokens left for a piece of a tool result however long its header is.
MIN_BODY_TOKENS = 40

# Sentence ends: ASCII .!? before whitespace (so "A-1.5" or "example.com" stay whole), the CJK
# full stops 。！？ and the full-width semicolon ；, each with closing quotes or brackets, and line
# breaks (docs/memory.md F-39). A piece is a verbatim slice packed up to a token budget, so a cut
# after an abbreviation leaves out nothing; the summarizer's rule (memory.sentences) skips those.
_SENTENCE_END_RE = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s)|[。！？；]+[」』”’）)]*|\n")
# Clause breaks inside an over-long sentence: commas, colons, semicolons, ideographic commas.
_CLAUSE_END_RE = re.compile(r"[,;:](?=\s)|[，、：；]|\s")


@dataclass(frozen=True, kw_only=True)
class RecallItem:
    """One indexed piece of a stored message (a :class:`memory.models.MemoryItem` row).

    ``id``: the row's primary key; ``memory_key``: its conversation; ``chat_title``: that
    conversation's title (``""`` when the owning app has not filled it); ``message_ids``: the
    stored messages it comes from, oldest first (a tool result: its call's message and itself);
    ``role``: ``user``, ``assistant`` or ``tool``; ``text``: the piece, verbatim (a tool result as
    ``name(arguments) -> result``); ``tokens``: its size in tokens; ``created_at``: when its
    newest message was stored (aware datetime).
    """

    id: int
    memory_key: str
    chat_title: str
    message_ids: tuple[int, ...]
    role: str
    text: str
    tokens: int
    created_at: datetime


@dataclass(frozen=True, kw_only=True)
class RecallCandidate:
    """An item that may be recalled for one query, with what the search found.

    ``lexical_rank``: its place in the full-text hits (1 = best), None when the full-text search
    did not find it; ``cosine``: the cosine similarity of its embedding to the query's (-1..1),
    None when there is no embedder or the item has no embedding; ``identifier_match``: the query
    holds an identifier (an id, email or phone number by :func:`memory.facts.rule_facts`) that
    occurs verbatim in the item's text.
    """

    item: RecallItem
    lexical_rank: int | None
    cosine: float | None
    identifier_match: bool


class Embedder(Protocol):
    """Turns texts into vectors for recall (docs/memory.md §12, "embeddings").

    ``model``: the model's name, stored with each embedding (vectors of different models are never
    compared); ``dimension``: the length of each vector. ``await embed(texts, kind=...)`` returns a
    float32 array of shape ``(len(texts), dimension)`` whose rows are L2-normalised (so a dot
    product is the cosine); ``kind`` is ``query`` for a search query and ``passage`` for an
    indexed text (e5 models prefix them differently). Raises any exception on failure (the
    callers degrade to lexical-only search).
    """

    model: str
    dimension: int

    async def embed(self, texts: list[str], *, kind: EmbedKind) -> np.ndarray: ...


def message_text(content: Any) -> str:
    """The text of a stored message's ``content``: a string as it is, the ``text`` parts of a
    list of content parts joined by spaces, ``""`` for None."""
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _call_header(call: dict[str, Any], counter: TokenCounter) -> str:
    """``name(arguments) -> `` of a tool call, its arguments cut to :data:`CALL_ARGS_TOKENS`."""
    function = call.get("function") or {}
    name = str(function.get("name") or "tool")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False) if arguments is not None else ""
    if counter.count_text(arguments) > CALL_ARGS_TOKENS:
        arguments = _prefix_within(arguments, CALL_ARGS_TOKENS, counter).rstrip() + "…"
    return f"{name}({arguments}) -> "


def _prefix_within(text: str, max_tokens: int, counter: TokenCounter) -> str:
    """The longest prefix of ``text`` (whole characters, at least one) of at most ``max_tokens``
    tokens, found by bisection on the character count (no token spans more than 32 characters
    in practice, so longer prefixes are not tried: a huge text costs no more than a short one)."""
    low, high = 1, min(len(text), max(1, max_tokens) * 32)
    while low < high:
        middle = (low + high + 1) // 2
        if counter.count_text(text[:middle]) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def _spans(text: str, pattern: re.Pattern[str]) -> list[str]:
    """``text`` cut after each match of ``pattern``; the pieces joined give ``text`` back."""
    pieces, start = [], 0
    for match in pattern.finditer(text):
        if match.end() > start:
            pieces.append(text[start : match.end()])
            start = match.end()
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def _pack(parts: list[str], max_tokens: int, counter: TokenCounter, *, finer: list[re.Pattern[str]]) -> list[str]:
    """Consecutive ``parts`` joined greedily into pieces of at most ``max_tokens`` tokens; a part
    that alone is larger is cut by the next pattern of ``finer``, and when none is left, into
    prefixes of whole characters. Joined, the pieces give the parts back."""
    pieces: list[str] = []
    current = ""
    for part in parts:
        if counter.count_text(current + part) <= max_tokens:
            current += part
            continue
        if current:
            pieces.append(current)
            current = ""
        if counter.count_text(part) <= max_tokens:
            current = part
        elif finer:
            pieces.extend(_pack(_spans(part, finer[0]), max_tokens, counter, finer=finer[1:]))
        else:
            while part:
                head = _prefix_within(part, max_tokens, counter)
                pieces.append(head)
                part = part[len(head) :]
    if current:
        pieces.append(current)
    return pieces


def split_for_index(
    message: dict[str, Any],
    *,
    counter: TokenCounter,
    max_tokens: int = INDEX_PIECE_TOKENS,
    call: dict[str, Any] | None = None,
) -> list[str]:
    """The pieces of one stored message that recall indexes (docs/memory.md §12, "the index").

    ``message``: a stored message as a dict with ``role``, ``content`` (str, content parts or
    None) and, for a tool result, ``name``; ``call``: for a tool result, the assistant's tool call
    it answers (``{"function": {"name", "arguments"}}``). A user or assistant message gives its
    text, or ``name: text`` when the message names its speaker (OpenAI ``name``, e.g. a replayed
    conversation between two people: a question about one of them then finds what they said); a
    tool result gives ``name(arguments) -> result`` (arguments cut to
    :data:`CALL_ARGS_TOKENS` tokens), the header repeated on every piece so each stands alone.
    Other roles (system), and messages without text (an assistant message that only calls tools:
    its calls are indexed with their results), give ``[]``.

    A text of at most ``max_tokens`` tokens (:class:`memory.tokens.TokenCounter`) is one piece;
    a longer one is cut into consecutive pieces of at most ``max_tokens`` tokens at sentence ends
    (``.!?`` before whitespace, ``。！？；``, line breaks), an over-long sentence at clause
    breaks or spaces, else between characters. Pieces are verbatim slices of the text, stripped of
    surrounding whitespace; empty ones are dropped. Never raises.
    """
    role = message.get("role")
    if role not in ("user", "assistant", "tool"):
        return []
    text = message_text(message.get("content")).strip()
    if not text:
        return []
    header = ""
    speaker = str(message.get("name") or "").strip() if role in ("user", "assistant") else ""
    if speaker:
        header = f"{speaker}: "
    if role == "tool":
        named = {"function": {"name": message.get("name") or "tool", "arguments": ""}}
        header = _call_header(call or named, counter) if call is not None else f"{named['function']['name']} -> "
    budget = max(max_tokens - counter.count_text(header), MIN_BODY_TOKENS if header else 1)
    if counter.count_text(text) <= budget:
        return [header + text]
    pieces = _pack(_spans(text, _SENTENCE_END_RE), budget, counter, finer=[_CLAUSE_END_RE])
    return [header + piece.strip() for piece in pieces if piece.strip()]


# --- Ranking: admission gate, fusion, decay, budget (docs/memory.md §12) ---------------------

# The recall block's first line (docs/memory.md §12, "the block").
RECALL_HEADER = "[Recalled from earlier — verbatim, may be outdated]"
# Reciprocal-rank fusion constant and the weight of the dense side (docs/memory.md §12).
RRF_K = 60
DENSE_WEIGHT = 0.5
# Floored time decay: floor + (1 - floor) * 0.5 ** (age_days / half_life_days) (SPEC §10).
DECAY_FLOOR = 0.9
DECAY_HALF_LIFE_DAYS = 90.0
# Most items in one recall block, and most rejected candidates reported to the inspector.
RECALL_MAX_ITEMS = 12
RECALL_MAX_REJECTED = 5
# Context around what was recalled (docs/memory.md §12, "context"): of the best this many
# recalled items, those of the request's own chat bring the items next to them (the next one
# first, then the one before) while the budget has room. On LoCoMo: evidence in context 0.721 →
# 0.784 at 8,192 tokens and 0.684 → 0.738 at 4,096, foreign hits unchanged (docs/benchmarks.md).
RECALL_CONTEXT_ANCHORS = 3
# How far the line-by-line token sum may overshoot the budget before a block is counted exactly.
_NEAR_MISS_TOKENS = 8

_ROLE_LABELS = {"user": "User", "assistant": "Assistant", "tool": "Tool"}
# Words that carry no topic: left out of the terms a lexical match is measured on.
_STOP_WORDS = frozenset(
    """
    a about after again all also am an and any are as at be been before being both but by can could
    did do does doing done for from get got had has have having he her here hers him his how i if in
    into is it its itself just let like many me more most much my no not now of off on once only or
    other our ours out over own please said same say she should so some such tell than that the
    their theirs them then there these they this those through to too under until up us very was we
    were what when where which while who whom whose why will with would yes yet you your yours
    """.split()  # noqa: SIM905 (a word list, not a sentence)
)
# A run of CJK characters (Han, kana, Hangul): indexed as overlapping character pairs.
_CJK_RUN_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")
_WORD_RE = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)
# Letters and digits joined by - . / : (an order number, a loan id, a version): one term when it
# holds both a letter and a digit (docs/memory.md §12, "gate").
_JOINED_RE = re.compile(r"[^\W_]+(?:[-./:][^\W_]+)+", re.UNICODE)
_HAS_LETTER = re.compile(r"[^\W\d_]", re.UNICODE)
_HAS_DIGIT = re.compile(r"\d")


@dataclass(frozen=True, kw_only=True)
class RecallThresholds:
    """The admission gate's thresholds for one embedding model (docs/memory.md §12, "gate").

    ``model``: the embedding model they were calibrated for (``""``: no embedder); ``high``: a
    cosine at or above it admits alone; ``moderate``: a cosine at or above it admits together
    with a lexical hit (the full-text search found the item and it holds at least
    ``moderate_share`` of the query's content terms); both None when cosines of the model are not
    trusted for admission (they still rank). Without a usable cosine an item is admitted when it
    holds at least ``lexical_share`` of the query's content terms and at least ``lexical_terms``
    of them (:func:`lexical_overlap`). When the owner's term frequencies are known
    (:class:`TermRarity`), that count-based floor gives way to the rarity floor: the matched terms'
    rarity weights (:meth:`TermRarity.weight`, 0..~1) sum to at least ``rarity_mass``, make at
    least ``rarity_share`` of the query's weight (``rarity_single_share`` when a single term
    matched: one word admits only when it is most of what the query asks about, so a name in a
    greeting does not), and at least ``rarity_relative`` of the best
    candidate's matched weight (:func:`rarity_overlap`). An exact identifier match always admits.
    ``dense_weight``: the weight of the dense rank in the fused score (:func:`rrf`), lower for a
    model whose cosines rank poorly.
    Calibrated on LoCoMo by ``bench/recall_calibrate.py`` (count floor) and
    ``bench/locomo_recall.py`` (rarity floor, docs/benchmarks.md).
    """

    model: str
    high: float | None
    moderate: float | None
    moderate_share: float
    lexical_share: float
    lexical_terms: int
    rarity_mass: float = 0.8
    rarity_share: float = 0.2
    rarity_single_share: float = 0.5
    rarity_relative: float = 0.5
    dense_weight: float = DENSE_WEIGHT


# Without an embedder, or with a model nobody calibrated: the conservative lexical floor.
# On LoCoMo (bench/recall_calibrate.py): an evidence turn admitted for 48 % of the questions,
# 0.93 foreign turns admitted per question asked of another conversation.
LEXICAL_THRESHOLDS = RecallThresholds(
    model="", high=None, moderate=None, moderate_share=1.0, lexical_share=0.4, lexical_terms=2
)
# Per embedding model name (docs/memory.md §12). e5 cosines are compressed (LoCoMo: evidence turns
# p50 0.80, other turns of the same conversation p50 0.80, another conversation's best turn p50
# 0.82), so a cosine alone admits only above every foreign turn seen (p99 0.86), and a moderate one
# admits lexical hits too thin for the floor: evidence for 52 % of the questions, 1.1 foreign.
RECALL_THRESHOLDS: dict[str, RecallThresholds] = {
    "multilingual-e5-small": RecallThresholds(
        model="multilingual-e5-small",
        high=0.88,
        moderate=0.82,
        moderate_share=0.25,
        lexical_share=0.4,
        lexical_terms=2,
    ),
}


def thresholds_for(model: str | None) -> RecallThresholds:
    """The gate's thresholds for embedding model ``model``: its calibrated entry of
    :data:`RECALL_THRESHOLDS`; for None (no embedder) or an uncalibrated model,
    :data:`LEXICAL_THRESHOLDS` (cosines then only rank, docs/memory.md §12)."""
    if model and model in RECALL_THRESHOLDS:
        return RECALL_THRESHOLDS[model]
    return replace(LEXICAL_THRESHOLDS, model=model or "")


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    """A light English suffix strip, the same on both sides of a comparison ("groups", "group";
    "painted", "paint"; "running", "run"; "shared", "share"; "families", "family"): one of
    ``'s ies ing ed es s`` off, then a last ``e`` dropped and a last ``y`` made ``i``. Words of
    three letters or fewer, and stems that would be shorter, stay as they are."""
    stem = word
    for suffix, keep in (("'s", ""), ("’s", ""), ("ies", "i"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) + len(keep) >= 3 and not word.endswith("ss"):
            stem = word[: len(word) - len(suffix)] + keep
            if suffix in ("ing", "ed") and len(stem) > 3 and stem[-1] == stem[-2] and stem[-1] not in "aeiouls":
                stem = stem[:-1]
            break
    if len(stem) > 3 and stem[-1] == "e":
        stem = stem[:-1]
    elif len(stem) > 3 and stem[-1] == "y":
        stem = stem[:-1] + "i"
    return stem


@lru_cache(maxsize=4096)
def content_terms(text: str) -> frozenset[str]:
    """The terms of ``text`` a lexical match is measured on (docs/memory.md §12, "gate"): an
    identifier-like token (letters and digits joined by ``-``, ``.``, ``/`` or ``:``, such as
    ``LN-4050`` or ``ZX-88213``) as one term in lower case, so ``LN-4049`` shares nothing with it;
    other words in lower case without English stop words and one-letter words, lightly stemmed
    (:func:`_stem`); and every pair of adjacent characters of a CJK run (a lone CJK character as
    itself). Pure, never raises; the terms of recent texts are remembered (recall sees the same
    items again)."""
    terms: set[str] = set()
    for run in _CJK_RUN_RE.findall(text):
        if len(run) == 1:
            terms.add(run)
        terms.update(run[i : i + 2] for i in range(len(run) - 1))
    lowered = _CJK_RUN_RE.sub(" ", text.lower())
    joined = [token for token in _JOINED_RE.findall(lowered) if _HAS_LETTER.search(token) and _HAS_DIGIT.search(token)]
    if joined:
        terms.update(joined)
        lowered = _JOINED_RE.sub(lambda m: " " if m.group(0) in joined else m.group(0), lowered)
    for word in _WORD_RE.findall(lowered):
        if len(word) > 1 and word not in _STOP_WORDS:
            terms.add(_stem(word))
    return frozenset(terms)


def lexical_overlap(query_terms: frozenset[str], text: str) -> tuple[int, float]:
    """How much of a query ``text`` holds: ``(matched, share)``, the number of ``query_terms``
    (:func:`content_terms` of the query) among the content terms of ``text``, and that number
    over ``len(query_terms)`` (0.0 for a query without content terms)."""
    if not query_terms:
        return 0, 0.0
    matched = len(query_terms & content_terms(text))
    return matched, matched / len(query_terms)


# An index smaller than this cannot tell a rare word from a common one (in two items, a word
# both hold is "common"): rarity is measured as if it had this many items, the missing ones
# holding none of the query's words (docs/memory.md §12, "gate").
RARITY_MIN_DOCUMENTS = 200


@dataclass(frozen=True, kw_only=True)
class TermRarity:
    """How rare the query's terms are in the owner's index (docs/memory.md §12, "gate"): a single
    rare word shared with an item (a name, a place) says more than several common ones.

    ``documents``: the number of items in the owner's index; ``frequencies``: content term
    (:func:`content_terms`) of the query → the number of those items holding it, as the
    database's full-text search counts them. A query term missing from ``frequencies`` counts as
    held by every item (weight 0: it cannot admit anything on its own).
    """

    documents: int
    frequencies: dict[str, int] = field(default_factory=dict)
    # Weights already computed (a request scores a few hundred candidates against the same terms).
    _weights: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _totals: dict[frozenset[str], float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def weight(self, term: str) -> float:
        """The rarity weight of ``term``: its BM25 inverse document frequency
        ``ln(1 + (N - n + 0.5) / (n + 0.5))`` over ``ln(1 + N)`` (n: its frequency; N:
        ``documents``, at least :data:`RARITY_MIN_DOCUMENTS`), so a term held by one item of many
        weighs about 1, one held by half of them about ``ln 2 / ln(1 + N)``, one no item holds a
        little over 1. Never raises."""
        cached = self._weights.get(term)
        if cached is None:
            total = max(self.documents, RARITY_MIN_DOCUMENTS)
            held = min(total, max(0, self.frequencies.get(term, total)))
            cached = self._weights[term] = math.log(1.0 + (total - held + 0.5) / (held + 0.5)) / math.log(1.0 + total)
        return cached

    def total_weight(self, terms: frozenset[str]) -> float:
        """The sum of :meth:`weight` over ``terms`` (remembered per set of terms)."""
        cached = self._totals.get(terms)
        if cached is None:
            cached = self._totals[terms] = sum(self.weight(term) for term in terms)
        return cached


def rarity_overlap(query_terms: frozenset[str], text: str, rarity: TermRarity) -> tuple[float, float]:
    """How much of a query ``text`` holds, by rarity: ``(mass, share)``, the sum of
    :meth:`TermRarity.weight` over the ``query_terms`` (:func:`content_terms` of the query) that
    ``text`` holds, and that sum over the weight of all of ``query_terms`` (0.0 when that is 0)."""
    if not query_terms:
        return 0.0, 0.0
    matched = query_terms & content_terms(text)
    mass = sum(rarity.weight(term) for term in matched)
    total = rarity.total_weight(query_terms)
    return mass, (mass / total if total > 0 else 0.0)


def admit(
    candidate: RecallCandidate,
    *,
    query_terms: frozenset[str],
    thresholds: RecallThresholds,
    rarity: TermRarity | None = None,
    best_mass: float = 0.0,
) -> tuple[bool, str]:
    """The admission gate for one candidate (docs/memory.md §12, "gate"; SPEC F-33): whether it
    may be recalled, and why, as a short text for the inspector.

    Refused first: a user or assistant item whose content terms are all in ``query_terms`` (it
    only repeats the question, e.g. the same question asked in another chat). Admitted, in this
    order: an exact identifier match; a cosine ≥ ``thresholds.high``; the
    lexical floor; a cosine ≥ ``moderate`` with a lexical hit (the full-text search found the
    item, ``lexical_rank`` not None, and it holds at least ``moderate_share`` of
    ``query_terms``; with ``rarity``, its matched weight also at least ``rarity_relative`` of
    ``best_mass``). The lexical floor is, with ``rarity`` (the owner's term frequencies), the
    rarity floor: the weight of the query terms the item holds (:func:`rarity_overlap`) at least
    ``rarity_mass``, at least ``rarity_share`` of the query's weight (``rarity_single_share``
    when it holds only one of them) and at least
    ``rarity_relative`` of ``best_mass`` (the best candidate's matched weight for this query);
    without ``rarity``, the count floor: at least ``lexical_terms`` of ``query_terms`` (or all
    of them when the query has fewer) and at least ``lexical_share`` of them. Cosines count only
    when ``thresholds`` has them (a calibrated model). Returning nothing is a valid answer:
    sharing a common word is never enough on its own. ``query_terms``: :func:`content_terms` of
    the query. Never raises.
    """
    if candidate.item.role != "tool" and content_terms(candidate.item.text) <= query_terms:
        # An earlier asking of the same question (or a bare restatement) tells the model nothing
        # new, and in the block it would crowd out what answers it.
        return False, "repeats the question: it holds nothing the question does not say"
    if candidate.identifier_match:
        return True, "identifier match"
    matched, share = lexical_overlap(query_terms, candidate.item.text)
    words = f"{matched}/{len(query_terms)} query terms"
    cosine = candidate.cosine
    dense = cosine is not None and thresholds.high is not None and thresholds.moderate is not None
    if dense and cosine is not None and thresholds.high is not None and cosine >= thresholds.high:
        return True, f"cosine {cosine:.3f} ≥ {thresholds.high:.2f}"
    # With rarity, a lexical hit must also be at least rarity_relative of the best one.
    strong_enough = True
    if rarity is not None:
        mass, mass_share = rarity_overlap(query_terms, candidate.item.text, rarity)
        strong_enough = mass >= thresholds.rarity_relative * best_mass
        weighed = f"{words}, rarity {mass:.2f} ({mass_share:.0%} of the query's)"
        needed_share = thresholds.rarity_share if matched > 1 else thresholds.rarity_single_share
        if matched > 0 and mass >= thresholds.rarity_mass and mass_share >= needed_share and strong_enough:
            return True, f"lexical: {weighed}"
        floor = (
            f"{weighed}, needs {thresholds.rarity_mass:.2f}, {needed_share:.0%} and "
            f"{thresholds.rarity_relative:.0%} of the best {best_mass:.2f}"
        )
    else:
        if matched >= min(thresholds.lexical_terms, len(query_terms)) > 0 and share >= thresholds.lexical_share:
            return True, f"lexical: {words}"
        floor = f"{words}, needs {thresholds.lexical_share:.0%}"
    if not dense or cosine is None or thresholds.moderate is None:
        return False, f"lexical: only {floor}"
    if cosine < thresholds.moderate:
        return False, f"cosine {cosine:.3f} < {thresholds.moderate:.2f}; {floor}"
    if candidate.lexical_rank is not None and matched > 0 and share >= thresholds.moderate_share:
        if strong_enough:
            return True, f"cosine {cosine:.3f} ≥ {thresholds.moderate:.2f} and lexical hit ({words})"
        return False, f"cosine {cosine:.3f} ≥ {thresholds.moderate:.2f} but a weak lexical hit ({floor})"
    return False, f"cosine {cosine:.3f} ≥ {thresholds.moderate:.2f} but no lexical hit ({words})"


def decay(age_days: float, *, floor: float = DECAY_FLOOR, half_life_days: float = DECAY_HALF_LIFE_DAYS) -> float:
    """The floored time decay ``floor + (1 - floor) * 0.5 ** (age_days / half_life_days)``
    (SPEC §10 "time decay", docs/memory.md §12): 1.0 for a new item, ``floor`` in the limit, so
    it breaks ties between similar matches and never filters. A negative age counts as 0.
    Raises ValueError for ``floor`` outside 0..1 or ``half_life_days`` ≤ 0."""
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"decay floor must be within 0..1, got {floor}")
    if half_life_days <= 0:
        raise ValueError(f"decay half-life must be positive, got {half_life_days}")
    return floor + (1.0 - floor) * 0.5 ** (max(0.0, age_days) / half_life_days)


def rrf(
    lexical_rank: int | None, dense_rank: int | None, *, k: int = RRF_K, dense_weight: float = DENSE_WEIGHT
) -> float:
    """Reciprocal-rank fusion of a lexical and a dense rank (1 = best, None = not found by that
    side): ``1/(k + lexical_rank) + dense_weight/(k + dense_rank)`` (docs/memory.md §12)."""
    lexical = 1.0 / (k + lexical_rank) if lexical_rank is not None else 0.0
    dense = dense_weight / (k + dense_rank) if dense_rank is not None else 0.0
    return lexical + dense


@dataclass(frozen=True, kw_only=True)
class ScoredCandidate:
    """A candidate with the parts of its score, as the inspector shows them.

    ``dense_rank``: its place among the candidates by cosine (1 = best, equal cosines share a
    rank; None without a cosine);
    ``rrf``: :func:`rrf` of its lexical and dense ranks; ``decay``: :func:`decay` of its age;
    ``score``: ``rrf * decay``; ``admitted`` and ``reason``: the gate's verdict (:func:`admit`);
    ``context_of``: for an item brought as context (:func:`select_recall`), the id of the
    recalled item it is next to (it was not gated: score 0), else None.
    """

    candidate: RecallCandidate
    dense_rank: int | None
    rrf: float
    decay: float
    score: float
    admitted: bool
    reason: str
    context_of: int | None = None

    @property
    def item(self) -> RecallItem:
        return self.candidate.item


@dataclass(frozen=True, kw_only=True)
class RecallResult:
    """What recall brings into one request (docs/memory.md §12).

    ``items``: admitted candidates that fit the budget, in block (chronological) order;
    ``message``: the recall block (:func:`recall_block`), None when nothing was recalled;
    ``tokens``: its size in tokens (0 without one); ``rejected``: the best candidates the gate
    refused, best score first, at most :data:`RECALL_MAX_REJECTED`; ``over_budget``: admitted
    candidates left out for the token budget or the item limit, best score first.
    """

    items: tuple[ScoredCandidate, ...] = ()
    message: dict[str, Any] | None = None
    tokens: int = 0
    rejected: tuple[ScoredCandidate, ...] = ()
    over_budget: tuple[ScoredCandidate, ...] = ()


def score_candidates(
    candidates: Sequence[RecallCandidate],
    *,
    query: str,
    now: datetime,
    thresholds: RecallThresholds,
    rarity: TermRarity | None = None,
) -> list[ScoredCandidate]:
    """Every candidate gated (:func:`admit`, with ``rarity`` and the best matched weight among
    ``candidates`` when ``rarity`` is given) and scored, best score first (docs/memory.md §12):
    dense ranks by cosine among ``candidates`` (equal cosines share a rank), ``rrf * decay``
    (the dense side weighted by ``thresholds.dense_weight``) with the age in days from
    ``created_at`` to ``now`` (aware). Equal scores: the newer item
    first, then the higher id. A candidate listed twice (same item id) counts once, as listed
    with its best lexical rank."""
    unique: dict[int, RecallCandidate] = {}
    for candidate in candidates:
        seen = unique.get(candidate.item.id)
        if seen is None or (candidate.lexical_rank or 10**9) < (seen.lexical_rank or 10**9):
            unique[candidate.item.id] = candidate
    # Competition ranking: equal cosines share a rank (1, 2, 2, 4).
    cosines = sorted((c.cosine for c in unique.values() if c.cosine is not None), reverse=True)
    dense_ranks = {
        c.item.id: 1 + bisect_left(cosines, -c.cosine, key=lambda value: -value)
        for c in unique.values()
        if c.cosine is not None
    }
    query_terms = content_terms(query)
    best_mass = 0.0
    if rarity is not None:
        best_mass = max((rarity_overlap(query_terms, c.item.text, rarity)[0] for c in unique.values()), default=0.0)
    scored = []
    for candidate in unique.values():
        admitted, reason = admit(
            candidate, query_terms=query_terms, thresholds=thresholds, rarity=rarity, best_mass=best_mass
        )
        dense_rank = dense_ranks.get(candidate.item.id)
        fused = rrf(candidate.lexical_rank, dense_rank, dense_weight=thresholds.dense_weight)
        factor = decay((now - candidate.item.created_at).total_seconds() / 86400.0)
        scored.append(
            ScoredCandidate(
                candidate=candidate,
                dense_rank=dense_rank,
                rrf=fused,
                decay=factor,
                score=fused * factor,
                admitted=admitted,
                reason=reason,
            )
        )
    scored.sort(key=lambda s: (-s.score, -s.item.created_at.timestamp(), -s.item.id))
    return scored


def _chronological(items: Sequence[ScoredCandidate]) -> list[ScoredCandidate]:
    return sorted(items, key=lambda s: (s.item.created_at, s.item.message_ids, s.item.id))


def recall_line(item: RecallItem) -> str:
    """One item of the recall block: ``- 2024-05-20 (chat "Trip", msg 123) User: text``, the
    date of ``created_at`` in its own time zone, the chat part left out when the title is empty,
    ``msgs 12, 13`` for a piece of several messages; the text verbatim, later lines indented."""
    where = f'chat "{item.chat_title}", ' if item.chat_title else ""
    ids = ", ".join(str(i) for i in item.message_ids)
    msg = f"msgs {ids}" if len(item.message_ids) > 1 else f"msg {ids}"
    label = _ROLE_LABELS.get(item.role, item.role.capitalize())
    text = item.text.strip().replace("\n", "\n  ")
    return f"- {item.created_at.date().isoformat()} ({where}{msg}) {label}: {text}"


def render_recall(items: Sequence[RecallItem]) -> str:
    """The recall block's text: :data:`RECALL_HEADER`, then one :func:`recall_line` per item in
    chronological order (``created_at``, then message ids)."""
    ordered = sorted(items, key=lambda item: (item.created_at, item.message_ids, item.id))
    return "\n".join([RECALL_HEADER, *(recall_line(item) for item in ordered)])


def recall_block(items: Sequence[RecallItem], *, role: str, counter: TokenCounter) -> tuple[dict[str, Any], int]:
    """The recall block message for ``items`` (docs/memory.md §12: after the summary, before the
    retained window): ``{"role": role, "content": render_recall(items)}`` and its size in
    tokens (``counter.count_message``). ``role``: the summary block's role. Raises ValueError for
    no items (no recall means no block)."""
    if not items:
        raise ValueError("a recall block needs at least one item")
    message = {"role": role, "content": render_recall(items)}
    return message, counter.count_message(message)


def select_recall(
    candidates: Sequence[RecallCandidate],
    *,
    query: str,
    now: datetime,
    budget_tokens: int,
    thresholds: RecallThresholds,
    counter: TokenCounter,
    role: str = "system",
    max_items: int = RECALL_MAX_ITEMS,
    rarity: TermRarity | None = None,
    neighbors: Mapping[int, Sequence[RecallItem]] | None = None,
    scored: Sequence[ScoredCandidate] | None = None,
) -> RecallResult:
    """What to recall for ``query`` from ``candidates`` (docs/memory.md §12; SPEC F-33, F-35).

    Candidates are gated and scored (:func:`score_candidates`, ``rarity``: the owner's term
    frequencies for the rarity floor, None for the count floor); admitted ones are taken best
    score first while the block (header, lines and message overhead, :func:`recall_block`) stays
    within ``budget_tokens`` tokens and at most ``max_items`` are taken; one that does not fit is
    skipped and the next tried, so eviction is deterministic (lowest score first). Then the
    context: ``neighbors`` maps an item id to the items next to it in its chat (the next one
    first, then the one before; already scoped by the caller, :func:`memory.services.recall_neighbors`),
    and the :data:`RECALL_CONTEXT_ANCHORS` best items taken bring theirs, best anchor first, while
    the block stays within the budget (a context item is admitted by its anchor, not by the
    gate, and counts for no item limit: at most two per anchor). ``scored``: the candidates
    already scored this way (:func:`recall_scored`; ``candidates``, ``query``, ``now``,
    ``thresholds`` and ``rarity`` then only document them). Nothing
    admitted, or nothing fitting, gives an empty result (no block). ``now``: aware datetime the
    ages are measured to; ``role``: the block's role; ``item.tokens`` is trusted as a lower bound
    of an item's line (one counted with another encoding may be skipped a few tokens early).
    Never raises for any candidates.
    """
    if scored is None:
        scored = score_candidates(candidates, query=query, now=now, thresholds=thresholds, rarity=rarity)
    admitted = [s for s in scored if s.admitted]
    rejected = tuple(s for s in scored if not s.admitted)[:RECALL_MAX_REJECTED]
    if not admitted or budget_tokens <= 0:
        return RecallResult(rejected=rejected, over_budget=tuple(admitted))
    # Lines are counted one by one (cheap, cached); the sum may differ from the block's count by
    # a token merge across a line break, so a near miss is counted exactly and the whole block is
    # checked once at the end.
    position = {s.item.id: i for i, s in enumerate(admitted)}
    taken: list[ScoredCandidate] = []
    over: list[ScoredCandidate] = []
    total = counter.count_message({"role": role, "content": RECALL_HEADER})

    def fits(entry: ScoredCandidate) -> int | None:
        """The block's size with ``entry`` added to ``taken``, or None when it would pass the budget."""
        # ``item.tokens`` (the text alone) bounds the line's cost from below: no need to count.
        if total + entry.item.tokens > budget_tokens + _NEAR_MISS_TOKENS:
            return None
        cost = counter.count_text("\n" + recall_line(entry.item))
        if total + cost <= budget_tokens:
            return total + cost
        if total + cost > budget_tokens + _NEAR_MISS_TOKENS:
            return None
        exact = recall_block([s.item for s in (*taken, entry)], role=role, counter=counter)[1]
        return exact if exact <= budget_tokens else None

    for entry in admitted:
        size = fits(entry) if len(taken) < max_items else None
        if size is None:
            over.append(entry)
        else:
            taken.append(entry)
            total = size
    # The context of the best items taken, in the room left.
    context_ids: set[int] = set()
    for entry in _context(taken, neighbors or {}, now=now):
        size = fits(entry)
        if size is not None:
            taken.append(entry)
            context_ids.add(entry.item.id)
            total = size
    by_id = {s.item.id: s for s in admitted}
    over = [s for s in over if s.item.id not in context_ids]
    if context_ids:
        rejected = tuple(s for s in scored if not s.admitted and s.item.id not in context_ids)[:RECALL_MAX_REJECTED]
    while taken:
        message, tokens = recall_block([s.item for s in taken], role=role, counter=counter)
        if tokens <= budget_tokens:
            return RecallResult(
                items=tuple(_chronological(taken)),
                message=message,
                tokens=tokens,
                rejected=rejected,
                over_budget=tuple(sorted(over, key=lambda s: position[s.item.id])),
            )
        dropped = taken.pop()
        if dropped.item.id in by_id:  # context is dropped first; an admitted item is over budget
            over.append(by_id[dropped.item.id])
    return RecallResult(rejected=rejected, over_budget=tuple(sorted(over, key=lambda s: position[s.item.id])))


def recall_scored(
    candidates: Sequence[RecallCandidate], *, query: str, now: datetime, model: str | None, rarity: TermRarity | None
) -> tuple[ScoredCandidate, ...]:
    """:func:`score_candidates` of ``candidates`` for ``query`` under the gate of embedding model
    ``model`` (:func:`thresholds_for`) and ``rarity``, as :class:`RecallInput` carries them
    (``scored``), so the selections of one request score once. Never raises."""
    return tuple(score_candidates(candidates, query=query, now=now, thresholds=thresholds_for(model), rarity=rarity))


def recall_anchors(
    scored: Sequence[ScoredCandidate], *, memory_key: str, limit: int = RECALL_CONTEXT_ANCHORS + 2
) -> list[RecallItem]:
    """The items whose neighbours the owning app should fetch for :func:`select_recall`'s
    context (docs/memory.md §12, "context"): those of conversation ``memory_key`` (the
    request's own; an item of another chat comes alone) among the ``limit`` best admitted of
    ``scored`` (best first, :func:`recall_scored`). The default is a little over
    :data:`RECALL_CONTEXT_ANCHORS`, since an item that does not fit the budget brings no context
    and the next one may. Never raises."""
    best = [s.item for s in scored if s.admitted][:limit]
    return [item for item in best if item.memory_key == memory_key]


def _context(
    taken: Sequence[ScoredCandidate], neighbors: Mapping[int, Sequence[RecallItem]], *, now: datetime
) -> list[ScoredCandidate]:
    """The context items the best :data:`RECALL_CONTEXT_ANCHORS` of ``taken`` (best score first)
    bring from ``neighbors``, in the order they are offered to the budget, without the items
    already taken or offered: each scored 0 with its decay, ``reason`` naming its anchor."""
    seen = {s.item.id for s in taken}
    offered: list[ScoredCandidate] = []
    for anchor in sorted(taken, key=lambda s: -s.score)[:RECALL_CONTEXT_ANCHORS]:
        where = ", ".join(str(i) for i in anchor.item.message_ids)
        for item in neighbors.get(anchor.item.id, ()):
            if item.id in seen:
                continue
            seen.add(item.id)
            offered.append(
                ScoredCandidate(
                    candidate=RecallCandidate(item=item, lexical_rank=None, cosine=None, identifier_match=False),
                    dense_rank=None,
                    rrf=0.0,
                    decay=decay((now - item.created_at).total_seconds() / 86400.0),
                    score=0.0,
                    admitted=True,
                    reason=f"context: next to msg {where}, recalled",
                    context_of=anchor.item.id,
                )
            )
    return offered


@dataclass(frozen=True, kw_only=True)
class RecallInput:
    """What the owning app found for one request's recall (docs/memory.md §12), handed to the
    engine by :data:`memory.engine.RecallLoader`.

    ``query``: the current user message's text; ``candidates``: from the index, already scoped
    (this owner only; this conversation's items only up to its summary's boundary); ``model``:
    the embedding model whose cosines the candidates carry (None: lexical only, the gate is
    then :data:`LEXICAL_THRESHOLDS`); ``now``: the request's time (aware); ``notes``: what went
    wrong on the way (an embedder past its deadline or failing: lexical only); ``latency_ms``:
    milliseconds the request waited for the search (the query's embedding included, or what was
    left of it when the owning app started it earlier); ``embedding_ms``: milliseconds the query's
    embedding took from its start (0 without one); ``rarity``: how rare the query's
    terms are in the owner's index (the gate's rarity floor), None when unknown (the count
    floor); ``neighbors``: item id → the items next to it in its chat, next one first, for the
    context of the best recalled items (:func:`select_recall`; empty: no context); ``scored``:
    ``candidates`` already gated and scored (:func:`recall_scored` with ``query``, ``now``,
    ``model`` and ``rarity``), None to score them when selecting."""

    query: str
    candidates: list[RecallCandidate]
    model: str | None
    now: datetime
    notes: list[str] = field(default_factory=list)
    latency_ms: int = 0
    embedding_ms: int = 0
    rarity: TermRarity | None = None
    neighbors: Mapping[int, Sequence[RecallItem]] = field(default_factory=dict)
    scored: tuple[ScoredCandidate, ...] | None = None


def recall_for(data: RecallInput, *, budget_tokens: int, counter: TokenCounter, role: str) -> RecallResult:
    """:func:`select_recall` of ``data`` with the gate of its embedding model
    (:func:`thresholds_for`) and its term rarity within ``budget_tokens`` tokens; ``role``: the
    summary block's."""
    return select_recall(
        data.candidates,
        query=data.query,
        now=data.now,
        budget_tokens=budget_tokens,
        thresholds=thresholds_for(data.model),
        counter=counter,
        role=role,
        rarity=data.rarity,
        neighbors=data.neighbors,
        scored=data.scored,
    )


def recall_report(data: RecallInput | None, result: RecallResult) -> dict[str, Any]:
    """The JSON form of one request's recall for the inspector and the request snapshot:
    ``query``, ``model`` (None: lexical only), ``latency_ms``, ``embedding_ms``, ``notes``, ``tokens`` of the
    block, and for ``items`` (recalled, block order), ``rejected`` (best refused) and
    ``over_budget`` each ``{"item_id", "memory_key", "chat_title", "message_ids", "role",
    "created_at", "text", "lexical_rank", "cosine", "dense_rank", "rrf", "decay", "score",
    "reason", "context_of"}`` (``context_of``: the item id a context item is next to, else
    null). Empty (``{}``) when the request had no recall."""
    if data is None:
        return {}

    def entry(scored: ScoredCandidate) -> dict[str, Any]:
        item = scored.item
        return {
            "item_id": item.id,
            "memory_key": item.memory_key,
            "chat_title": item.chat_title,
            "message_ids": list(item.message_ids),
            "role": item.role,
            "created_at": item.created_at.isoformat(),
            "text": item.text[:300],
            "lexical_rank": scored.candidate.lexical_rank,
            "cosine": None if scored.candidate.cosine is None else round(scored.candidate.cosine, 4),
            "dense_rank": scored.dense_rank,
            "rrf": round(scored.rrf, 5),
            "decay": round(scored.decay, 4),
            "score": round(scored.score, 5),
            "reason": scored.reason,
            "context_of": scored.context_of,
        }

    return {
        "query": data.query[:300],
        "model": data.model,
        "latency_ms": data.latency_ms,
        "embedding_ms": data.embedding_ms,
        "notes": list(data.notes),
        "tokens": result.tokens,
        "items": [entry(s) for s in result.items],
        "rejected": [entry(s) for s in result.rejected],
        "over_budget": [entry(s) for s in result.over_budget[:5]],
    }
