"""Who may see a chat session: its user or anonymous browser session; anyone else gets ``Http404``, so a stranger
cannot even learn that an id exists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.contrib.sessions.backends.base import SessionBase
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest

from chatapp.models import ChatSession
from chatapp.orm_threads import orm_async

SESSION_ID_MAX = 2**63 - 1  # 64-bit database keys


@dataclass(frozen=True)
class Owner:
    """A user id, else an anonymous browser's session key; with neither it owns nothing."""

    user_id: int | None
    session_key: str | None


def owner_from(request_or_scope: HttpRequest | dict[str, Any]) -> Owner:
    """The owner behind a request or a Channels scope; an anonymous key counts only once the store has loaded it (an
    expired or forged cookie yields none), so it touches the database."""
    user: AbstractBaseUser | AnonymousUser | None
    session: SessionBase | None
    if isinstance(request_or_scope, dict):
        user, session = request_or_scope.get("user"), request_or_scope.get("session")
    else:
        user, session = request_or_scope.user, request_or_scope.session
    if user is not None and user.is_authenticated:
        return Owner(user_id=user.pk, session_key=None)
    return Owner(user_id=None, session_key=_loaded_session_key(session))


def _loaded_session_key(session: SessionBase | None) -> str | None:
    if session is None:
        return None
    # Reading the data loads the store, which drops a key that names no stored session.
    session.keys()
    return session.session_key or None


def owner_ensure(request: HttpRequest) -> Owner:
    """The caller as an owner, first saving a new browser session for an anonymous visitor (so the cookie is set)."""
    owner = owner_from(request)
    if owner.user_id is None and owner.session_key is None:
        request.session.save()
        owner = Owner(user_id=None, session_key=request.session.session_key)
    return owner


def session_queryset_for_owner(owner: Owner) -> QuerySet[ChatSession]:
    if owner.user_id is not None:
        return ChatSession.objects.filter(owner_id=owner.user_id)
    if owner.session_key:
        return ChatSession.objects.filter(owner__isnull=True, owner_session_key=owner.session_key)
    return ChatSession.objects.none()


def session_get_for_owner(request_or_scope: HttpRequest | dict[str, Any], session_id: int) -> ChatSession:
    """The caller's chat session. Raises ``Http404`` for any other, or an id too large for a key (``<int:>`` allows it)."""
    if not 0 < session_id <= SESSION_ID_MAX:
        raise Http404("No such chat session.")
    session = session_queryset_for_owner(owner_from(request_or_scope)).filter(pk=session_id).first()
    if session is None:
        raise Http404("No such chat session.")
    return session


asession_get_for_owner = orm_async(session_get_for_owner)


def kb_editor_allowed(request: HttpRequest) -> bool:
    return settings.KB_EDITORS == "anyone" or bool(request.user.is_authenticated and request.user.is_staff)


def kb_editor_check(request: HttpRequest) -> None:
    if not kb_editor_allowed(request):
        raise PermissionDenied("Only staff users may change the knowledge base.")
