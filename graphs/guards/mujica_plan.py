"""Mujica's plan guards (`plan_off_topic`, `plan_made_up_entity`, `plan_example_copy`): the rules that drop a
sub-question of a plan, as the chain `first_that_fires` runs (the first that fires drops it)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from mhqa_graph.tools import stems

from .. import mujica_prompts as P
from . import PLAN_EXAMPLE_COPY, PLAN_MADE_UP_ENTITY, PLAN_OFF_TOPIC, Guard, Rule

DROPPED = {PLAN_OFF_TOPIC: "is off the question's topic",  # the note of each plan guard's drop
           PLAN_MADE_UP_ENTITY: "names no topic entity and no answer so far",
           PLAN_EXAMPLE_COPY: "copies the prompt's example"}


@dataclass(frozen=True)
class Topic:
    """What a plan's sub-questions are checked against: the question and its topic entities (`about`), the word
    stems of `about` and of the answers so far (`words`), those of the topic entities and answers (`anchors`,
    empty without topic entities) and the prompt's example sub-questions as compared (`examples`)."""

    about: str
    words: frozenset[str]
    anchors: frozenset[str]
    examples: frozenset[str]


def topic(about: str, entities: list[str] | None, answers: list[str], examples: set[str]) -> Topic:
    found = set().union(*(stems(a) for a in answers))
    anchors = set().union(*(stems(e) for e in entities)) | found if entities else set()
    return Topic(about, frozenset(stems(about) | found), frozenset(anchors), frozenset(examples))


def rules(t: Topic, named: str, text: str, bare: str, key: str, cites: set[str], dropped: set[str]) -> list[Rule]:
    """The plan guards' rules for one sub-question (`text`; `bare` without its citations of earlier answers, `key`
    as repeats are compared), citing `cites`, given the ids already `dropped`:
    - off the topic: it shares no word stem (`tools.stems`) with the question or an answer so far, and cites no
      sub-question that stays (a small planner copies the prompt's example: "Who directed Inception?");
    - a made-up entity: with topic entities, it cites nothing and shares no word stem with a topic entity or an
      answer ("What is the nationality of King Hamlet?" for Claudius's parents);
    - a copy of the examples: one of their sub-questions sharing no word stem with the question ("Where was #q1
      born?" for a question about a nationality), or naming an entity of the examples the question does not
      ("When was Jaws released?" for a question about two other films)."""
    out = []
    if t.about:
        out.append(Rule(PLAN_OFF_TOPIC, lambda: not stems(bare) & t.words and not cites - dropped, named, "dropped"))
    if t.anchors:
        out.append(Rule(PLAN_MADE_UP_ENTITY, lambda: not cites and not stems(text) & t.anchors, named, "dropped"))
    if t.about:
        out.append(Rule(PLAN_EXAMPLE_COPY, lambda: key in t.examples and not stems(bare) & stems(t.about)
                        or names_an_example(text, t.about), named, "dropped"))
    return out


def names_an_example(text: str, about: str) -> bool:
    """Whether `text` names an entity of the prompt's examples that `about` does not name."""
    return any(re.search(rf"\b{re.escape(name)}\b", text, re.IGNORECASE)
               and not re.search(rf"\b{re.escape(name)}\b", about, re.IGNORECASE) for name in P.EXAMPLE_NAMES)


def note(guard: Guard, sid: str, text: str) -> str:
    return f"InvalidPlan: {sid or 'a sub-question'} {DROPPED[guard]}; dropped {text!r}"
