"""The inspector's Key facts section and the owner's controls (docs/memory.md §11): current
facts with their source and extractor, superseded values collapsed with what replaced them,
hidden facts with "restore", where the last request had each fact; pin, edit, hide and restore
for the owner only (404 for another user, another browser and an anonymous stranger); bad input
changes nothing and says why."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from chatapp.chats.memory import memory_key_of
from chatapp.models import ChatSession, Message, ModelCall
from chatapp.realtime.broadcast import event_broadcast
from chatapp.realtime.protocol import MemoryFactsEvent
from chatapp.ui.inspector.facts import (
    FACT_IN_WINDOW,
    FACT_OVER_BUDGET,
    FACT_PINNED,
    FactRow,
    key_fact_from_dict,
    key_facts_build,
)
from chatapp.ui.page_feed import PageFeed
from memory.api import FactCandidate, KeyFact
from memory.storage.facts import key_fact_list, key_facts_apply, key_facts_store_rule
from tests.chatapp.conftest import TIMEOUT, Socket, Visitor, chat_session_make, message_make

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("offline_engine")]

HTMX = {"HX-Request": "true"}


def memory_key(session: ChatSession) -> str:
    return memory_key_of(session.pk)


def said(session: ChatSession, text: str) -> tuple[Message, list[KeyFact]]:
    """A user message of ``session`` and the rule facts stored from it (as at store time)."""
    message = message_make(session, "user", text)
    stored = key_facts_store_rule(
        memory_key=memory_key(session),
        scope_key="owner",
        messages=[
            {
                "id": message.pk,
                "role": "user",
                "content": text,
                "tool_calls": None,
                "created_at": message.created,
            }
        ],
    )
    return message, stored


def facts_of(session: ChatSession) -> dict[int, KeyFact]:
    return {fact.id: fact for fact in key_fact_list(memory_key=memory_key(session))}


def section(html: str) -> str:
    """The Key facts section of a page or partial, CSRF fields left out (masked anew each time)."""
    match = re.search(r'<section id="key-facts".*?</section>', html, re.DOTALL)
    assert match, "no Key facts section"
    return re.sub(r'<input type="hidden" name="csrfmiddlewaretoken" value="[^"]*">', "", match.group(0))


def part(html: str, start: str, end: str) -> str:
    """``html`` from the first ``start`` to the next ``end`` (both included)."""
    at = html.index(start)
    return html[at : html.index(end, at) + len(end)]


def fact_item(html: str, fact_id: int) -> str:
    return part(html, f'<li id="fact-{fact_id}"', "</li>")


def fact_url(name: str, session: ChatSession, fact_id: int) -> str:
    return reverse(name, kwargs={"session_id": session.pk, "fact_id": fact_id})


@pytest.fixture
def chat(alice: Visitor) -> tuple[ChatSession, KeyFact]:
    """Alice's chat with one rule fact: the order id ``#W2378156``."""
    session = chat_session_make(alice.owner)
    _, (order,) = said(session, "my order is #W2378156")
    return session, order


# --- the section ---------------------------------------------------------------------------------


