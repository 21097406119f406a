"""Mechanisms two designs share, each behind a setting: worked plans of similar training questions
(`plan_examples`), sub-questions written as one relation of one entity (`ask_as="relation"`) and answers read
from the facts shown (`answer_from_facts`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mhqa_graph.errors import MhqaError
from mhqa_graph.notes import WARNING, Note, note
from mhqa_graph.replies import ANSWER_CHARS, text
from mhqa_graph.types import fact_ends

from .calls import get_store
from .settings import AgentContext

RELATION_QUESTION = "What is the {relation} of {entity}?"  # a sub-question written as (entity, relation): ask_as
RELATION_CHARS = 60  # of a relation: a few words ("place of birth"), not a chain of them


def relation_schema(entities: list[str] | None, refs: list[str]) -> dict[str, Any]:
    """The JSON schema of a sub-question written as one relation of one entity (`ask_as="relation"`): the entity one
    of the question's topic `entities` or an earlier answer (`refs`), free text when no entities are given."""
    entity = {"type": "string", "enum": [*dict.fromkeys(entities), *refs]} if entities else text(ANSWER_CHARS)
    return {"entity": entity, "relation": text(RELATION_CHARS)}


def as_relation(item: Any) -> dict[str, str]:
    """{"entity", "relation"} of a sub-question written as one relation of one entity (`ask_as="relation"`), spacing
    normalised, or {} for any other item."""
    if not isinstance(item, dict) or not all(isinstance(item.get(k), str) and item[k].strip()
                                             for k in ("entity", "relation")):
        return {}
    return {k: " ".join(item[k].split()) for k in ("entity", "relation")}


MAX_FACT_ANSWERS = 400  # values an answer read from facts may take; with more, it stays free text


# the `answer_from_facts` setting of OPERA (on by default) and Mujica (off: no gain measured on fresh PathQuestion
# questions; docs/benchmarks.md)
ANSWER_FROM_FACTS = ("On a graph, an answer read from the facts shown (OPERA's analysis, Mujica's worker) is one of "
                     "their entities or values (Mujica's worker may capitalise a lower-case name), or none: the reply "
                     "format holds it to them.")


def fact_answer_schema(ctx: AgentContext, texts: Iterable[str], also: tuple[str, ...],
                       capitalised: bool = False) -> dict[str, Any] | None:
    """With `answer_from_facts`, the JSON schema of an answer read from graph facts: one of the subjects and objects
    of the fact lines in `texts` (`Fact.as_text`) or one of `also` (the role's "none": "", "unknown"; yes, no).
    `capitalised`: an end written in lower case ("shah shuja") may also be written with its words capitalised
    ("Shah Shuja"), as a model starts a name. None (free text) without the setting, or when `texts` hold no fact
    line or more than MAX_FACT_ANSWERS distinct ends (before the capitalised forms)."""
    if not getattr(ctx, "answer_from_facts", False):
        return None
    ends = list(dict.fromkeys(end for t in texts for end in fact_ends(t)))
    if not ends or len(ends) > MAX_FACT_ANSWERS:
        return None
    if capitalised:
        ends = list(dict.fromkeys(v for e in ends for v in (e, _capitalised(e))))
    return {"type": "string", "enum": [*ends, *(a for a in also if a not in ends)]}


def _capitalised(name: str) -> str:
    """A name written in lower case with each word's first letter capitalised ("shah shuja" -> "Shah Shuja"); any
    other name as it is."""
    if name != name.lower() or name == name.upper():
        return name
    return " ".join(word[:1].upper() + word[1:] for word in name.split(" "))


def worked_plans(ctx: AgentContext, question: str) -> tuple[list[tuple[str, list[str]]], Note | None]:
    """([(question, sub-goals)], warning): the `plan_example_k` worked plans of the `plan_examples` corpus nearest
    `question` (sub-goals cite earlier answers as [AnswerN]; `mhqa_graph.ingest.plans`), none without the setting;
    a warning when the corpus cannot be searched (the planner then plans without them)."""
    if not ctx.plan_examples or ctx.plan_example_k <= 0:
        return [], None
    try:
        hits = get_store(ctx).search(ctx.plan_examples, question, k=ctx.plan_example_k + 1)
    except MhqaError as exc:
        return [], note(WARNING, f"plan_examples: {type(exc).__name__}: {exc}; planned without them")
    return [(h.title, h.text.splitlines()) for h in hits if h.title != question][:ctx.plan_example_k], None
