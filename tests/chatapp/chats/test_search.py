"""Search across one owner's chats, on SQLite FTS5 and (with ``DATABASE_URL``) PostgreSQL: only the owner's messages,
only what a person reads, every term required, the last one a prefix while typed; any text, query syntax included,
gives a status, never an error; snippets are plain runs with the matches marked."""

from __future__ import annotations

import pytest
from django.db import connection

from chatapp.chats.access import Owner
from chatapp.chats.search import SEARCH_MAX_CHARS, MessageSearch, message_search_for_owner, search_terms
from chatapp.models import ChatSession, Message
from tests.chatapp.conftest import Visitor, chat_session_make, message_make

pytestmark = pytest.mark.django_db


def found(owner: Owner, query: str) -> list[int]:
    return [hit.message_id for hit in message_search_for_owner(owner=owner, query=query).hits]


def fts_consistent() -> None:
    """SQLite: the index is sound and holds exactly the messages a person reads (its triggers removed what they added)."""
    if connection.vendor != "sqlite":
        return
    readable = Message.objects.filter(role__in=["user", "assistant"], origin="model").exclude(content__isnull=True)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO chatapp_message_fts(chatapp_message_fts) VALUES ('integrity-check')")
        cursor.execute("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, chatapp_message_fts, instance)")
        cursor.execute("SELECT DISTINCT doc FROM temp.vocab")
        indexed = {row[0] for row in cursor.fetchall()}
        cursor.execute("DROP TABLE temp.vocab")
    assert indexed == set(readable.exclude(content="").values_list("pk", flat=True))


@pytest.fixture
def chats(alice: Visitor, bob: Visitor, anon: Visitor, anon2: Visitor) -> dict[str, Message]:
    """The same word in the chats of four owners, and what is never searched."""
    made = {}
    for name, visitor in (("alice", alice), ("bob", bob), ("anon", anon), ("anon2", anon2)):
        session = chat_session_make(visitor.owner, title=f"{name}'s plans")
        made[name] = message_make(session, "user", f"My kumquat budgets for {name} are ready.")
    session = ChatSession.objects.get(pk=made["alice"].session_id)
    made["reply"] = message_make(session, "assistant", "The zebra kumquat costs 4 €.", reply_to=made["alice"])
    other = chat_session_make(alice.owner, title="Second chat")
    made["other"] = message_make(other, "user", "Running late: the kumquat zebra left.")
    calls = [{"id": "c1", "type": "function", "function": {"name": "kb_search", "arguments": '{"query": "kumquat"}'}}]
    made["call"] = message_make(other, "assistant", None, tool_calls=calls)
    made["tool"] = message_make(other, "tool", "kumquat passages", tool_call_id="c1", name="kb_search")
    made["note"] = message_make(other, "assistant", "kumquat error note", origin=Message.Origin.APP, status="error")
    return made


def test_only_the_owners_messages_that_a_person_reads_are_found(chats: dict[str, Message], alice, bob, anon, anon2):
    assert sorted(found(alice.owner, "kumquat")) == sorted([chats["alice"].pk, chats["reply"].pk, chats["other"].pk])
    assert found(bob.owner, "kumquat") == [chats["bob"].pk]
    assert found(anon.owner, "kumquat") == [chats["anon"].pk]
    assert found(anon2.owner, "kumquat") == [chats["anon2"].pk]
    # A logged-in user's key never reaches anonymous chats, and no owner at all owns nothing.
    assert found(Owner(user_id=alice.owner.user_id, session_key=anon.owner.session_key), "kumquat") == found(
        alice.owner, "kumquat"
    )
    assert found(Owner(user_id=None, session_key=None), "kumquat") == []
    assert found(Owner(user_id=None, session_key="not-a-key"), "kumquat") == []
    hit = message_search_for_owner(owner=bob.owner, query="kumquat").hits[0]
    assert (hit.title, hit.session_id, hit.role) == ("bob's plans", chats["bob"].session_id, "user")


def test_every_term_is_required_stemmed_and_the_last_is_a_prefix_while_typed(chats: dict[str, Message], alice):
    assert found(alice.owner, "zebra kumquat") == found(alice.owner, "kumquat zebra")
    assert sorted(found(alice.owner, "zebra kumquat")) == sorted([chats["reply"].pk, chats["other"].pk])
    assert found(alice.owner, "budget") == [chats["alice"].pk]  # "budgets", stemmed
    assert found(alice.owner, "run") == [chats["other"].pk]  # "Running"
    assert found(alice.owner, "kumq") == found(alice.owner, "kumquat") != []
    assert found(alice.owner, "kumq ") == []  # a finished word is matched whole
    assert found(alice.owner, "zeb kumquat") == []  # only the last word is a prefix
    # No operator survives: "-" is not NOT, "OR" and "AND" are common words, "*" is no wildcard.
    assert sorted(found(alice.owner, "kumquat -zebra")) == sorted([chats["reply"].pk, chats["other"].pk])
    assert sorted(found(alice.owner, "zebra OR budgets")) == []
    assert found(alice.owner, "ku* zebra") == []


