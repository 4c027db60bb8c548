"""Key facts in the pure core (docs/memory.md §11): rule extraction, the key-facts block and its
budget, the planner's reserve, and the property that a fact stays visible to the model after any
number of compressions, summarizer up or down (F-31, F-32)."""

from __future__ import annotations

import copy
import itertools
import json
from datetime import UTC, datetime

import pytest
from asgiref.sync import async_to_sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.context.request import ContextRequest
from memory.facts.block import FACTS_HEADER, block_order, fact_line, facts_block, render_facts
from memory.facts.rules import message_rule_facts, rule_facts, tool_call_facts
from memory.facts.values import KeyFact
from memory.summary.store import InMemorySummaryStore
from tests.memory.builders import COUNTER, FlakySummarizer, Store, asst, tool, user
from tests.memory.conftest import make_engine
from tests.memory.invariants import check_context

SYSTEM = "You are the support assistant."


def values(text: str) -> list[tuple[str, str, str]]:
    return [(c.kind, c.key, c.value) for c in rule_facts(text, message_id=7)]


# --- rule extraction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("my user id is mia_li_3668", ("id", "user_id", "mia_li_3668")),
        ("the reservation ZFA04Y please", ("id", "reservation_id", "ZFA04Y")),
        ("order #W2378156 never arrived", ("id", "order_id", "#W2378156")),
        ("ticket KX-55190 is still open", ("id", "ticket_id", "KX-55190")),
        ("订单号是A-48213，请查一下", ("id", "order_id", "A-48213")),
        ("write to ada.l@example.org today", ("email", "email", "ada.l@example.org")),
        ("see https://example.com/orders?id=5 now", ("url", "url", "https://example.com/orders?id=5")),
        ("it cost $1,250.50 in total", ("money", "amount", "$1,250.50")),
        ("the hotel was €89 a night", ("money", "amount", "€89")),
        ("我付了300元", ("money", "amount", "300元")),
        ("ホテルは12000円でした", ("money", "amount", "12000円")),
        ("fly on 2024-05-20 please", ("date", "date", "2024-05-20")),
        ("we arrive on March 3rd, 2025", ("date", "date", "March 3rd, 2025")),
        ("我们2024年5月3日出发", ("date", "date", "2024年5月3日")),
        ("call me on +1 (415) 555-0132", ("phone", "phone", "+1 (415) 555-0132")),
        # A newcomer's "+44 7700 900123" became the identifier "900123" and half a phone in a title.
        ("phone +44 7700 900123, please", ("phone", "phone", "+44 7700 900123")),
        ("my number is +49 30 12345678", ("phone", "phone", "+49 30 12345678")),
        ("ring 07700 900123 after six", ("phone", "phone", "07700 900123")),
        ("the visa card ending in 4421", ("id", "payment_card", "4421")),
        # A time keeps its own period; the sentence's is dropped (a newcomer's "10 a.m").
        ("my follow-up is at 10 a.m.", ("date", "time", "10 a.m.")),
        ("see you at 9 p.m., thanks", ("date", "time", "9 p.m.")),
        ("it starts at 11:30.", ("date", "time", "11:30")),
        ("I'm on UA 882 to Newark.", ("id", "flight_number", "UA 882")),
    ],
)
def test_rule_extraction_finds_each_kind_verbatim(text, expected):
    assert expected in values(text)


def test_rule_extraction_ignores_plain_words_short_numbers_and_decimals():
    assert values("I have 2 bags, 3.5 kg each, flight at 10, thanks a lot") == []
    assert values("version 3.14159 of the policy") == []


def test_rule_extraction_reports_each_value_once_in_order_and_keeps_cjk_boundaries():
    found = values("我叫李明，订单号是A-48213，邮箱 li@example.cn，订单号是A-48213")
    assert found == [("id", "order_id", "A-48213"), ("email", "email", "li@example.cn")]


def test_an_email_or_a_date_is_not_also_read_as_an_identifier():
    assert values("mail mia_li_3668@example.com on 2024-05-20") == [
        ("email", "email", "mia_li_3668@example.com"),
        ("date", "date", "2024-05-20"),
    ]