def test_the_section_lists_current_superseded_and_hidden_facts(alice: Visitor):
    session = chat_session_make(alice.owner)
    first, (old_address,) = said(session, "ship it to zip 90210 please")
    _, (email,) = said(session, "my email is ada@example.com")
    _, (card,) = said(session, "pay with the card ending in 4421")
    second = message_make(session, "user", "sorry, the zip is 10115")
    (new_address,) = key_facts_apply(
        memory_key=memory_key(session),
        scope_key="owner",
        candidates=[
            FactCandidate(
                kind="id",
                key=old_address.key,
                value="10115",
                text="user's zip code 10115",
                source_message_id=second.pk,
                extractor="llm:offline",
                supersedes=(old_address.id,),
            )
        ],
        valid_from={},
    )
    alice.client.post(fact_url("session-fact-hide", session, card.id), {"hidden": "true"}, headers=HTMX)

    html = section(alice.client.get(reverse("session-detail", kwargs={"session_id": session.pk})).content.decode())
    assert html == section(
        alice.client.get(reverse("session-key-facts", kwargs={"session_id": session.pk}), headers=HTMX).content.decode()
    )
    current = part(html, 'data-testid="facts-current"', "</ul>")
    superseded = part(html, '<details id="facts-superseded"', "</details>")
    hidden = part(html, 'data-testid="facts-hidden"', "</ul>")

    # Current: kind, slot, verbatim value, a link to the source message, the extractor.
    item = fact_item(current, new_address.id)
    assert f'data-key="{old_address.key}"' in item and ">10115</strong>" in item and ">id</span>" in item
    assert f'href="#message-{second.pk}"' in item and "LLM (offline)" in item and "replaces 90210" in item
    item = fact_item(current, email.id)
    assert ">ada@example.com</strong>" in item and ">email</span>" in item and ">rule<" in item
    assert f'<li id="fact-{old_address.id}"' not in current and f'<li id="fact-{card.id}"' not in current
    # Superseded: collapsed, with the value that replaced it; hidden: listed apart, with Restore.
    item = fact_item(superseded, old_address.id)
    assert "<s " in item and ">90210</s>" in item and f'href="#message-{first.pk}"' in item
    assert '<strong data-testid="fact-replaced-by">10115</strong>' in item
    item = fact_item(hidden, card.id)
    assert ">4421</span>" in item and 'name="hidden" value="false"' in item and ">Restore</button>" in item


def test_a_fact_shows_its_slot_only_when_the_kind_does_not_say_it_and_a_rule_restates_nothing(alice: Visitor):
    session = chat_session_make(alice.owner)
    _, (order,) = said(session, "my order is #W2378156")
    _, (email,) = said(session, "my email is ada@example.com")
    source = message_make(session, "user", "I prefer tea")
    (tea,) = key_facts_apply(
        memory_key=memory_key(session),
        scope_key="owner",
        candidates=[
            FactCandidate(
                kind="preference",
                key="preference",
                value="tea",
                text="prefers tea to coffee",
                source_message_id=source.pk,
                extractor="llm:offline",
            )
        ],
        valid_from={},
    )
    html = section(alice.client.get(reverse("session-detail", kwargs={"session_id": session.pk})).content.decode())

    # "id order_id", but "email" and "preference" once, not "email email".
    assert '<code class="fact-key">order_id</code>' in fact_item(html, order.id)
    assert "fact-key" not in fact_item(html, email.id) and "fact-key" not in fact_item(html, tea.id)
    # A rule's text only says "user gave order id #W2378156": left out; the LLM's note is shown.
    assert order.text and order.text not in html and "fact-text" not in fact_item(html, order.id)
    assert '<p class="fact-text">prefers tea to coffee</p>' in fact_item(html, tea.id)
    # The pin control says what it does, with a title that explains it.
    item = fact_item(html, order.id)
    assert ">Keep always</button>" in item and 'title="Pin it in every request' in item and ">Pin<" not in item
    alice.client.post(fact_url("session-fact-pin", session, order.id), {"pinned": "true"}, headers=HTMX)
    item = fact_item(
        section(alice.client.get(reverse("session-detail", kwargs={"session_id": session.pk})).content.decode()),
        order.id,
    )
    assert ">always pinned by you</span>" in item and ">Stop keeping always</button>" in item


def test_a_chat_without_facts_says_so(alice: Visitor):
    session = chat_session_make(alice.owner)
    html = section(alice.client.get(reverse("session-detail", kwargs={"session_id": session.pk})).content.decode())
    assert "No key facts yet" in html and "facts-superseded" not in html and "facts-hidden" not in html


def test_the_last_request_says_which_facts_were_pinned_in_the_window_or_over_budget(alice: Visitor):
    session = chat_session_make(alice.owner)
    _, (order, email, amount) = said(session, "order #W2378156, mail ada@example.com, refund $120.50")
    request_make(session, {"pinned": [order.id], "in_window": [email.id], "over_budget": [amount.id], "tokens": 23})
    html = section(alice.client.get(reverse("session-detail", kwargs={"session_id": session.pk})).content.decode())
    assert "a block of 23 tokens, 1 not pinned for lack of budget" in html
    statuses = {
        fact.id: re.search(r'data-status="([a-z_]*)"', fact_item(html, fact.id)).group(1)  # type: ignore[union-attr]
        for fact in (order, email, amount)
    }
    assert statuses == {order.id: FACT_PINNED, email.id: FACT_IN_WINDOW, amount.id: FACT_OVER_BUDGET}
    assert ">not pinned (budget)</span>" in fact_item(html, amount.id)
    assert ">in the window</span>" in fact_item(html, email.id)
    assert ">pinned in the block</span>" in fact_item(html, order.id)


