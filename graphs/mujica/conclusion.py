"""Mujica's conclusion step: the planner's conclusion through the conclusion guards (graphs/guards/ names and
switches them), the one entry point of that stage. A worker's answer to the question itself for "no answer"
(`no_answer_fallback`), a short answer asked for afresh for a sentence (`short_answer_reask`, one more planner
call), the option the dates pick (`date_comparison`) or a step found about it (`option_answer`; both in
graphs/option_guards.py, shared with OPERA)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.runnables import Runnable

from mhqa_graph.errors import ModelError
from mhqa_graph.notes import Note, note

from ..answers import Step, asks_yes_or_no, is_no_answer, is_sentence
from ..calls import ask_json, get_llm
from ..guards import NO_ANSWER_FALLBACK, SHORT_ANSWER_REASK, apply, check, shown
from ..option_guards import settle_options
from . import prompts as P
from .chat import progress
from .plan import ANSWERED, stated, text_key

if TYPE_CHECKING:
    from .state import MujicaContext, State


def conclude(ctx: MujicaContext, state: State, value: str, log: dict, notes: list[Note], firings: list[dict]) -> str:
    """The planner's conclusion through the conclusion guards: a worker's answer to the question itself for a
    conclusion that there is none (`no_answer_fallback`), a short answer asked for afresh for a sentence
    (`short_answer_reask`), the option the dates pick (`date_comparison`) or that a step found about it
    (`option_answer`). Notes and the re-ask's raw reply go to `notes` and `log`."""
    results = state["results"]
    if is_no_answer(value):
        own = answer_to_the_question(state)
        if apply(ctx, NO_ANSWER_FALLBACK, value, lambda: own or None, firings) != value:
            notes.append(note("NoAnswer", f"the planner concluded {value!r}; a worker answered the question itself"))
            value = own
    elif check(ctx, SHORT_ANSWER_REASK, lambda: is_sentence(value) and text_key(value) not in {
            text_key(r["answer"]) for r in results.values()}, value, "(asked again)", firings):
        fmt = P.SHORT_FORMAT
        value, asked, raw = _shorten(get_llm(ctx, "planner", reply=fmt), state, value,
                                     P.planner_system(ctx.ask_as, ctx.cite_answers))
        firings[-1]["after"] = shown(value)
        notes.append(asked)
        log["raw"] = log["raw"] + raw
    value, settled = settle_options(ctx, state["question"], value, compared_steps(state), firings,
                                    "the planner concluded")
    if settled:
        notes.append(settled)
    return value


def _short(value: Any, question: str) -> str:
    """The answer of a reply asked to be short (its "answer"); ValueError if it is missing, a sentence, no answer, or
    yes or no to a question that is not a yes-no question."""
    answer = stated(value)
    if not answer or is_sentence(answer) or is_no_answer(answer):
        raise ValueError("expected a short answer")
    if answer.lower().strip(" .!") in ("yes", "no") and not asks_yes_or_no(question):
        raise ValueError("the question is not a yes-no question")
    return answer


def _shorten(llm: Runnable, state: State, answer: str, system: str) -> tuple[str, Note, list[str]]:
    """One more call when the planner concluded with a sentence that is no worker's answer: the question and
    the plan's answers, asked afresh for the short answer (in its conversation, a small model repeats its
    sentence), or the sentence if none comes. Returns the answer, a note and the raw reply."""
    prompt = P.SHORT_USER.format(question=state["question"], progress=progress(state["dag"], state["results"]))
    said = f"the planner concluded {answer!r}"
    try:
        again = ask_json(llm, [SystemMessage(system), HumanMessage(prompt)], P.SHORT_FORMAT,
                         lambda reply: _short(reply.answer, state["question"]),
                         lambda value: _short(value.get("answer") if isinstance(value, dict) else None,
                                              state["question"]), retries=0)
    except ModelError as exc:
        return answer, note("LongAnswer", f"{said}; asking again failed: {exc}"), []
    if again.error:
        return answer, note("LongAnswer", f"{said} and gave no short answer when asked"), again.raw
    return again.value, note("LongAnswer", f"{said}; asked, it answered {again.value!r}"), again.raw


def answer_to_the_question(state: State) -> str:
    """A worker's answer to a sub-question that is the question itself, or ""."""
    asked = text_key(state["question"])
    return next((r["answer"] for r in state["results"].values()
                 if r["status"] == ANSWERED and text_key(r["query"]) == asked), "")


def compared_steps(state: State) -> list[Step]:
    """The answered sub-questions, as `compare_dates` reads them (text as asked, answer, sub-questions cited)."""
    asked = [(q, state["results"][q["id"]]) for q in state["dag"] if q["id"] in state["results"]]
    number = {q["id"]: i for i, (q, _) in enumerate(asked, start=1)}
    return [Step(r["query"], r["answer"] if r["status"] == ANSWERED else "",
                 [number[d] for d in q["depends_on"] if d in number]) for q, r in asked]