def test_tool_call_arguments_give_facts_named_after_the_argument():
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {
                "name": "book_reservation",
                "arguments": json.dumps(
                    {
                        "user_id": "mia_li_3668",
                        "flights": [{"flight_number": "HAT136", "date": "2024-05-20"}],
                        "payment_methods": [{"payment_id": "credit_card_4421486", "amount": 500}],
                        "total_baggages": 1,
                        "origin": "JFK",
                        "insurance": "no",
                    }
                ),
            },
        }
    ]
    found = [(c.kind, c.key, c.value) for c in tool_call_facts(calls, message_id=3)]
    assert found == [
        ("id", "user_id", "mia_li_3668"),
        ("id", "flight_number", "HAT136"),
        ("date", "date", "2024-05-20"),
        ("id", "payment_id", "credit_card_4421486"),
        ("money", "amount", "500"),
    ]
    assert all(c.source_message_id == 3 and "book_reservation" in c.text for c in tool_call_facts(calls, message_id=3))


def test_only_user_text_and_tool_call_arguments_are_read_at_store_time():
    # F-30: the assistant's suggestions and a tool's listing are not facts the user stated.
    assert message_rule_facts({**asst("Maybe order #W9999999 instead?"), "id": 1}) == []
    assert message_rule_facts({**tool("c1", "orders: #W1111111, #W2222222"), "id": 2}) == []
    assert [c.value for c in message_rule_facts({**user("order #W2378156"), "id": 3})] == ["#W2378156"]
    assert message_rule_facts(user("order #W2378156")) == [], "a message without its id has no provenance"


# --- the block ------------------------------------------------------------------------------

_ids = itertools.count(1)


def fact(kind="id", key="order_id", value="#W1", source=1, **extra) -> KeyFact:
    return KeyFact(
        id=next(_ids), kind=kind, key=key, value=value, text=f"{key} {value}", source_message_id=source, **extra
    )


def test_block_pins_only_facts_the_summary_covers_plus_user_and_superseding_ones():
    folded = fact(value="#W100", source=3)
    in_window = fact(value="#W200", source=9)
    pinned = fact(value="#W300", source=9, pinned_by_user=True)
    edited = fact(value="#W400", source=9, extractor="user")
    newer = fact(kind="address", key="shipping_address", value="48 Birch Lane", source=9, replaces="12 Elm Road")
    hidden = fact(value="#W500", source=2, hidden_by_user=True)
    retired = fact(value="#W600", source=2, invalidated_at=datetime(2026, 1, 1, tzinfo=UTC))
    block = facts_block(
        [folded, in_window, pinned, edited, newer, hidden, retired], boundary=5, max_tokens=400, counter=COUNTER
    )
    assert [f.value for f in block.pinned] == ["#W300", "#W400", "#W100", "48 Birch Lane"]
    assert [f.value for f in block.in_window] == ["#W200"]
    assert block.message is not None and block.message["content"].startswith(FACTS_HEADER)
    assert "- shipping_address: 48 Birch Lane" in block.message["content"]
    assert "(msg 9, current; replaces 12 Elm Road)" in block.message["content"]
    assert "#W500" not in block.message["content"] and "#W600" not in block.message["content"]
    assert block.tokens == COUNTER.count_message(block.message)
    assert block.source == {
        "id": None,
        "kind": "facts",
        "fact_ids": [f.id for f in block.pinned],
        "message_ids": [3, 9],
    }


def test_f48_a_corrected_value_says_so_and_the_record_lists_each_current_fact_with_its_status():
    corrected = fact(key="phone", kind="phone", value="0176 5550 1243", source=9, replaces="0176 5550 1234")
    disliked = fact(kind="preference", key="dislikes", value="jazz", source=2)
    disliked = KeyFact(**{**_fields(disliked), "polarity": "negative"})
    corrected = KeyFact(**{**_fields(corrected), "operation": "correct"})
    block = facts_block([corrected, disliked], boundary=5, max_tokens=400, counter=COUNTER)

    assert block.message is not None
    assert "- phone: 0176 5550 1243 (corrected in msg 9; replaces 0176 5550 1234)" in block.message["content"]
    entries = block.as_dict()["entries"]
    assert [(e["value"], e["status"], e["polarity"], e["provenance"], e["note"]) for e in entries] == [
        ("0176 5550 1243", "pinned", "positive", "user", "corrected in msg 9"),
        ("jazz", "pinned", "negative", "user", ""),
    ]
    assert set(entries[0]) == {"id", "kind", "key", "value", "polarity", "provenance", "status", "note"}