def test_the_plain_text_of_the_snippet_marks_the_match(alice):
    session = chat_session_make(alice.owner, title="<b>HTML</b> & co")
    message = message_make(session, "user", "Is <script>alert('kumquat')</script> & <b>bold</b>\n\nsafe?")
    search = message_search_for_owner(owner=alice.owner, query="kumquat")
    (hit,) = search.hits
    assert hit.message_id == message.pk and hit.title == "<b>HTML</b> & co"
    assert ("kumquat", True) in hit.snippet
    text = "".join(run for run, _ in hit.snippet)
    # As written, whitespace collapsed (PostgreSQL's fragment starts and ends at a word).
    assert "script>alert('" in text and "</script> & <b>bold</b> safe" in text
    assert [run for run, matched in hit.snippet if matched] == ["kumquat"]


QUERIES = [
    ('"kumquat"', "found"),
    ("kumquat*", "found"),
    ("(kumquat", "found"),
    ("kumquat)", "found"),
    ('"kumquat', "found"),
    ("-kumquat", "found"),
    ("^kumquat", "found"),
    ("content:kumquat", "none"),  # a column filter is just two words here
    ("NEAR(kumquat zebra)", "none"),
    ("kumquat NEAR zebra", "none"),
    ("kumquat AND -zebra", "found"),
    ("kumquat OR nothinghere", "none"),
    ("kumquat & !zebra | (x:*", "none"),
    ("kumquat'; DROP TABLE chatapp_message; --", "none"),
    ("k\\umquat", "none"),
    ("kum\x00quat", "none"),
    ("ab_cd", "none"),
    ("___", "no_words"),
    ('*** "" () : ^ -', "no_words"),
    ("€ ✓", "no_words"),
    ("", "empty"),
    ("   ", "empty"),
    ("the is", "common_words"),
    ("x" * (SEARCH_MAX_CHARS + 1), "too_long"),
    ("kumquat " * 20, "found"),
]


@pytest.mark.parametrize(("query", "status"), QUERIES)
def test_any_text_gives_a_status_never_an_error(chats: dict[str, Message], alice, query: str, status: str):
    search = message_search_for_owner(owner=alice.owner, query=query)
    assert isinstance(search, MessageSearch)
    assert search.status == status, search
    assert (search.status == "found") == bool(search.hits)


def test_terms_drop_common_words_and_keep_the_typed_prefix():
    terms = search_terms("What is the Kumquat bud")
    assert not isinstance(terms, str)
    assert (terms.exact, terms.prefix) == (("kumquat",), "bud")
    terms = search_terms("ks-312 budget.")
    assert not isinstance(terms, str)
    assert (terms.exact, terms.prefix) == (("ks-312", "budget"), "")


def test_at_most_limit_matches_and_whether_more_were_left_out(alice):
    session = chat_session_make(alice.owner)
    made = [message_make(session, "user", f"kumquat number {n}").pk for n in range(4)]
    search = message_search_for_owner(owner=alice.owner, query="kumquat", limit=3)
    assert len(search.hits) == 3 and search.more and {hit.message_id for hit in search.hits} < set(made)
    assert not message_search_for_owner(owner=alice.owner, query="kumquat", limit=4).more


def test_cjk_words_are_found_as_they_start(alice):
    session = chat_session_make(alice.owner)
    message = message_make(session, "user", "东京的天气很好")
    assert found(alice.owner, "东京") == [message.pk]


def test_the_index_follows_edits_and_deletions(chats: dict[str, Message], alice):
    message = chats["other"]
    Message.objects.filter(pk=message.pk).update(content="A mango instead.")
    assert message.pk not in found(alice.owner, "kumquat")
    assert found(alice.owner, "mango") == [message.pk]
    Message.objects.filter(pk=chats["note"].pk).update(origin=Message.Origin.MODEL)
    assert chats["note"].pk in found(alice.owner, "kumquat")
    fts_consistent()
    ChatSession.objects.filter(pk=message.session_id).delete()
    assert found(alice.owner, "mango") == []
    assert sorted(found(alice.owner, "kumquat")) == sorted([chats["alice"].pk, chats["reply"].pk])
    fts_consistent()