def test_the_section_is_built_from_the_json_form_a_socket_event_carries(alice: Visitor):
    session = chat_session_make(alice.owner)
    said(session, "my order is #W2378156")
    stored = key_fact_list(memory_key=memory_key(session))
    assert [key_fact_from_dict(fact.as_dict()) for fact in stored] == stored
    built = key_facts_build(session_id=session.pk, facts=stored, request={"pinned": [stored[0].id]})
    assert [row.fact for row in built.current] == stored and built.current[0].status == FACT_PINNED


def test_facts_the_owner_pinned_are_listed_first():
    facts = [
        KeyFact(id=1, kind="id", key="order_id", value="#W1", text="", source_message_id=1),
        KeyFact(id=2, kind="id", key="order_id", value="#W2", text="", source_message_id=2, pinned_by_user=True),
        KeyFact(id=3, kind="email", key="email", value="a@b.co", text="", source_message_id=3),
    ]
    built = key_facts_build(session_id=1, facts=facts, request=None)
    assert [row.fact.id for row in built.current] == [2, 3, 1] and built.block_tokens is None


# --- live updates ---------------------------------------------------------------------------------


def request_make(session: ChatSession, facts: dict[str, Any]) -> ModelCall:
    """A recorded model call of ``session`` whose snapshot has the key-facts groups ``facts``."""
    return ModelCall.objects.create(
        session=session,
        mode=session.mode,
        model="offline",
        estimated_tokens=100,
        context={
            "messages": [{"role": "system", "content": "You help."}],
            "sources": [{"id": None, "kind": "system"}],
            "tokens": 100,
            "sections": {"system": 100},
            "context_window": 2048,
            "trigger_tokens": 1024,
            "target_tokens": 614,
            "summary": {"type": "none", "content": "", "last_message_id": None, "compressed_count": 0, "version": 0},
            "facts": facts,
        },
    )


def test_memory_facts_re_renders_the_section_from_the_event_alone(alice: Visitor):
    session = chat_session_make(alice.owner)
    _, (order,) = said(session, "my order is #W2378156")
    request_make(session, {"pinned": [], "in_window": [order.id], "over_budget": [], "tokens": 0})
    feed = PageFeed(session_id=session.pk)
    feed.snapshot()
    # The memory job found a new fact meanwhile: the event carries every fact of the chat.
    _, (email,) = said(session, "write to ada@example.com")
    event = MemoryFactsEvent(
        turn_id=None, step=0, facts=[f.as_dict() for f in key_fact_list(memory_key=memory_key(session))]
    )
    with CaptureQueriesContext(connection) as queries:
        assert not feed.needs_database(event)
        html = feed.render(event)
    assert len(queries) == 0
    assert html.strip().startswith(
        '<section id="key-facts" class="panel key-facts" aria-labelledby="ins-key-facts" data-testid="key-facts" hx-swap-oob="true">'
    )
    # The same section the page shows, with where the last request had each fact.
    page = alice.client.get(reverse("session-detail", kwargs={"session_id": session.pk})).content.decode()
    assert section(html).replace(' hx-swap-oob="true"', "") == section(page)
    assert 'data-status="in_window"' in fact_item(html, order.id) and 'data-status=""' in fact_item(html, email.id)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("db_connections_closed")
