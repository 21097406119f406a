"""OPERA's plan as the Plan agent writes it: sub-goals read from its reply, placeholders naming earlier answers
(`[Answer2]`, `[entity from step 2]`, `{Answer2}`, `<Answer2>`, `#2`) and the dependencies they imply."""

from __future__ import annotations

import re
from typing import Any

from ..mechanisms import RELATION_QUESTION, as_relation
from .replies import Plan, RelationPlan, RelationSubgoal

# -- placeholders ----------------------------------------------------------------------
_BRACKETED = re.compile(r"\[([^\[\]]{1,60})\]|\{([^{}]{1,60})\}|<([^<>]{1,60})>")

_NAMES_STEP = re.compile(r"\b(?:answer|ans|step|result|output|sub-?goal|goal|question|q)\s*[_#-]?\s*(\d{1,2})\b"
                         r"|#\s*(\d{1,2})\b", re.IGNORECASE)

_BARE_NUMBER = re.compile(r"\s*#?\s*(\d{1,2})\s*")  # [2] or [#2]; in square brackets only

_HASH = re.compile(r"(?<![\w#&])#(\d{1,2})\b")


def _step_named(match: re.Match) -> int | None:
    """The step number a bracketed placeholder names, or None ([Season 2], [1990], <b>, {x})."""
    square, inner = match.group(1) is not None, next(g for g in match.groups() if g)
    if square and (bare := _BARE_NUMBER.fullmatch(inner)):
        return int(bare.group(1))
    m = _NAMES_STEP.search(inner)
    return int(next(g for g in m.groups() if g)) if m else None


def step_refs(text: str, index: int) -> list[tuple[re.Match, int]]:
    """The placeholders of the sub-goal numbered `index` (1-based), each with the step it names: every
    bracketed form that names a step, and `#N` for an earlier step N (other `#N` are left as text)."""
    refs = [(m, n) for m in _BRACKETED.finditer(text) if (n := _step_named(m))]
    refs += [(m, n) for m in _HASH.finditer(text) if 1 <= (n := int(m.group(1))) < index
             and not any(b.start() <= m.start() < b.end() for b, _ in refs)]
    return sorted(refs, key=lambda r: r[0].start())


def dependencies(plan: list[str]) -> list[list[int]]:
    """Per sub-goal, the earlier sub-goals its placeholders name (a sub-goal waits for them)."""
    return [sorted({n for _, n in step_refs(text, i) if n < i}) for i, text in enumerate(plan, start=1)]


def fill_placeholders(text: str, index: int, answers: dict[int, str]) -> tuple[str, int, list[str]]:
    """`text` (sub-goal number `index`) with each placeholder naming an earlier answered step replaced by that
    answer (`answers[n]`); other placeholders stay as written. Returns the text, how many were resolved, and a
    warning for each one that was not."""
    warnings: list[str] = []
    resolved = 0
    out, last = [], 0
    for m, n in step_refs(text, index):
        out.append(text[last:m.start()])
        last = m.end()
        if n < index and answers.get(n):
            out.append(answers[n])
            resolved += 1
            continue
        out.append(m.group(0))
        why = "has no answer" if n < index else "is not an earlier step"
        warnings.append(f"placeholder {m.group(0)}: step {n} {why}; left as written")
    filled = " ".join(("".join(out) + text[last:]).split())
    return re.sub(r" ([?.,;:!])", r"\1", filled), resolved, warnings

# -- reading the Plan agent's reply ------------------------------------------------------
def plan_subgoals(plan: Plan | RelationPlan) -> list[str]:
    """The sub-goals of a Plan agent reply, spacing normalised (one written as a relation of an entity is asked as
    "What is the <relation> of <entity>?"); ValueError if there are none."""
    asked = [RELATION_QUESTION.format(**relation) if isinstance(item, RelationSubgoal)
             and (relation := as_relation(item.model_dump())) else item for item in plan.subgoals]
    subgoals = [" ".join(item.split()) for item in asked if isinstance(item, str) and item.strip()]
    if not subgoals:
        raise ValueError("the plan has no sub-goals")
    return subgoals


_PLAN_KEYS = ("subgoals", "sub_goals", "sub-goals", "subquestions", "sub_questions", "questions", "steps", "plan")

_ITEM_KEYS = ("subgoal", "sub_goal", "question", "subquestion", "query", "goal", "text")


def check_plan(value: Any) -> list[str]:
    """The sub-goals of a Plan agent reply read tolerantly (`plan_subgoals`): {"subgoals": [...]} under the names small
    models use for it, or a bare list; a sub-goal as text, as an entity and a relation, or as an object holding its
    text. ValueError if there are none."""
    if isinstance(value, dict):
        lowered = {str(k).lower(): v for k, v in value.items()}
        key = next((k for k in _PLAN_KEYS if k in lowered), None)
        if key is None:
            raise ValueError(f'expected a "subgoals" list, got the keys {sorted(lowered)}')
        value = lowered[key]
    if not isinstance(value, list):
        raise ValueError('"subgoals" must be a list of strings')
    subgoals = []
    for item in value:
        if asked := as_relation(item):
            item = RELATION_QUESTION.format(**asked)
        elif isinstance(item, dict):
            item = next((item[k] for k in _ITEM_KEYS if isinstance(item.get(k), str)), None)
        if isinstance(item, str):
            subgoals.append(item)
    return plan_subgoals(Plan.model_construct(subgoals=subgoals))
