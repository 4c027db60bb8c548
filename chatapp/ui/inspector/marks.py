"""Transcript marks: where each message stood in the last request."""

from __future__ import annotations

from dataclasses import dataclass

from chatapp.models import Message

MARK_SUMMARIZED = "summarized"
MARK_RETAINED = "retained"
MARK_CURRENT = "current"
MARK_NOT_SENT = "not-sent"  # an app-written note, never sent to the model (docs/memory.md F-37)
MARK_NEXT = "next"
MARK_FOLDED = "folded"  # folded into the stored summary since the last request (e.g. by the memory job)
MARK_LABELS = {
    MARK_SUMMARIZED: "in summary",
    MARK_RETAINED: "retained window",
    MARK_CURRENT: "current turn",
    MARK_NOT_SENT: "not sent to the model",
    MARK_NEXT: "next request",
    MARK_FOLDED: "next request: in summary",
}


def folded_boundary_of(*, sent: int | None, stored: int | None) -> int | None:
    """The stored summary's boundary if it lies past the one the last request sent, else None."""
    return stored if stored is not None and stored > (sent or 0) else None


@dataclass(frozen=True, kw_only=True)
class MarkBasis:
    """The last request's summary ``boundary`` (ids up to it were covered) and the ids it sent;
    ``folded_boundary`` the stored summary's boundary when it has moved past that one since."""

    boundary: int | None = None
    history_ids: frozenset[int] = frozenset()
    current_ids: frozenset[int] = frozenset()
    folded_boundary: int | None = None

    @property
    def newest_id(self) -> int | None:
        """The largest message id the last request covered; None before any request and summary."""
        ids = [*self.history_ids, *self.current_ids]
        if self.boundary is not None:
            ids.append(self.boundary)
        return max(ids, default=None)

    def mark(self, message_id: int) -> str:
        """``summarized``, ``folded`` (summarized since, for the next request), ``retained``, ``current``,
        ``next`` (stored after the last request, e.g. its reply) or ``""`` (older, and not carried)."""
        if self.boundary is not None and message_id <= self.boundary:
            return MARK_SUMMARIZED
        if self.folded_boundary is not None and message_id <= self.folded_boundary:
            return MARK_FOLDED
        if message_id in self.history_ids:
            return MARK_RETAINED
        if message_id in self.current_ids:
            return MARK_CURRENT
        newest = self.newest_id
        if newest is None or message_id > newest:
            return MARK_NEXT
        return ""

    def mark_of(self, message_id: int, origin: str) -> str:
        """:meth:`mark`, but :data:`MARK_NOT_SENT` for an ``app`` row (docs/memory.md F-37)."""
        return MARK_NOT_SENT if origin == Message.Origin.APP else self.mark(message_id)


def message_marks_get(*, session_id: int, basis: MarkBasis) -> dict[int, str]:
    rows = Message.objects.filter(session_id=session_id).order_by("id").values_list("id", "origin")
    return {message_id: basis.mark_of(message_id, origin) for message_id, origin in rows}
