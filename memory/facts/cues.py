"""Cue words that change what a clause says about a fact: negation, withdrawal, self-correction.

"I'm no longer allergic to penicillin" withdraws a fact, "I don't like jazz anymore" turns a
preference around, "sorry, typo: 555-0199" corrects a value (docs/memory.md F-46 to F-48). The cue lists are data, one
tuple of regular expressions per language (English, Chinese, German, French, Spanish);
:func:`statement_cues` reads one clause. Pure.

Phrases that hold a negation word without negating the statement ("not only … but also", "can't
wait", 不但, 不错) are removed before negation and withdrawal are looked for; so are phrases of
doubt ("I don't know if …", "not sure", 不知道), which make the clause ``uncertain`` instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

LANGUAGES = ("en", "zh", "de", "fr", "es")
CueTable = Mapping[str, tuple[str, ...]]

NEGATION: CueTable = {
    "en": (
        r"\bnot\b",
        r"\bcannot\b",
        r"n['’]t\b",
        r"\bnever\b",
        r"\bno\b",
        r"\bnone\b",
        r"\bneither\b",
        r"\bnor\b",
        r"\bnothing\b",
        r"\bnobody\b",
    ),
    "zh": (r"不", r"没", r"沒", r"并非", r"从未"),
    "de": (r"\bnicht\b", r"\bkein(?:e|en|em|er|es)?\b", r"\bnie(?:mals)?\b", r"\bnichts\b"),
    "fr": (r"\bne\b", r"\bn['’]", r"\bpas\b", r"\bjamais\b", r"\baucune?\b", r"\brien\b"),
    "es": (r"\bno\b", r"\bnunca\b", r"\bjam[aá]s\b", r"\bningun[oa]?\b", r"\bnada\b", r"\bnadie\b"),
}
WITHDRAWAL: CueTable = {
    "en": (
        r"\bno longer\b",
        r"\b(?:not|never)\b(?P<gap>[^.;!?]{0,50})\bany ?more\b",
        r"n['’]t\b(?P<gap>[^.;!?]{0,50})\bany ?more\b",
        r"^\s*not any ?more\b",
        r"\bnever\b(?P<gap>[^.;!?]{0,40})\bagain\b",
        r"\bforget (?:about )?(?:my|the|that)\b",
        r"\b(?:disregard|ignore|delete|remove|drop) (?:my|the) (?:old|previous|former|earlier)\b",
        r"\bi(?: have|['’]ve)? (?:stopped|quit|given up|gave up)\b",
        r"\bi used to\b",
    ),
    "zh": (
        r"不再",
        r"已经不",
        r"已经没",
        r"(?:不|没)(?P<gap>[^，。！？,.!?；;]{1,10})了(?=$|[，。！？,.!?；;\s])",
        r"戒(?:掉)?(?P<gap>[^，。！？,.!?]{0,4})了",
        r"(?:忘(?:掉|了)|删(?:掉|除)|去掉)(?:我)?(?:之前|以前|原来|旧)的",
        r"以前(?P<gap>[^，。！？]{0,12})(?:现在|如今)(?:不|没)",
    ),
    "de": (
        r"\bnicht mehr\b",
        r"\bnie mehr\b",
        r"\bkein(?:e|en|em|er|es)?\b(?P<gap>[^.;!?]{0,40})\bmehr\b",
        r"\bvergiss (?:meine|meinen|mein|die|den|das) (?:alte|alten|altes|frühere|früheren|vorherige)",
        r"\b(?:habe|hab)\b(?P<gap>[^.;!?]{0,40})\baufgehört\b",
    ),
    "fr": (
        r"\bne\b(?P<gap>[^.;!?]{0,30})\bplus\b",
        r"\bn['’](?P<gap>[^.;!?]{0,30})\bplus\b",
        r"\bplus jamais\b",
        r"\boublie (?:mon|ma|mes) (?:ancien|ancienne|anciens|anciennes|vieux|vieille)\b",
        r"\bj['’]ai arrêté\b",
    ),
    "es": (
        r"\bya no\b",
        r"\bdej[ée] de\b",
        r"\bolvida (?:mi|mis) (?:antigu[oa]s?|viej[oa]s?|anterior(?:es)?)\b",
    ),
}
CORRECTION: CueTable = {
    "en": (
        r"\b(?:sorry|oops|my),? (?:a |my |that was a )?typo\b",
        r"\btypo\s*[:,-]",
        r"\bi meant\b(?! to\b)",
        r"\bwhat i meant (?:is|was)\b",
        r"\bcorrection\s*:",
        r"\bscratch that\b",
        r"^\W*actually\b",
        r"\bactually\b(?P<gap>[^.;!?]{0,60})\bnow\b",
        r"^\W*wait,? (?:it['’]?s|it is|no|that['’]?s|i meant)\b",
        r"\bmy (?:bad|mistake)\b",
        r"\bi misspoke\b",
        r"\bi made a (?:typo|mistake)\b",
        r"\bmake that\b",
        r"\bthat should (?:be|say|read|have been)\b",
        r"\bshould have said\b",
    ),
    "zh": (
        r"更正",
        r"我是说",
        r"我的意思是",
        r"(?:打|说|写|输|填|记)错了",
        r"搞错了",
        r"纠正一下",
        r"不对[，,]?\s*(?:是|应该)",
        r"应该是",
    ),
    "de": (
        r"\bkorrektur\s*:",
        r"\bich meinte\b",
        r"\btippfehler\b",
        r"\b(?:verschrieben|vertippt)\b",
        r"^\W*eigentlich\b",
        r"\beigentlich\b(?P<gap>[^.;!?]{0,60})\bjetzt\b",
    ),
    "fr": (
        r"\bcorrection\s*:",
        r"\bje voulais dire\b",
        r"\bfaute de frappe\b",
        r"\bje me suis tromp[ée]e?\b",
        r"^\W*en fait\b",
        r"\ben fait\b(?P<gap>[^.;!?]{0,60})\bmaintenant\b",
    ),
    "es": (
        r"\bcorrecci[oó]n\s*:",
        r"\bquise decir\b",
        r"\berror de (?:tipeo|escritura)\b",
        r"\bme equivoqu[ée]\b",
        r"^\W*en realidad\b",
        r"\ben realidad\b(?P<gap>[^.;!?]{0,60})\bahora\b",
    ),
}
# Phrases of doubt: the clause asserts nothing, and their negation words negate nothing.
UNCERTAINTY: CueTable = {
    "en": (
        r"\bnot (?:sure|certain)\b",
        r"\b(?:do not|don['’]t|doesn['’]t|did not|didn['’]t) know (?:if|whether)\b",
        r"\b(?:can['’]t|cannot|don['’]t) remember (?:if|whether)\b",
        r"\bi wonder (?:if|whether)\b",
        r"\b(?:maybe|perhaps|probably)\b",
    ),
    "zh": (r"不知道", r"不确定", r"不一定", r"不记得", r"也许", r"说不定"),
    "de": (r"\bnicht sicher\b", r"\bwei(?:ß|ss) (?:ich )?nicht,? ob\b", r"\bvielleicht\b"),
    "fr": (r"\bpas s[uû]re?\b", r"\bje ne sais pas si\b", r"\bpeut-être\b"),
    "es": (r"\bno estoy segur[oa]\b", r"\bno s[ée] si\b", r"\b(?:quizás?|tal vez)\b"),
}
# Phrases with a negation word that do not negate the statement.
NOT_NEGATING: CueTable = {
    "en": (
        r"\bnot (?:only|just|merely)\b",
        r"\bcan['’]t wait\b",
        r"\bcouldn['’]t be (?:happier|better)\b",
        r"\bnot bad\b",
        r"\bno (?:problem|worries|doubt)\b",
        r"\bnever mind\b",
        r"\b(?:don['’]t|do not) (?:forget|worry|hesitate)\b",
        r"\bwhy not\b",
        r"\bnothing but\b",
        r"^\W*no\s*[,!.;:—]",
    ),
    "zh": (
        r"不但",
        r"不仅",
        r"不只",
        r"不错",
        r"不过",
        r"不好意思",
        r"不客气",
        r"不用谢",
        r"没问题",
        r"没关系",
        r"差不多",
        r"不得不",
        r"(\w)不\1",  # A-not-A questions: 喜不喜欢, 是不是
    ),
    "de": (r"\bnicht nur\b", r"\bkein problem\b", r"\bnicht schlecht\b", r"^\W*nein\s*[,!.;:—]"),
    "fr": (r"\bnon seulement\b", r"\bpas de (?:problème|souci)\b", r"\bpas mal\b", r"^\W*non\s*[,!.;:—]"),
    "es": (r"\bno s[oó]lo\b", r"\bno hay problema\b", r"\bno est[aá] mal\b"),
}


@dataclass(frozen=True, slots=True)
class StatementCues:
    """What the cue words of one clause say: ``negated`` (a negation that applies to the
    statement), ``withdrawn`` (a fact stops being true: "no longer", "not … anymore", "I
    stopped", "forget my old …"), ``corrects`` (the clause corrects something the user just said),
    ``uncertain`` (the clause doubts rather than states); ``cues``: the matched words, in order
    of position, for explanations ("withdrawn: no longer")."""

    negated: bool = False
    withdrawn: bool = False
    corrects: bool = False
    uncertain: bool = False
    cues: tuple[str, ...] = ()

    @property
    def cue(self) -> str:
        """The first matched cue (``""`` when none)."""
        return self.cues[0] if self.cues else ""


def _each(table: CueTable) -> tuple[re.Pattern[str], ...]:
    # One pattern at a time: each may name its own gap, and a back reference keeps its number.
    return tuple(re.compile(pattern, re.IGNORECASE) for language in LANGUAGES for pattern in table[language])


_NEGATION = _each(NEGATION)
_WITHDRAWAL = _each(WITHDRAWAL)
_CORRECTION = _each(CORRECTION)
_UNCERTAINTY = _each(UNCERTAINTY)
_NOT_NEGATING = _each(NOT_NEGATING)


def statement_cues(clause: str) -> StatementCues:
    """The cues of ``clause`` (one clause or short sentence of a user message, any supported
    language). Doubt and non-negating phrases are blanked out first (see the module docstring),
    so "I don't know if I still like jazz" is uncertain, not negated, and withdraws nothing.
    Negation is lexical: a withdrawal by "no longer" is also negated, one by "I stopped" is not;
    an uncertain clause neither withdraws nor corrects.
    A cue with words inside it is reported with them elided ("n't … anymore")."""
    masked = clause
    uncertain = [match for pattern in _UNCERTAINTY for match in pattern.finditer(clause)]
    for match in uncertain:
        masked = _blanked(masked, match.start(), match.end())
    for pattern in _NOT_NEGATING:
        for match in pattern.finditer(clause):
            masked = _blanked(masked, match.start(), match.end())
    withdrawal = _first(_WITHDRAWAL, masked)
    negation = _first(_NEGATION, masked)
    correction = _first(_CORRECTION, clause)
    matches = [m for m in (*uncertain, withdrawal, negation, correction) if m is not None]
    # A cue inside a longer one ("no" in "no longer") is not reported on its own.
    shown = [m for m in matches if not any(_inside(m, other) for other in matches)]
    # A doubt is no operation on a fact: "maybe I'm not allergic any more" withdraws nothing.
    return StatementCues(
        negated=negation is not None,
        withdrawn=withdrawal is not None and not uncertain,
        corrects=correction is not None and not uncertain,
        uncertain=bool(uncertain),
        cues=tuple(dict.fromkeys(_words(clause, m) for m in sorted(shown, key=lambda m: m.start()))),
    )


def _inside(match: re.Match[str], other: re.Match[str]) -> bool:
    """``match`` lies within the longer ``other``."""
    longer = other.end() - other.start() > match.end() - match.start()
    return longer and other.start() <= match.start() and match.end() <= other.end()


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> re.Match[str] | None:
    """The earliest match of any of ``patterns`` in ``text``."""
    matches = [match for pattern in patterns if (match := pattern.search(text))]
    return min(matches, key=lambda match: match.start(), default=None)


def _words(clause: str, match: re.Match[str]) -> str:
    """The cue as said in ``clause``, its inner words (a ``gap`` group) elided."""
    if "gap" in match.re.groupindex and match.group("gap"):
        return (
            f"{clause[match.start() : match.start('gap')].strip()} … {clause[match.end('gap') : match.end()].strip()}"
        )
    return clause[match.start() : match.end()].strip()


def _blanked(text: str, start: int, end: int) -> str:
    """``text`` with ``[start, end)`` replaced by spaces (offsets stay valid)."""
    return text[:start] + " " * (end - start) + text[end:]