def test_f50_mentioned_values_rank_below_the_users_own_and_never_evict_them():
    own = fact(kind="phone", key="phone", value="+44 7700 900777", source=2)
    burst = [fact(value=f"A-4821{n}", source=3) for n in range(6)]
    burst = [KeyFact(**{**_fields(f), "id": 10 + n, "provenance": "mentioned"}) for n, f in enumerate(burst)]
    budget = COUNTER.count_message({"role": "system", "content": render_facts([own])}) + 2

    block = facts_block([*burst, own], boundary=5, max_tokens=budget, counter=COUNTER)

    assert block_order([*burst, own])[0] == own
    assert [f.value for f in block.pinned] == ["+44 7700 900777"]
    assert "mentioned, not said of the user" in fact_line(burst[0])


def _fields(value: KeyFact) -> dict:
    return {name: getattr(value, name) for name in KeyFact.__dataclass_fields__}


def test_block_keep_order_is_user_pinned_then_ids_money_dates_contact_then_others_newest_first():
    other = fact(kind="preference", key="seat", value="aisle", source=5)
    old_id = fact(value="#W1", source=1)
    new_id = fact(value="#W2", source=4)
    money = fact(kind="money", key="amount", value="$30", source=6)
    date = fact(kind="date", key="date", value="2024-05-20", source=6)
    email = fact(kind="email", key="email", value="a@b.co", source=6)
    mine = fact(kind="other", key="note", value="window seat", source=2, pinned_by_user=True)
    order = block_order([other, old_id, new_id, money, date, email, mine])
    assert [f.value for f in order] == ["window seat", "#W2", "#W1", "$30", "2024-05-20", "a@b.co", "aisle"]


def test_block_stays_within_its_budget_and_lists_what_did_not_fit():
    facts = [fact(value=f"#W{n:07d}", source=n) for n in range(1, 30)]
    budget = 60
    block = facts_block(facts, boundary=100, max_tokens=budget, counter=COUNTER)
    assert 0 < block.tokens <= budget
    assert len(block.pinned) + len(block.over_budget) == 29
    assert block.over_budget, "29 identifiers cannot fit 60 tokens"
    # newest first: the kept ones are the newest identifiers
    assert min(f.source_message_id or 0 for f in block.pinned) > max(
        f.source_message_id or 0 for f in block.over_budget
    )


def test_a_long_line_that_does_not_fit_is_skipped_and_shorter_later_ones_still_fit():
    long = fact(kind="id", key="order_id", value="#W" + "7" * 150, source=9)
    short = fact(kind="id", key="order_id", value="#W12345", source=1)
    block = facts_block([long, short], boundary=10, max_tokens=50, counter=COUNTER)
    assert [f.value for f in block.pinned] == ["#W12345"]
    assert [f.value for f in block.over_budget] == [long.value]


def test_no_block_without_a_budget_or_facts():
    assert facts_block([], boundary=5, max_tokens=400, counter=COUNTER).message is None
    off = facts_block([fact(source=1)], boundary=5, max_tokens=0, counter=COUNTER)
    assert off.message is None and len(off.over_budget) == 1


def test_fact_line_shows_text_only_where_the_slot_and_value_may_not_say_enough():
    assert fact_line(fact(value="#W1", source=2)) == "- order_id: #W1 (msg 2)"
    allergy = KeyFact(**{**fact(kind="preference", key="allergy", value="penicillin", source=4).__dict__})
    allergy = KeyFact(**{**allergy.__dict__, "text": "the user is allergic to penicillin"})
    assert fact_line(allergy) == "- allergy: penicillin (msg 4)"
    promise = fact(kind="commitment", key="callback", value="Friday", source=5)
    promise = KeyFact(**{**promise.__dict__, "text": "send the refund form by Friday"})
    assert fact_line(promise) == "- callback: Friday - send the refund form by Friday (msg 5)"


