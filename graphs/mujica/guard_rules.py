"""Mujica's guards (graphs/guards/ names and switches them) with their rules, one entry point per stage: the plan
(`unecho` as each sub-question is read: `unechoed`; `plan_unanchored`, the send-back of a plan whose first
sub-questions name nothing the question names: `unanchored`; `plan_off_topic`, `plan_made_up_entity` and
`plan_example_copy`, the chain that drops a sub-question as the plan is repaired: `dropped`), the worker's
answer (`worker_refusal`, `unknown_contexts`: `worker_answer`) and the planner's conclusion as it is read
(`conclusion_bridge`: `bridge`). The conclusion's others are `conclusion.conclude`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mhqa_graph.tools import stems

from ..answers import asks_yes_or_no, grounded, is_no_answer, options
from ..guards import (
    CONCLUSION_BRIDGE,
    CONCLUSION_UNGROUNDED,
    PLAN_EXAMPLE_COPY,
    PLAN_MADE_UP_ENTITY,
    PLAN_OFF_TOPIC,
    PLAN_UNANCHORED,
    UNECHO,
    UNKNOWN_CONTEXTS,
    WORKER_REFUSAL,
    Rule,
    apply,
    check,
    first_that_fires,
)
from . import prompts as P

# what a planner copies from `progress` lines into a sub-question: "q1: ", " (after q1)", " -> answer"
ECHO = re.compile(r"^q[\w.-]*:\s+|\s*\((?:after [^)]*|blocked: [^)]*|not answered yet)\)|\s+->(?:\s.*)?$")


# -- the plan: `unecho` ---------------------------------------------------------------------
def unecho(text: str) -> str:
    """A sub-question without what the planner copied from the plan's progress lines: a leading "q1: ", a
    "(after q1)" or "(blocked: ...)" remark, and " -> " with the answer after it."""
    text = " ".join(text.split())
    while (stripped := ECHO.sub("", text).strip()) != text:
        text = stripped
    return text


def unechoed(ctx: Any, question: str, log: list[dict]) -> str:
    """A sub-question's text as read (spacing normalised), cleaned of what it copied by `unecho`."""
    return apply(ctx, UNECHO, " ".join(question.split()), lambda: unecho(question), log)


# -- the plan: `plan_unanchored` ------------------------------------------------------------------
QUOTED = re.compile(r'"([^"]+)"|\u201c([^\u201d]+)\u201d')
WORD = re.compile(r"[^\W_]+(?:['\u2019.-][^\W_]+)*")


def question_names(question: str, entities: list[str] | None = None) -> list[str]:
    """The names a question writes: its topic entities when it has them; else its quoted titles and its runs of
    capitalised words after the first word ('The band who released "Tinted Windows"...' -> ["Tinted Windows"])."""
    if entities:
        return list(dict.fromkeys(entities))
    names = [a or b for a, b in QUOTED.findall(question)]
    run: list[str] = []
    for i, m in enumerate(WORD.finditer(question)):
        word = m.group(0)
        if i and (word[0].isupper() or word[0].isdigit()):
            run.append(word)
            continue
        if run:
            names.append(" ".join(run))
        run = []
    if run:
        names.append(" ".join(run))
    return list(dict.fromkeys(n for n in names if n.strip()))


def unanchored(ctx: Any, roots: list[tuple[str, str]], names: list[str], answers: list[str],
               log: list[dict]) -> list[str]:
    """The ids of the sub-questions among `roots` (those citing no earlier answer, as (id, text)) that share no word
    stem with the question's `names` nor with an answer so far (a later hop may write an answer out instead of citing
    it), when `plan_unanchored` fires and acts (its firing goes to `log`); else []."""
    names_stems = stems(" ".join(names))
    anchors = names_stems | stems(" ".join(answers))
    off = [(sid, text) for sid, text in roots if not stems(text) & anchors] if names_stems else []
    shown_as = "; ".join(f"{sid or 'a sub-question'}: {text}" for sid, text in off)
    return [sid or "a sub-question" for sid, _ in off] if check(ctx, PLAN_UNANCHORED, lambda: bool(off), shown_as,
                                                               "sent back", log) else []


# -- the conclusion as it is read: `conclusion_bridge` -------------------------------------------------
def bridge(ctx: Any, answer: str, steps: list[tuple[str, str, list[str]]], log: list[dict]) -> tuple[str, str] | None:
    """(the id whose answer the conclusion repeats, an id that builds on it) when `conclusion_bridge` fires and acts:
    the conclusion, citing nothing, is the answer of a sub-question another one depends on. `steps` are the
    answered sub-questions as (id, answer, depends_on) and the others as (id, "", depends_on)."""
    key = " ".join(answer.lower().split()).strip(" .")
    found = next(((sid, later) for sid, said, _ in steps if said and " ".join(said.lower().split()).strip(" .") == key
                  for later, _, deps in steps if sid in deps), None)
    return found if check(ctx, CONCLUSION_BRIDGE, lambda: found is not None, answer, "sent back", log) else None