async def test_the_page_socket_shows_new_facts_live(alice: Visitor, ws: Socket):
    session = await ChatSession.objects.acreate(owner_id=alice.owner.user_id, mode=ChatSession.Mode.AGENT)
    async with ws(f"/ws/chat/{session.pk}/page/", cookie=alice.cookie) as page:
        connected, _ = await page.connect(timeout=TIMEOUT)
        assert connected
        snapshot = await page.receive_from(timeout=TIMEOUT)
        assert "No key facts yet" in snapshot
        fact = KeyFact(
            id=7, kind="id", key="order_id", value="#W2378156", text="user gave order id #W2378156", source_message_id=3
        )
        await event_broadcast(session.pk, MemoryFactsEvent(turn_id=None, step=0, facts=[fact.as_dict()]))
        frame = await page.receive_from(timeout=TIMEOUT)
    assert frame.strip().startswith('<section id="key-facts"') and 'hx-swap-oob="true"' in frame
    assert ">#W2378156</strong>" in frame and 'href="#message-3"' in frame and "No key facts yet" not in frame


# --- the owner's controls --------------------------------------------------------------------------

# (url name, POST data, what the stored fact looks like after the owner's request)
CONTROLS: dict[str, tuple[str, dict[str, str]]] = {
    "pin": ("session-fact-pin", {"pinned": "true"}),
    "unpin": ("session-fact-pin", {"pinned": "false"}),
    "hide": ("session-fact-hide", {"hidden": "true"}),
    "restore": ("session-fact-hide", {"hidden": "false"}),
    "edit": ("session-fact-edit", {"value": "#W9999999"}),
}


def controls_prepared(control: str, session: ChatSession, fact: KeyFact, owner: Visitor) -> None:
    """Put ``fact`` in the state where ``control`` changes something (pinned to unpin it, ...)."""
    if control == "unpin":
        owner.client.post(fact_url("session-fact-pin", session, fact.id), {"pinned": "true"}, headers=HTMX)
    if control == "restore":
        owner.client.post(fact_url("session-fact-hide", session, fact.id), {"hidden": "true"}, headers=HTMX)


CHANGED: dict[str, Callable[[dict[int, KeyFact], KeyFact], bool]] = {
    "pin": lambda facts, fact: facts[fact.id].pinned_by_user,
    "unpin": lambda facts, fact: not facts[fact.id].pinned_by_user,
    "hide": lambda facts, fact: facts[fact.id].hidden_by_user,
    "restore": lambda facts, fact: not facts[fact.id].hidden_by_user,
    "edit": lambda facts, fact: (
        facts[fact.id].invalidated_at is not None
        and any(f.value == "#W9999999" and f.extractor == "user" for f in facts.values())
    ),
}


@pytest.mark.parametrize("control", list(CONTROLS))
@pytest.mark.parametrize("owner_kind", ["user", "anonymous"])
def test_each_control_is_for_the_owner_only(
    control: str, owner_kind: str, alice: Visitor, bob: Visitor, anon: Visitor, anon2: Visitor
):
    owner, others = (alice, [bob, anon]) if owner_kind == "user" else (anon, [anon2, alice])
    session = chat_session_make(owner.owner)
    _, (fact,) = said(session, "my order is #W2378156")
    controls_prepared(control, session, fact, owner)
    name, data = CONTROLS[control]
    before = facts_of(session)

    for stranger in [*others, None]:
        client = stranger.client if stranger else Client()
        response = client.post(fact_url(name, session, fact.id), data, headers=HTMX)
        assert response.status_code == 404 and b"W2378156" not in response.content
        assert (
            client.get(reverse("session-key-facts", kwargs={"session_id": session.pk}), headers=HTMX).status_code == 404
        )
    assert facts_of(session) == before

    response = owner.client.post(fact_url(name, session, fact.id), data, headers=HTMX)
    assert response.status_code == 200
    assert CHANGED[control](facts_of(session), fact)
    # The answer is the re-rendered section, showing the change, and an announcement.
    html = response.content.decode()
    assert (
        html.strip().startswith('<section id="key-facts"')
        and "chat:announce" in response.headers["HX-Trigger-After-Swap"]
    )


