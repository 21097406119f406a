"""The judge of the first answer, and how auto compares answers and hands entities over: rules on text and on
what rag found, without a model call."""

from __future__ import annotations

from mhqa_graph.parsing import words
from mhqa_graph.text import normalize_answer

from ..answers import asks_yes_or_no, grounded, is_no_answer, options
from .state import Reason


def supported(question: str, answer: str, first: dict, form_check: bool = False, min_confidence: float = 0.0,
              trust_confidence: float = 0.0) -> tuple[bool, Reason]:
    """(whether the first answer is supported by its own evidence, why); `form_check`, `min_confidence`,
    `trust_confidence`: see AutoContext."""
    if not answer:
        return False, "no_answer"
    if is_no_answer(answer):
        return False, "refusal"
    if not grounded(answer, [first.get("context") or ""]):
        return False, "not_in_evidence"
    said, sure = words(answer), first.get("confidence")
    if str(first.get("source", "")).startswith("graph:") and said not in ("yes", "no") \
            and f" {said} " not in f" {words(question)} ":
        if trust_confidence and sure is not None and sure >= trust_confidence:
            return True, "sure_of_graph_answer"
        return False, "graph_answer_not_named"  # the end of a chain: the walk's to find
    if form_check and not of_the_asked_form(question, said):
        return False, "not_of_asked_form"
    if min_confidence and sure is not None and sure < min_confidence:
        return False, "unsure"
    return True, "found_in_evidence"


def of_the_asked_form(question: str, said: str) -> bool:
    """Whether an answer (`words`-normalised) has the form the question asks for: one of the two options an
    "X or Y?" question names (the one, or within it), yes or no to a yes-no question; any answer to other questions."""
    if pair := options(question):
        return bool(said) and any(f" {said} " in f" {words(o)} " for o in pair)
    return said in ("yes", "no") if asks_yes_or_no(question) else True


def same_answer(a: str, b: str) -> bool:
    """Whether two short answers name the same thing: equal once normalised, or one the other's words within it
    ("Nolan" and "Christopher Nolan")."""
    x, y = normalize_answer(a), normalize_answer(b)
    return bool(x and y) and (x == y or f" {x} " in f" {y} " or f" {y} " in f" {x} ")


def starting_entities(question: str, first: dict) -> list[dict[str, str]]:
    """What the first stage hands Omne ({"entity", "graph"}): the graph entities rag matched that the question names
    (not one named only inside another's name: "france" in "marguerite of france"), else its best match (none when
    rag read a corpus)."""
    matched = [{"entity": r["entity"], "graph": r.get("graph") or ""} for r in first.get("retrieved") or []
               if r.get("entity")]
    named = [m for m in matched if f" {words(m['entity'])} " in f" {words(question)} "]
    named = [m for m in named if not any(o["entity"] != m["entity"] and f" {words(m['entity'])} " in
                                         f" {words(o['entity'])} " for o in named)]
    return named or matched[:1]
