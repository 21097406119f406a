"""The conclusion guards OPERA and Mujica share, for a question that names two options: `date_comparison` (the
option the dates the steps found pick) and `option_answer` (the option a step that found the answer was about);
their rules are `answers.compare_dates` and `answers.as_option`."""

from __future__ import annotations

from typing import Any

from mhqa_graph.notes import Note, note

from .answers import Step, as_option, compare_dates
from .guards import DATE_COMPARISON, OPTION_ANSWER, apply, is_on

DATE_NOTE = "DateComparison"  # the kind of a design's note on a comparison settled here
OPTION_NOTE = "OptionAnswer"  # the kind of a design's note on an answer mapped to an option


def settle_options(ctx: Any, question: str, answer: str, steps: list[Step], firings: list[dict], said: str,
                   map_option: bool = True) -> tuple[str, Note | None]:
    """(the answer, the note on what changed it, or None) after `date_comparison`, then, when the dates do not
    decide the question, `option_answer` (with `map_option`). `said` names who gave `answer` in the note ("the
    planner concluded"); firings go to `firings`."""
    compared = compare_dates(question, steps) if is_on(ctx, DATE_COMPARISON) else None
    if compared:
        settled = apply(ctx, DATE_COMPARISON, answer, lambda: compared[0], firings)
        made = note(DATE_NOTE, f"settled in code ({compared[1]}); {said} {answer!r}")
        return settled, made if settled != answer else None
    mapped = as_option(question, answer, steps) if map_option and is_on(ctx, OPTION_ANSWER) else None
    if not mapped:
        return answer, None
    settled = apply(ctx, OPTION_ANSWER, answer, lambda: mapped[0], firings)
    return settled, note(OPTION_NOTE, mapped[1]) if settled != answer else None