def test_a_fact_of_another_chat_or_no_fact_at_all_is_a_404(alice: Visitor, bob: Visitor, chat):
    session, order = chat
    own_other = chat_session_make(alice.owner)
    bobs = chat_session_make(bob.owner)
    _, (bobs_fact,) = said(bobs, "my booking is KX-55190")
    before = {**facts_of(session), **facts_of(bobs)}
    for name, data in CONTROLS.values():
        # Bob's fact through Alice's chat, Alice's own fact through her other chat, no fact at all.
        for target, fact_id in [(session, bobs_fact.id), (own_other, order.id), (session, 987654), (session, 2**63)]:
            response = alice.client.post(fact_url(name, target, fact_id), data, headers=HTMX)
            assert response.status_code == 404, (name, fact_id)
            assert b"KX-55190" not in response.content
    # Even with bad input the answer for a fact that is not the chat's is 404, not an error form.
    response = alice.client.post(fact_url("session-fact-edit", session, bobs_fact.id), {"value": ""}, headers=HTMX)
    assert response.status_code == 404
    assert {**facts_of(session), **facts_of(bobs)} == before


def test_the_controls_are_post_only(alice: Visitor, chat):
    session, order = chat
    for name, _ in CONTROLS.values():
        assert alice.client.get(fact_url(name, session, order.id)).status_code == 405


# --- edit ------------------------------------------------------------------------------------------


def test_an_edit_makes_a_user_fact_and_keeps_the_old_one_superseded(alice: Visitor, chat):
    session, order = chat
    response = alice.client.post(
        fact_url("session-fact-edit", session, order.id), {"value": "  #W2378157 "}, headers=HTMX
    )
    assert response.status_code == 200
    facts = facts_of(session)
    (new,) = (fact for fact in facts.values() if fact.id != order.id)
    old = facts[order.id]
    assert (new.value, new.extractor, new.key, new.kind) == ("#W2378157", "user", order.key, order.kind)
    assert new.source_message_id == order.source_message_id and new.replaces == order.value and new.active
    assert old.invalidated_at is not None and old.superseded_by == new.id and old.value == "#W2378156"
    # The section shows the new value as current, by "you", and the old one among the superseded.
    html = section(response.content.decode())
    current = part(html, 'data-testid="facts-current"', "</ul>")
    assert ">#W2378157</strong>" in current and ">you</span>" in current and "#W2378156</s>" not in current
    superseded = part(html, '<details id="facts-superseded"', "</details>")
    assert ">#W2378156</s>" in superseded and "(your edit)" in superseded


def test_a_plain_post_goes_back_to_the_chat_page(alice: Visitor, chat):
    session, order = chat
    response = alice.client.post(fact_url("session-fact-pin", session, order.id), {"pinned": "true"})
    assert response.status_code == 302
    assert response["Location"] == reverse("session-detail", kwargs={"session_id": session.pk}) + "#key-facts"
    assert facts_of(session)[order.id].pinned_by_user


# --- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("session-fact-edit", {"value": ""}, "A fact&#x27;s value cannot be empty."),
        ("session-fact-edit", {"value": "   "}, "A fact&#x27;s value cannot be empty."),
        ("session-fact-edit", {}, "A fact&#x27;s value cannot be empty."),
        ("session-fact-edit", {"value": "x" * 201}, "at most 200 characters (it has 201)"),
        ("session-fact-pin", {"pinned": "maybe"}, "Unknown choice."),
        ("session-fact-pin", {}, "Say whether to pin or unpin the fact."),
        ("session-fact-hide", {"hidden": "1"}, "Unknown choice."),
    ],
)
def test_bad_input_changes_nothing_and_says_why(alice: Visitor, chat, name: str, data: dict[str, Any], message: str):
    session, order = chat
    before = facts_of(session)
    response = alice.client.post(fact_url(name, session, order.id), data, headers=HTMX)
    html = response.content.decode()
    # htmx swaps a 422 (see htmx-config in base.html): the section, with the error.
    assert response.status_code == 422 and html.strip().startswith('<section id="key-facts"')
    assert re.search(
        r'<p class="error-text" role="alert" data-testid="key-facts-error">[^<]*' + re.escape(message), html
    )
    assert facts_of(session) == before
    if name == "session-fact-edit":
        assert f'<details id="fact-edit-{order.id}" class="fact-edit" open>' in html and 'aria-invalid="true"' in html
    # Without htmx: the chat page with the error, 400.
    response = alice.client.post(fact_url(name, session, order.id), data)
    assert response.status_code == 400 and message in section(response.content.decode())
    assert 'id="chat-page"' in response.content.decode() and facts_of(session) == before


