"""HTML forms: they parse and validate input; views act on ``cleaned_data``."""

from __future__ import annotations

from pathlib import PurePath

from django import forms
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile

from chatapp.models import ChatSession

UPLOAD_EXTENSIONS = (".md", ".markdown", ".txt")
# Characters; a fact is a value, not a passage (docs/memory.md §11). The memory app enforces the same limit.
KEY_FACT_VALUE_MAX_CHARS = 200


class SessionCreateForm(forms.Form):
    """A new chat session. ``mode`` is optional ("New chat" posts none: the visitor's last used mode), but an empty
    posted mode is an error."""

    mode = forms.ChoiceField(choices=ChatSession.Mode.choices, required=False)

    def clean_mode(self) -> str:
        mode: str = self.cleaned_data["mode"]
        if not mode and "mode" in self.data:
            raise forms.ValidationError("Choose a mode: agent or quick answer.", code="required")
        return mode


class SessionModeForm(forms.Form):
    """The mode a session uses from its next turn on."""

    mode = forms.ChoiceField(choices=ChatSession.Mode.choices, widget=forms.RadioSelect)


class SessionRenameForm(forms.Form):
    """A session's new title (blank shows "Chat <id>")."""

    title = forms.CharField(max_length=200, required=False, strip=True)


class MessageEditForm(forms.Form):
    """The edited text of a sent user message, as ``chat.send`` takes it (docs/protocol.md)."""

    text = forms.CharField(strip=False, error_messages={"required": "Write the edited message first."})

    def clean_text(self) -> str:
        text: str = self.cleaned_data["text"]
        if not text.strip():
            raise forms.ValidationError("Write the edited message first.")
        if len(text) > settings.CHAT_MAX_MESSAGE_CHARS:
            raise forms.ValidationError(
                f"The message is {len(text)} characters long; the limit is {settings.CHAT_MAX_MESSAGE_CHARS}."
            )
        if "\x00" in text:
            raise forms.ValidationError("The message must not contain NUL characters.")
        return text


class DocumentUploadForm(forms.Form):
    """A UTF-8 text or Markdown file (at most ``KB_MAX_UPLOAD_BYTES``) for the knowledge base, with an optional title;
    ``cleaned_data["text"]`` is the decoded body."""

    file = forms.FileField(help_text="A .md, .markdown or .txt file in UTF-8.")
    title = forms.CharField(
        max_length=200,
        required=False,
        strip=True,
        help_text="Optional; defaults to the first heading or the file name.",
    )

    def clean_file(self) -> UploadedFile:
        upload: UploadedFile = self.cleaned_data["file"]
        name = upload.name or ""
        if PurePath(name).suffix.lower() not in UPLOAD_EXTENSIONS:
            raise forms.ValidationError(
                "Only text and Markdown files can be uploaded (%(extensions)s).",
                code="extension",
                params={"extensions": ", ".join(UPLOAD_EXTENSIONS)},
            )
        limit = settings.KB_MAX_UPLOAD_BYTES
        if upload.size is None or upload.size > limit:
            raise forms.ValidationError(
                "The file is %(size)s bytes; the limit is %(limit)s bytes.",
                code="too_large",
                params={"size": upload.size, "limit": limit},
            )
        raw = upload.read(limit + 1)
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise forms.ValidationError("The file is not UTF-8 text.", code="encoding") from None
        if "\x00" in text:
            raise forms.ValidationError("The file contains NUL characters; it is not a text file.", code="binary")
        if not text.strip():
            raise forms.ValidationError("The file is empty.", code="empty")
        self.cleaned_data["text"] = text
        return upload


class KeyFactPinForm(forms.Form):
    """Pin a key fact into every request's key-facts block, or unpin it."""

    pinned = forms.TypedChoiceField(
        choices=[("true", "pin"), ("false", "unpin")],
        coerce=lambda value: value == "true",
        error_messages={"required": "Say whether to pin or unpin the fact.", "invalid_choice": "Unknown choice."},
    )


class KeyFactHideForm(forms.Form):
    """Hide a key fact from every request, or restore it."""

    hidden = forms.TypedChoiceField(
        choices=[("true", "hide"), ("false", "restore")],
        coerce=lambda value: value == "true",
        error_messages={"required": "Say whether to hide or restore the fact.", "invalid_choice": "Unknown choice."},
    )


class KeyFactEditForm(forms.Form):
    """A key fact's corrected value, stripped, 1 to :data:`KEY_FACT_VALUE_MAX_CHARS` characters."""

    value = forms.CharField(
        max_length=KEY_FACT_VALUE_MAX_CHARS,
        strip=True,
        error_messages={
            "required": "A fact's value cannot be empty.",
            "max_length": "A fact's value is at most %(limit_value)d characters (it has %(show_value)d).",
        },
    )
