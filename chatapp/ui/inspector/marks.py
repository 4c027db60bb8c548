"""Transcript marks: where each message stood in the last request."""

from __future__ import annotations

from dataclasses import dataclass

from chatapp.models import Message

MARK_SUMMARIZED = "summarized"
MARK_RETAINED = "retained"
MARK_CURRENT = "current"
# A note the app wrote in place of a reply: shown, never sent to the model (docs/memory.md F-37).
MARK_NOT_SENT = "not-sent"
# Stored after the last request was built (above all, the reply to it): the next request carries it.
MARK_NEXT = "next"
MARK_LABELS = {
    MARK_SUMMARIZED: "in summary",
    MARK_RETAINED: "retained window",
    MARK_CURRENT: "current turn",
    MARK_NOT_SENT: "not sent to the model",
    MARK_NEXT: "next request",
}


@dataclass(frozen=True, kw_only=True)
class MarkBasis:
    """What decides a transcript message's mark: the summary's ``boundary`` (covered: id at most
    the boundary) and the ids the last request sent as retained window and as current turn."""

    boundary: int | None = None
    history_ids: frozenset[int] = frozenset()
    current_ids: frozenset[int] = frozenset()

    @property
    def newest_id(self) -> int | None:
        """The largest message id the last request covered (its summary's boundary, its retained
        window and its current turn); None before any request and any summary."""
        ids = [*self.history_ids, *self.current_ids]
        if self.boundary is not None:
            ids.append(self.boundary)
        return max(ids, default=None)

    def mark(self, message_id: int) -> str:
        """``summarized``, ``retained``, ``current``; ``next`` for a message stored after the last
        request was built -- above all the reply to it, which no request has carried yet, so every
        bubble says where it stands; ``""`` for an older message the last request did not carry."""
        if self.boundary is not None and message_id <= self.boundary:
            return MARK_SUMMARIZED
        if message_id in self.history_ids:
            return MARK_RETAINED
        if message_id in self.current_ids:
            return MARK_CURRENT
        newest = self.newest_id
        if newest is None or message_id > newest:
            return MARK_NEXT
        return ""

    def mark_of(self, message_id: int, origin: str) -> str:
        """:meth:`mark`, except :data:`MARK_NOT_SENT` for a row of ``origin`` ``app``, which no
        request ever holds nor any summary covers (docs/memory.md F-37)."""
        return MARK_NOT_SENT if origin == Message.Origin.APP else self.mark(message_id)


def message_marks_get(*, session_id: int, basis: MarkBasis) -> dict[int, str]:
    """``{message id: mark}`` for every message of the session (see :meth:`MarkBasis.mark_of`)."""
    rows = Message.objects.filter(session_id=session_id).order_by("id").values_list("id", "origin")
    return {message_id: basis.mark_of(message_id, origin) for message_id, origin in rows}
