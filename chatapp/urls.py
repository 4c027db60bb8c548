"""HTTP routes: the session list, new sessions and the chat page."""

from __future__ import annotations

from django.urls import path

from chatapp import views

urlpatterns = [
    path("", views.index, name="index"),
    path("s/new/", views.session_create, name="session-create"),
    path("s/<int:session_id>/", views.session_detail, name="session-detail"),
]
