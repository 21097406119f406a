"""Worked plans: training questions with their sub-goals, kept as a corpus of the store, so that a planner can be
shown the plans of questions like the one at hand (the `plan_examples` setting; `mhqa ingest plans`).

A plan is a passage: its title is the question, its text the sub-goals, one per line, a later one citing an
earlier answer as [AnswerN]. Rows are read from
- 2WikiMultihopQA training files (`qa_pairs`: sub-questions with sentence answers): where a later sub-question
  names what an earlier one answered (a name the question itself does not), that name becomes [AnswerN];
- JSON/JSONL rows {"question": "...", "subgoals": ["...", ...]}.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from os import PathLike

from ..errors import IngestError
from ..types import Passage
from .datasets import flat, per_row
from .files import checked, make_passage

_WORD = re.compile(r"[^\W_]+(?:[.'’-][^\W_]+)*\.?")


def _spans(text: str) -> list[tuple[str, int, int]]:
    return [(m.group(0), m.start(), m.end()) for m in _WORD.finditer(text)]


def _bridge(answer: str, later: str, question: str) -> tuple[int, int] | None:
    """Where `later` names what `answer` (a sentence) says: the longest run of words of `later` found in `answer`
    that starts with a capital or a digit and is not in the question itself. (start, end) in `later`, or None."""
    said = [w.lower().rstrip(".") for w, _, _ in _spans(answer)]
    asked = f" {' '.join(w.lower().rstrip('.') for w, _, _ in _spans(question))} "
    words = _spans(later)
    best: tuple[int, int] | None = None
    for i in range(len(words)):
        if not (words[i][0][0].isupper() or words[i][0][0].isdigit()) or i == 0:
            continue
        for j in range(len(words), i, -1):
            run = [w.lower().rstrip(".") for w, _, _ in words[i:j]]
            if any(said[k:k + len(run)] == run for k in range(len(said) - len(run) + 1)) \
                    and f" {' '.join(run)} " not in asked:
                if best is None or j - i > best[1] - best[0]:
                    best = (i, j)
                break
    return (words[best[0]][1], words[best[1] - 1][2]) if best else None


def subgoals_of(question: str, pairs: list[dict]) -> list[str]:
    """The sub-goals of a 2Wiki `qa_pairs` chain, later ones citing earlier answers as [AnswerN]."""
    goals = [" ".join(str(p.get("question", "")).split()) for p in pairs]
    answers = [" ".join(str(p.get("answer", "")).split()) for p in pairs]
    for j in range(1, len(goals)):
        for i in range(j):
            if span := _bridge(answers[i], goals[j], question):
                goals[j] = goals[j][:span[0]] + f"[Answer{i + 1}]" + goals[j][span[1]:]
    return [g for g in goals if g]


def plan_passage(row: dict) -> Passage:
    """A worked plan from a row ({question, subgoals} or a 2Wiki row with qa_pairs); ValueError if it has none."""
    question = " ".join(str(row.get("question") or "").split())
    if not question:
        raise ValueError("no question")
    if isinstance(row.get("subgoals"), list):
        goals = [" ".join(str(g).split()) for g in row["subgoals"] if str(g).strip()]
    elif isinstance(row.get("qa_pairs"), list):
        goals = subgoals_of(question, [p for p in row["qa_pairs"] if isinstance(p, dict)])
    else:
        raise ValueError('expected "subgoals" or "qa_pairs"')
    if not goals:
        raise ValueError("no sub-goals")
    return make_passage(question, "\n".join(goals), id=str(row.get("_id") or row.get("id") or "") or None)


def read_plans_file(path: str | PathLike[str], yield_errors: bool = False) -> Iterator[Passage | IngestError]:
    """The worked plans of a JSON list or JSONL file; a bad row is an IngestError at its line (raised, or yielded),
    as the dataset readers make it."""
    return checked(flat(per_row(path, lambda row: [plan_passage(row)])), yield_errors)
