"""The inspector's history: any earlier request of a chat from its ``ModelCall`` snapshot, with the compressions
recorded since the request before it."""

from __future__ import annotations

from dataclasses import dataclass

from chatapp.chats.memory import memory_engine, memory_key_of
from chatapp.models import ModelCall
from chatapp.ui.inspector.request import RequestSnapshot, request_snapshot_build
from chatapp.ui.inspector.summary import TimelineEvent

HISTORY_MAX_EVENTS = 200  # the newest compression events searched for those between two requests


@dataclass(frozen=True, kw_only=True)
class RequestHistoryPage:
    """One request, ``position`` of ``total`` (1 the first); ``compressions`` oldest first, recorded after the earlier
    request and before this one (those inside this request included)."""

    request: RequestSnapshot
    position: int
    total: int
    earlier_id: int | None
    later_id: int | None
    first_id: int
    last_id: int
    compressions: list[TimelineEvent]


def request_history_get(*, session_id: int, model_call_id: int | None) -> RequestHistoryPage | None:
    """Request ``model_call_id`` of the session (the newest when None); None when the session has no such request.
    No access check: callers authorize."""
    calls = ModelCall.objects.filter(session_id=session_id)
    call = (calls.filter(pk=model_call_id) if model_call_id is not None else calls.order_by("-id")).first()
    if call is None:
        return None
    earlier = calls.filter(id__lt=call.pk).order_by("-id").values_list("id", "created").first()
    ids = calls.values_list("id", flat=True)
    events = memory_engine().events(memory_key_of(session_id), limit=HISTORY_MAX_EVENTS)
    compressions = [
        event
        for event in map(TimelineEvent.from_record, events)
        if event.created_at <= call.created and (earlier is None or event.created_at > earlier[1])
    ]
    return RequestHistoryPage(
        request=request_snapshot_build(call),
        position=calls.filter(id__lte=call.pk).count(),
        total=calls.count(),
        earlier_id=earlier[0] if earlier else None,
        later_id=ids.filter(id__gt=call.pk).order_by("id").first(),
        first_id=ids.order_by("id").first() or call.pk,
        last_id=ids.order_by("-id").first() or call.pk,
        compressions=compressions,
    )
