"""HTTP routes: the session list, the search across chats, chat pages with their partials and actions, the demo, the knowledge base."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from chatapp.ui import demo, views

urlpatterns = [
    path("", views.index, name="index"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("s/new/", views.session_create, name="session-create"),
    path("search/", views.chat_search, name="chat-search"),
    path("demo/", demo.demo_start_view, name="demo"),
    path("s/<int:session_id>/", views.session_detail, name="session-detail"),
    path("s/<int:session_id>/item/", views.session_item, name="session-item"),
    path("s/<int:session_id>/rename/", views.session_rename, name="session-rename"),
    path("s/<int:session_id>/delete/", views.session_delete, name="session-delete"),
    path("s/<int:session_id>/mode/", views.session_mode, name="session-mode"),
    path("s/<int:session_id>/inspector/", views.session_inspector, name="session-inspector"),
    path("s/<int:session_id>/requests/", views.session_requests, name="session-requests"),
    path("s/<int:session_id>/compress/", views.session_compress, name="session-compress"),
    path("s/<int:session_id>/composer/count/", views.session_composer_count, name="session-composer-count"),
    path("s/<int:session_id>/facts/", views.session_key_facts, name="session-key-facts"),
    path("s/<int:session_id>/recall/", views.session_recall, name="session-recall"),
    path("s/<int:session_id>/export.<slug:fmt>", views.session_export, name="session-export"),
    path("s/<int:session_id>/messages/<int:message_id>/fork/", views.session_message_fork, name="session-message-fork"),
    path(
        "s/<int:session_id>/turns/<int:turn_id>/versions/<int:number>/use/",
        views.session_reply_version_use,
        name="session-reply-version-use",
    ),
    path(
        "s/<int:session_id>/turns/<int:turn_id>/versions/<int:number>/",
        views.session_reply_version,
        name="session-reply-version",
    ),
    path("s/<int:session_id>/facts/<int:fact_id>/pin/", views.session_fact_pin, name="session-fact-pin"),
    path("s/<int:session_id>/facts/<int:fact_id>/hide/", views.session_fact_hide, name="session-fact-hide"),
    path("s/<int:session_id>/facts/<int:fact_id>/edit/", views.session_fact_edit, name="session-fact-edit"),
    path("admin/", admin.site.urls),
    path("kb/", views.kb_index, name="kb-index"),
    path("kb/upload/", views.kb_upload, name="kb-upload"),
    path("kb/<int:document_id>/delete/", views.kb_delete, name="kb-delete"),
]
