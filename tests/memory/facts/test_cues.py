"""Negation, withdrawal and self-correction cues per language (docs/memory.md F-46 to F-48), including
phrases that look like one and are not."""

from __future__ import annotations

import re

import pytest

from memory.facts.cues import (
    CORRECTION,
    LANGUAGES,
    NEGATION,
    NOT_NEGATING,
    UNCERTAINTY,
    WITHDRAWAL,
    StatementCues,
    statement_cues,
)

# (clause, negated, withdrawn, corrects)
CASES = [
    # English
    ("I love jazz", False, False, False),
    ("I don't like jazz", True, False, False),
    ("I do not eat pork", True, False, False),
    ("I have never been to Japan", True, False, False),
    ("I have no pets", True, False, False),
    ("I don't like jazz anymore", True, True, False),
    ("I’m not vegetarian any more", True, True, False),
    ("I'm no longer allergic to penicillin", True, True, False),
    ("I don't have a car any more", True, True, False),
    ("Not anymore.", True, True, False),
    ("forget my old address", False, True, False),
    ("please ignore my previous email address", False, True, False),
    ("I stopped eating meat last year", False, True, False),
    ("I've quit smoking", False, True, False),
    ("I used to live in Paris", False, True, False),
    ("sorry, typo: it's 555-0199", False, False, True),
    ("typo - the order is A-48213", False, False, True),
    ("I meant Tuesday, not Monday", True, False, True),
    ("correction: the flight is UA 882", False, False, True),
    ("scratch that, make it four people", False, False, True),
    ("Actually, my number is 555-0199", False, False, True),
    ("my number is actually 555-0199 now", False, False, True),
    ("wait, it's 12B not 21B", True, False, True),
    ("my bad, the zip is 94110", False, False, True),
    # Chinese
    ("我喜欢爵士乐", False, False, False),
    ("我不喜欢爵士乐", True, False, False),
    ("我没去过日本", True, False, False),
    ("我不再喜欢爵士乐了", True, True, False),
    ("我已经不住在北京了", True, True, False),
    ("我没有猫了", True, True, False),
    ("我戒烟了", False, True, False),
    ("忘掉我之前的地址", False, True, False),
    ("更正：电话是13800138000", False, False, True),
    ("我是说周二", False, False, True),
    ("打错了，是A-48213", False, False, True),
    ("说错了，应该是下周五", False, False, True),
    # German
    ("Ich mag Jazz", False, False, False),
    ("Ich mag keinen Jazz", True, False, False),
    ("Ich mag keinen Jazz mehr", True, True, False),
    ("Ich wohne nicht mehr in Berlin", True, True, False),
    ("Ich habe mit dem Rauchen aufgehört", False, True, False),
    ("Korrektur: die Nummer ist 0176 5550199", False, False, True),
    ("Ich meinte Dienstag", False, False, True),
    ("Tippfehler, es ist A-48213", False, False, True),
    # French
    ("J'aime le jazz", False, False, False),
    ("Je n'aime pas le jazz", True, False, False),
    ("Je n'aime plus le jazz", True, True, False),
    ("Je ne fume plus", True, True, False),
    ("oublie mon ancienne adresse", False, True, False),
    ("je voulais dire mardi", False, False, True),
    ("correction : c'est le vol AF 1234", False, False, True),
    # Spanish
    ("Me gusta el jazz", False, False, False),
    ("No me gusta el jazz", True, False, False),
    ("Ya no vivo en Madrid", True, True, False),
    ("Dejé de fumar", False, True, False),
    ("quise decir martes", False, False, True),
    ("corrección: el pedido es A-48213", False, False, True),
]


@pytest.mark.parametrize(("clause", "negated", "withdrawn", "corrects"), CASES)
def test_cues(clause, negated, withdrawn, corrects):
    cues = statement_cues(clause)
    assert (cues.negated, cues.withdrawn, cues.corrects) == (negated, withdrawn, corrects)
    assert bool(cues.cues) == (negated or withdrawn or corrects or cues.uncertain)


# Clauses with a negation word that negate, withdraw and correct nothing.
NOT_NEGATED = [
    "not only jazz but also blues",
    "I like not just jazz but blues too",
    "I can't wait for the trip",
    "not bad at all, I'd say",
    "no problem, my order is A-48213",
    "don't forget my birthday is on 3 May",
    "I eat nothing but vegetables",
    "No, I live in Rome",
    "why not Friday",
    "I actually like jazz",
    "I meant to tell you about my new job",
    "这个不错",
    "不但喜欢爵士，而且喜欢蓝调",
    "没问题，我的订单是A-48213",
    "不过我住在上海",
    "nicht nur Jazz, sondern auch Blues",
    "non seulement le jazz mais aussi le blues",
    "no solo jazz sino también blues",
]


@pytest.mark.parametrize("clause", NOT_NEGATED)
def test_phrases_that_only_look_negative(clause):
    assert statement_cues(clause) == StatementCues()


@pytest.mark.parametrize(
    "clause",
    [
        "I don't know if I still like jazz",
        "I'm not sure I like jazz anymore",
        "我不知道我还喜不喜欢爵士",
        "Ich weiß nicht, ob ich noch Jazz mag",
        "je ne sais pas si j'aime encore le jazz",
        "no sé si me gusta el jazz",
    ],
)
def test_doubt_is_uncertain_and_its_negation_negates_nothing(clause):
    assert statement_cues(clause) == StatementCues(uncertain=True, cues=statement_cues(clause).cues)


def test_a_doubted_withdrawal_or_correction_is_no_operation():
    hedged = statement_cues("maybe I'm not allergic any more")
    assert (hedged.uncertain, hedged.negated, hedged.withdrawn) == (True, True, False)
    assert not statement_cues("perhaps I meant Tuesday").corrects


def test_the_matched_cue_explains_the_decision():
    assert statement_cues("I'm no longer allergic to penicillin").cues == ("no longer",)
    assert statement_cues("I don't like jazz anymore").cue == "n't … anymore"
    assert statement_cues("Ich mag keinen Jazz mehr").cue == "keinen … mehr"
    assert statement_cues("sorry, typo: it's 555-0199").cue == "sorry, typo"
    assert statement_cues("I meant Tuesday, not Monday").cues == ("I meant", "not")
    assert statement_cues("I love jazz").cue == ""


def test_the_cue_lists_are_data_for_every_language_and_compile():
    for table in (NEGATION, WITHDRAWAL, CORRECTION, UNCERTAINTY, NOT_NEGATING):
        assert set(table) == set(LANGUAGES)
        for patterns in table.values():
            assert patterns and all(isinstance(p, str) for p in patterns)
            for pattern in patterns:
                re.compile(pattern)
