"""Typed notes: what a design records of a run beside its answer (a warning, a repaired plan, a cap reached, an
answer settled in code), each made with its kind, so that no reader matches its text.

A `Note` is a str: its text, "Kind: detail", is what states, records and transcripts keep; its `kind` is said
where it is made (`note(kind, detail)`, or `Note(text, kind)` for a text made elsewhere). A note read back from
JSON (a record's trace, a checkpoint) is its text alone: `note_kind` gives the kind of either.
"""

from __future__ import annotations

WARNING = "warning"  # what a run worked around (OPERA's)
MALFORMED = "MalformedOutput"  # a reply that could not be used
INVALID_PLAN = "InvalidPlan"  # a sub-question Mujica's plan repair dropped or changed
ROUND_CAP = "RoundCap"  # the last round: answer now (Mujica's planner)
NO_PROGRESS = "NoProgress"  # a round that planned nothing that can run (Mujica's planner)
SENT_BACK = "SentBack"  # such a round answered with a new turn (Mujica's `send_back_rounds`)


class Note(str):
    """A note's text, as states, records and transcripts keep it, with its `kind`."""

    kind: str

    def __new__(cls, text: str, kind: str) -> Note:
        made = super().__new__(cls, text)
        made.kind = kind
        return made

    def __getnewargs__(self) -> tuple[str, str]:  # a copy keeps its kind
        return str(self), self.kind

    @property
    def detail(self) -> str:
        """The text after its kind."""
        return self.removeprefix(f"{self.kind}: ")


def note(kind: str, detail: str) -> Note:
    """The note "kind: detail"."""
    return Note(f"{kind}: {detail}", kind)


def note_kind(text: str) -> str:
    """The kind of a note: a `Note`'s own; of one read back as text, the word its text starts with."""
    return text.kind if isinstance(text, Note) else text.split(":", 1)[0]
