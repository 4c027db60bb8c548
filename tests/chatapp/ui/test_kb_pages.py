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
