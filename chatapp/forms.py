"""HTML forms."""

from __future__ import annotations

from django import forms

from chatapp.models import ChatSession


class SessionCreateForm(forms.Form):
    """A new chat session: its mode (agent or quick-answer)."""

    mode = forms.ChoiceField(choices=ChatSession.Mode.choices, initial=ChatSession.Mode.AGENT)
