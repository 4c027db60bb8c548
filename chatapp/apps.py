from __future__ import annotations

from django.apps import AppConfig


class ChatappConfig(AppConfig):
    name = "chatapp"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Chat"