def test_self_explaining_values_share_one_line_per_slot():
    text = render_facts(
        [fact(kind="date", key="date", value="2024-05-28", source=9), fact(kind="date", key="date", value="2024-05-20")]
    )
    assert text.splitlines()[1:] == ["- date: 2024-05-28; 2024-05-20"]


# --- the planner's reserve and the request ---------------------------------------------------


class FactBook:
    """Rule facts of the stored rows, as the store-time extraction would keep them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.hidden: set[str] = set()

    def facts(self) -> list[KeyFact]:
        out: dict[str, KeyFact] = {}
        for row in self.store.rows:
            for candidate in message_rule_facts(row):
                if candidate.value in out:
                    continue
                out[candidate.value] = KeyFact(
                    id=len(out) + 1,
                    kind=candidate.kind,
                    key=candidate.key,
                    value=candidate.value,
                    text=candidate.text,
                    source_message_id=candidate.source_message_id,
                    hidden_by_user=candidate.value in self.hidden,
                )
        return list(out.values())

    async def load(self) -> list[KeyFact]:
        return [f for f in self.facts() if f.active]


def request(key: str, store: Store, book: FactBook, **extra) -> ContextRequest:
    return ContextRequest(
        memory_key=key,
        system_prompt=SYSTEM,
        load_increment=store.load_increment,
        mode="quick-answer",
        load_facts=book.load,
        **extra,
    )


def visible(context) -> str:
    return "\n".join(str(m.get("content") or "") + json.dumps(m.get("tool_calls") or "") for m in context.messages)


def test_the_block_follows_the_system_prompt_and_its_tokens_are_reserved_before_the_back_scan():
    store, book = Store(), FactBook(Store())
    book.store = store
    store.add(user("my order is #W2378156 and my email is mia@example.com"), asst("Noted. " + "ok " * 120))
    for n in range(12):
        store.add(user(f"question {n}: " + "words " * 60), asst("answer " * 60))
    store.add(user("what was my order number?"))
    engine = make_engine(1024, FlakySummarizer(["ok"]), attempts=1, store=InMemorySummaryStore(), facts_share=0.3)
    context = async_to_sync(engine.build_context)(request("facts-1", store, book))
    assert context.summary.last_message_id and context.summary.last_message_id >= 2
    assert [s["kind"] for s in context.sources[:3]] == ["system", "facts", "summary"]
    block = context.messages[1]["content"]
    assert "#W2378156" in block and "mia@example.com" in block
    assert context.sources[1]["message_ids"] == [1]
    assert context.sections["facts"] == COUNTER.count_message(context.messages[1])
    assert context.facts["pinned"] == context.sources[1]["fact_ids"]
    # the block's tokens came out of the retained window: the request still meets the target
    assert context.tokens <= context.target_tokens
    check_context(context, stored=store.rows, system_prompt=SYSTEM, counter=COUNTER)


def test_facts_still_in_the_window_are_not_duplicated_in_the_block():
    store = Store()
    book = FactBook(store)
    store.add(user("my order is #W2378156"), asst("Noted."), user("thanks"))
    engine = make_engine(4096, FlakySummarizer(["ok"]), attempts=1, store=InMemorySummaryStore())
    context = async_to_sync(engine.build_context)(request("facts-2", store, book))
    assert [s["kind"] for s in context.sources].count("facts") == 0
    assert context.facts["in_window"] == [1] and context.facts["pinned"] == []
    assert "#W2378156" in visible(context)


# --- the property ---------------------------------------------------------------------------

identifier = st.sampled_from(["#W2378156", "ZFA04Y", "mia_li_3668", "KX-55190", "A-48213", "credit_card_4421486"])
amount = st.sampled_from(["$312", "€89", "300元", "$1,250.50"])
date = st.sampled_from(["2024-05-20", "March 3rd, 2025", "2024年5月3日"])
filler = st.integers(min_value=10, max_value=400).map(lambda n: "filler " * n)


@st.composite
def conversation_with_facts(draw):
    messages = []
    for turn in range(draw(st.integers(min_value=3, max_value=14))):
        parts = [f"turn {turn}:"]
        if draw(st.integers(0, 2)) == 0:
            parts.append(f"my reference is {draw(identifier)}")
        if draw(st.integers(0, 3)) == 0:
            parts.append(f"it was {draw(amount)} on {draw(date)}")
        parts.append(draw(filler))
        messages.append(user(" ".join(parts)))
        if draw(st.integers(0, 3)) == 0:
            call_id = f"call_{turn}"
            arguments = json.dumps({"order_id": draw(identifier), "query": "status"})
            caller = asst(None, tc=[call_id])
            caller["tool_calls"][0]["function"]["arguments"] = arguments
            messages.extend([caller, tool(call_id, draw(filler))])
        messages.append(asst(draw(filler)))
    return messages


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    messages=conversation_with_facts(),
    window=st.sampled_from([1024, 2048, 4096]),
    script=st.lists(st.sampled_from(["ok", "ok", "fail", "empty"]), min_size=1, max_size=6),
    hide=st.booleans(),
    summary_role=st.sampled_from(["system", "user"]),
    strict=st.booleans(),
)
def test_f31_every_fact_stays_visible_to_the_model_after_any_number_of_compressions(
    messages, window, script, hide, summary_role, strict
):
    """Summarizer up, failing or empty at random (raw archive): every active fact typed by the
    user or passed to a tool is in the request before every later model call, verbatim, in the
    window or in the key-facts block, unless the block is full and lists it as over budget; a
    hidden fact is not pinned."""
    key = f"facts-property-{next(_ids)}"
    store = Store()
    book = FactBook(store)
    engine = make_engine(
        window,
        FlakySummarizer(script),
        attempts=1,
        store=InMemorySummaryStore(),
        facts_share=0.5,
        summary_role=summary_role,
        strict_alternation=strict,
    )
    for message in messages:
        if message["role"] == "assistant" and not message.get("tool_calls") and store.rows:
            if hide and book.facts():
                book.hidden.add(book.facts()[0].value)
            context = async_to_sync(engine.build_context)(request(key, store, book))
            check_context(
                context,
                stored=store.rows,
                system_prompt=SYSTEM,
                counter=COUNTER,
                single_system=summary_role == "user",
                strict_alternation=strict,
            )
            shown = visible(context)
            left_out = set(context.facts["over_budget"])
            by_id = {f.id: f for f in book.facts()}
            pinned = [by_id[i] for i in context.facts["pinned"]]
            for fact_id in left_out:
                # Only a full block leaves a fact out: adding it would break the budget.
                trial = {"role": summary_role, "content": render_facts([*pinned, by_id[fact_id]])}
                assert COUNTER.count_message(trial) > engine.budget.facts_budget_tokens
            for item in book.facts():
                if item.active and item.id not in left_out:
                    assert item.value in shown, f"fact {item.value} (msg {item.source_message_id}) lost"
            block = context.messages[1]["content"] if context.sources[1]["kind"] == "facts" else ""
            block = block.split("[Memory Summary")[0]
            for value in book.hidden:
                assert value not in block, "a hidden fact was pinned"
        store.add(copy.deepcopy(message))


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("card 4111 1111 1111 1111, order #W2378156", ["#W2378156"]),
        ("my SSN is 123-45-6789", []),
        ("password is Hunter22x, order #W2378156", ["#W2378156"]),
        ("my PIN: 48213", []),
        ("密码是abc12345，订单号是A-48213", ["A-48213"]),
    ],
)
def test_secrets_are_never_extracted(text, kept):
    assert [c.value for c in rule_facts(text, message_id=1)] == kept


def test_european_amounts_and_chinese_mobile_numbers():
    assert values("it was 1.250,50 € in the end") == [("money", "amount", "1.250,50 €")]
    assert values("手机13812345678") == [("phone", "phone", "13812345678")]


def test_user_pinned_facts_may_exceed_the_default_budget_up_to_their_own_bound():
    mine = [
        fact(kind="preference", key=f"pref_{n}", value=f"value {n}", source=n, pinned_by_user=True) for n in range(6)
    ]
    block = facts_block(mine, boundary=None, max_tokens=30, pinned_max_tokens=200, counter=COUNTER)
    assert len(block.pinned) == 6 and block.over_budget == []
    assert 30 < block.tokens <= 200
    tight = facts_block(mine, boundary=None, max_tokens=30, pinned_max_tokens=0, counter=COUNTER)
    assert len(tight.pinned) < 6 and tight.over_budget