REMARK = re.compile(r"\s*\([^)]*\)\s*$")  # a trailing remark in brackets


def ungrounded(ctx: Any, question: str, answer: str, said: list[str], log: list[dict]) -> bool:
    """Whether `conclusion_ungrounded` fires and acts: the conclusion, citing nothing, is none of the workers'
    answers `said` (neither holds the other's words), though some worker answered; yes or no to a yes-no question
    and an answer naming an option of the question count as found, and a conclusion that there is no answer is not
    one made up."""
    def found() -> bool:
        yes_no = asks_yes_or_no(question) and answer.lower().strip(" .!") in ("yes", "no")
        if not said or is_no_answer(REMARK.sub("", answer)) or yes_no:  # "unknown (not in the contexts)" too
            return True
        if (named := options(question)) and any(o.lower() in answer.lower() for o in named):
            return True
        return grounded(answer, said) or any(grounded(s, [answer]) for s in said)

    return check(ctx, CONCLUSION_UNGROUNDED, lambda: not found(), answer, "sent back", log)


# -- the plan: the chain that drops a sub-question -----------------------------------------------
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


def dropped(ctx: Any, t: Topic, sid: str, text: str, bare: str, key: str, cites: set[str], off: set[str],
            log: list[dict]) -> str | None:
    """The note dropping one sub-question (`sid`, `text`; `bare` without its citations of earlier answers, `key` as
    repeats are compared), citing `cites`, given the ids already dropped (`off`), when a plan guard drops it (the
    first that fires ends the chain; firings go to `log`); None when it stays. The rules, in order:
    - off the topic: it shares no word stem (`tools.stems`) with the question or an answer so far, and cites no
      sub-question that stays (a small planner copies the prompt's example: "Who directed Inception?");
    - a made-up entity: with topic entities, it cites nothing and shares no word stem with a topic entity or an
      answer ("What is the nationality of King Hamlet?" for Claudius's parents);
    - a copy of the examples: one of their sub-questions sharing no word stem with the question ("Where was #q1
      born?" for a question about a nationality), or naming an entity of the examples the question does not
      ("When was Jaws released?" for a question about two other films)."""
    named, rules = f"{sid or 'a sub-question'}: {text}", []
    if t.about:
        rules.append(Rule(PLAN_OFF_TOPIC, lambda: not stems(bare) & t.words and not cites - off, named, "dropped"))
    if t.anchors:
        rules.append(Rule(PLAN_MADE_UP_ENTITY, lambda: not cites and not stems(text) & t.anchors, named, "dropped"))
    if t.about:
        rules.append(Rule(PLAN_EXAMPLE_COPY, lambda: key in t.examples and not stems(bare) & stems(t.about)
                          or names_an_example(text, t.about), named, "dropped"))
    acted = first_that_fires(ctx, rules, log)
    return f"InvalidPlan: {sid or 'a sub-question'} {DROPPED[acted]}; dropped {text!r}" if acted else None


def names_an_example(text: str, about: str) -> bool:
    """Whether `text` names an entity of the prompt's examples that `about` does not name."""
    return any(re.search(rf"\b{re.escape(name)}\b", text, re.IGNORECASE)
               and not re.search(rf"\b{re.escape(name)}\b", about, re.IGNORECASE) for name in P.EXAMPLE_NAMES)


# -- the worker's answer: `worker_refusal`, `unknown_contexts` ---------------------------------
def worker_answer(ctx: Any, sid: str, answer: str, selected: bool, retrieved: int, shown: int,
                  firings: list[dict]) -> tuple[bool, bool]:
    """(whether a worker's answer counts as unknown, whether it is then reported with the contexts it retrieved).
    Unknown: it says "unknown", or (`worker_refusal`) that there is none in other words. Reported with its
    contexts (`unknown_contexts`): it selected none and retrieved some (`retrieved`, of which `shown` would be
    shown). Firings go to `firings`."""
    if not (answer.lower().strip(" .!\"'") == "unknown" or check(
            ctx, WORKER_REFUSAL, lambda: is_no_answer(answer), f"{sid}: {answer}", "unknown", firings)):
        return False, False
    return True, not selected and check(ctx, UNKNOWN_CONTEXTS, lambda: retrieved > 0, f"{sid}: unknown",
                                        f"{shown} retrieved contexts", firings)