def test_a_200_character_value_is_accepted(alice: Visitor, chat):
    session, order = chat
    value = "A" * 200
    response = alice.client.post(fact_url("session-fact-edit", session, order.id), {"value": value}, headers=HTMX)
    assert response.status_code == 200 and any(fact.value == value for fact in facts_of(session).values())


def test_a_superseded_fact_cannot_be_edited(alice: Visitor, chat):
    session, order = chat
    alice.client.post(fact_url("session-fact-edit", session, order.id), {"value": "#W1111111"}, headers=HTMX)
    before = facts_of(session)
    response = alice.client.post(fact_url("session-fact-edit", session, order.id), {"value": "#W2222222"}, headers=HTMX)
    assert response.status_code == 422 and "was superseded" in section(response.content.decode())
    assert facts_of(session) == before


def test_the_controls_need_the_csrf_token_htmx_sends_in_its_header(alice: Visitor, chat):
    session, order = chat
    client = Client(enforce_csrf_checks=True)
    client.cookies = alice.client.cookies
    client.get(reverse("session-detail", kwargs={"session_id": session.pk}))  # sets the CSRF cookie
    pin = fact_url("session-fact-pin", session, order.id)
    response = client.post(pin, {"pinned": "true"}, headers=HTMX)
    assert response.status_code == 403 and not facts_of(session)[order.id].pinned_by_user
    token = client.cookies["csrftoken"].value
    response = client.post(pin, {"pinned": "true"}, headers={**HTMX, "X-CSRFToken": token})
    assert response.status_code == 200 and facts_of(session)[order.id].pinned_by_user


@pytest.mark.parametrize(
    ("extractor", "label"),
    [
        ("rule", "rule"),
        ("user", "you"),
        ("llm:gpt-4o-mini", "LLM (gpt-4o-mini)"),
        # The offline engine answers extraction requests with patterns: no language model found it.
        ("llm:offline-engine", "offline engine (no language model)"),
    ],
)
def test_the_inspector_says_who_found_a_fact(extractor: str, label: str):
    fact = KeyFact(id=1, kind="id", key="user_id", value="ACC-9902", text="", source_message_id=1, extractor=extractor)
    assert FactRow(fact=fact).extractor_label == label


def test_withdrawn_and_corrected_facts_are_marked_with_the_message_that_changed_them(alice: Visitor):
    session = chat_session_make(alice.owner)
    _, (office, mobile) = said(session, "My office phone is 020 7946 0958 and my mobile is 07700 900123.")
    _, (order,) = said(session, "My order #W2378156 arrived damaged.")
    withdrawal, _ = said(session, "I no longer have the office line, I left that job.")
    correction, (fixed,) = said(session, "Hold on, I meant #W2378165.")

    html = section(alice.client.get(reverse("session-detail", kwargs={"session_id": session.pk})).content.decode())
    superseded = part(html, '<details id="facts-superseded"', "</details>")

    item = fact_item(superseded, office.id)
    assert 'data-status="retracted"' in item and f"withdrawn in message #{withdrawal.pk}" in item
    assert f'href="#message-{withdrawal.pk}"' in item
    item = fact_item(superseded, order.id)
    assert 'data-status="superseded"' in item and f"corrected in message #{correction.pk}" in item
    assert '<strong data-testid="fact-replaced-by">#W2378165</strong>' in item
    current = part(html, 'data-testid="facts-current"', "</ul>")
    assert f'<li id="fact-{mobile.id}"' in current and f'<li id="fact-{fixed.id}"' in current


def test_a_value_from_pasted_text_is_shown_as_mentioned(alice: Visitor):
    session = chat_session_make(alice.owner)
    log = "2026-11-24 09:01:12 ERROR request A-48213 failed\n2026-11-24 09:01:13 ERROR request A-48214 failed"
    _, (own, *pasted) = said(session, f"My order #W2378156 failed. Their log:\n{log}")

    html = section(alice.client.get(reverse("session-detail", kwargs={"session_id": session.pk})).content.decode())

    assert pasted and all(fact.provenance == "mentioned" for fact in pasted)
    assert 'data-testid="fact-provenance">mentioned<' in fact_item(html, pasted[0].id)
    assert 'data-testid="fact-provenance"' not in fact_item(html, own.id)
