"""The knowledge-base page: upload (validated, bounded), list and delete; uploads feed kb_search."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from chatapp.kb.search import kb_search
from chatapp.models import Chunk, Document
from tests.chatapp.conftest import Visitor

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("offline_engine")]

HTMX = {"HX-Request": "true"}
GUIDE = "# Glacier mode\n\nGlacier mode keeps cold files in archive storage for 0.5 euros per TB.\n"


@pytest.fixture(autouse=True)
def anyone_may_edit(settings) -> None:
    """The embedded default's rule (the production shape's default is staff only, tested below)."""
    settings.KB_EDITORS = "anyone"


def upload(client: Client, name: str, body: bytes, *, title: str = "", htmx: bool = True):
    headers = HTMX if htmx else {}
    return client.post("/kb/upload/", {"file": SimpleUploadedFile(name, body), "title": title}, headers=headers)


def test_the_page_lists_documents_and_htmx_gets_the_list_only(anon: Visitor):
    Document.objects.create(slug="d", title="Pricing guide", body="x")
    page = anon.client.get("/kb/")
    assert page.status_code == 200 and b"<html" in page.content and b"Pricing guide" in page.content
    assert b'id="kb-upload"' in page.content
    partial = anon.client.get("/kb/", headers=HTMX).content.decode()
    assert partial.strip().startswith('<div id="kb-documents"') and "<html" not in partial
    assert "Pricing guide" in partial
    assert 'hx-trigger="kb-changed from:body"' in partial


def test_an_upload_is_indexed_and_triggers_a_list_refresh(anon: Visitor):
    response = upload(anon.client, "glacier.md", GUIDE.encode())
    assert response.status_code == 200 and json.loads(response["HX-Trigger"]) == {"kb-changed": {}}
    assert b'data-testid="upload-notice"' in response.content and b"Glacier mode" in response.content
    document = Document.objects.get(slug="upload-glacier")
    assert document.title == "Glacier mode" and document.chunks.exists()
    assert [p.title for p in kb_search("glacier archive storage")] == ["Glacier mode"]


def test_the_same_file_name_replaces_the_document_and_a_title_can_be_given(anon: Visitor):
    upload(anon.client, "notes.txt", b"first version about zebras")
    upload(anon.client, "notes.txt", b"second version about giraffes", title="Animal notes")
    document = Document.objects.get()
    assert document.title == "Animal notes" and "giraffes" in document.body
    assert kb_search("zebras") == [] and len(kb_search("giraffes")) == 1


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        ("tool.exe", b"MZ", b"Only text and Markdown files"),
        ("latin1.txt", "caf\xe9".encode("latin-1"), b"not UTF-8"),
        ("empty.md", b"  \n\n ", b"The file is empty"),
        ("binary.txt", b"a\x00b", b"NUL characters"),
    ],
)
def test_invalid_uploads_are_explained_and_store_nothing(anon: Visitor, name: str, body: bytes, message: bytes):
    response = upload(anon.client, name, body)
    assert response.status_code == 422 and message in response.content and b'aria-invalid="true"' in response.content
    plain = upload(anon.client, name, body, htmx=False)
    assert plain.status_code == 400 and message in plain.content and b"<html" in plain.content
    assert not Document.objects.exists()


def test_uploads_are_bounded_in_size(anon: Visitor, settings):
    settings.KB_MAX_UPLOAD_BYTES = 1024
    response = upload(anon.client, "big.md", b"word " * 300)
    assert response.status_code == 422 and b"the limit is 1024 bytes" in response.content
    assert not Document.objects.exists()


def test_a_plain_upload_redirects_to_the_page(anon: Visitor):
    response = upload(anon.client, "glacier.md", GUIDE.encode(), htmx=False)
    assert response.status_code == 302 and response["Location"] == "/kb/"


def test_delete_removes_the_document_and_its_passages(anon: Visitor):
    upload(anon.client, "glacier.md", GUIDE.encode())
    document = Document.objects.get()
    response = anon.client.post(f"/kb/{document.pk}/delete/", headers=HTMX)
    assert response.status_code == 200 and response.content.decode().strip().startswith('<div id="kb-documents"')
    assert not Document.objects.exists() and not Chunk.objects.exists() and kb_search("glacier") == []
    assert anon.client.post(f"/kb/{document.pk}/delete/", headers=HTMX).status_code == 404
    assert anon.client.get(f"/kb/{document.pk}/delete/").status_code == 405


def test_with_staff_only_editing_others_can_read_but_not_change_the_knowledge_base(anon: Visitor, settings):
    settings.KB_EDITORS = "staff"
    document = Document.objects.create(slug="d", title="Pricing guide", body="x")
    page = anon.client.get("/kb/")
    assert page.status_code == 200 and b"Pricing guide" in page.content
    assert b'id="kb-upload"' not in page.content and b"/delete/" not in page.content
    assert upload(anon.client, "glacier.md", GUIDE.encode()).status_code == 403
    assert anon.client.post(f"/kb/{document.pk}/delete/", headers=HTMX).status_code == 403
    assert list(Document.objects.values_list("slug", flat=True)) == ["d"]


def test_with_staff_only_editing_staff_can_upload_and_delete(settings):
    settings.KB_EDITORS = "staff"
    staff = Client()
    staff.force_login(get_user_model().objects.create_user(username="editor", password="pw-not-used", is_staff=True))
    assert upload(staff, "glacier.md", GUIDE.encode()).status_code == 200
    document = Document.objects.get(slug="upload-glacier")
    assert b'id="kb-upload"' in staff.get("/kb/").content
    assert staff.post(f"/kb/{document.pk}/delete/", headers=HTMX).status_code == 200
    assert not Document.objects.exists()


def test_staff_sign_in_through_the_admin_login_then_may_edit(settings):
    settings.KB_EDITORS = "staff"
    get_user_model().objects.create_user(username="editor", password="correct horse", is_staff=True)
    visitor = Client()
    page = visitor.get("/kb/").content.decode()
    assert 'href="/admin/login/?next=/kb/"' in page and "Staff sign in" in page
    signed_in = visitor.post(
        "/admin/login/?next=/kb/", {"username": "editor", "password": "correct horse", "next": "/kb/"}
    )
    assert signed_in.status_code == 302 and signed_in["Location"] == "/kb/"
    assert upload(visitor, "glacier.md", GUIDE.encode()).status_code == 200
    assert Document.objects.filter(slug="upload-glacier").exists()


def test_a_signed_in_user_who_is_not_staff_is_told_so(settings):
    settings.KB_EDITORS = "staff"
    member = Client()
    member.force_login(get_user_model().objects.create_user(username="member", password="pw-not-used"))
    page = member.get("/kb/").content.decode()
    assert "signed in as member, who is not staff" in page and 'id="kb-upload"' not in page
    assert upload(member, "glacier.md", GUIDE.encode()).status_code == 403


@pytest.mark.parametrize("htmx", [True, False])
def test_uploads_over_the_owners_rate_limit_are_refused_with_429_and_store_nothing(anon: Visitor, rate_limits, htmx):
    rate_limits(upload_owner="2/3600")
    for number in range(2):
        assert upload(anon.client, f"notes-{number}.md", b"notes about zebras", htmx=htmx).status_code in (200, 302)
    refused = upload(anon.client, "notes-2.md", b"notes about giraffes", htmx=htmx)
    assert refused.status_code == 429 and 0 < int(refused["Retry-After"]) <= 3600
    assert b"Too many uploads from this chat&#x27;s owner: at most 2 per 3600 s." in refused.content
    assert Document.objects.count() == 2 and kb_search("giraffes") == []
    other = Client()  # another visitor from the same address is not this owner
    assert upload(other, "notes-3.md", b"notes about lemurs").status_code == 200


def test_uploads_over_the_address_rate_limit_are_refused_for_every_owner_there(rate_limits):
    rate_limits(upload_address="1/60")
    assert upload(Client(REMOTE_ADDR="203.0.113.7"), "a.md", b"alpha").status_code == 200
    refused = upload(Client(REMOTE_ADDR="203.0.113.7"), "b.md", b"beta")
    assert refused.status_code == 429 and b"from this address" in refused.content
    assert upload(Client(REMOTE_ADDR="203.0.113.8"), "c.md", b"gamma").status_code == 200
