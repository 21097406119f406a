"""OPERA's guards (graphs/guards/ names and switches them) with their rules, one entry point per stage: the plan
(`plan_runaway_cut`: `cut_off_reader` before the Plan agent's call, `cut_plan` after it), the analysis
(`analysis_refusal`, `analysis_grounded`: `analysis_flag`) and the synthesis (`options_line`: `options_line`;
`date_comparison` and `option_answer` are `option_guards.settle_options`, shared with Mujica)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mhqa_graph.parsing import close_json, extract_json, strip_think

from ..answers import comparison, grounded, is_no_answer
from ..calls import Parsed
from ..guards import (
    ANALYSIS_GROUNDED,
    ANALYSIS_REFUSAL,
    OPTIONS_LINE,
    PLAN_RUNAWAY_CUT,
    Rule,
    apply,
    check,
    enforced,
    firing,
    first_that_fires,
    is_on,
)
from . import prompts as P
from .plan import check_plan, step_refs


# -- the plan: `plan_runaway_cut` ----------------------------------------------------------
def _shape(text: str, index: int) -> str:
    """A sub-goal's wording with its placeholders masked."""
    for m, _ in reversed(step_refs(text, index)):
        text = text[:m.start()] + "[#]" + text[m.end():]
    return text.lower()


def cut_runaway(subgoals: list[str], repeats: int = 2) -> list[str]:
    """The plan up to a runaway: the first sub-goal worded like `repeats` earlier ones, placeholders aside, ends
    it (a small model chaining "Who is the father of [AnswerN]?" until it runs out of tokens)."""
    shapes = [_shape(text, i) for i, text in enumerate(subgoals, start=1)]
    for i, shape in enumerate(shapes):
        if shapes[:i].count(shape) >= repeats:
            return subgoals[:i]
    return subgoals


def check_runaway_plan(value: Any) -> list[str]:
    """The sub-goals of a plan reply that ran out of tokens, when they repeat themselves (see `cut_runaway`);
    any other cut-off plan is a ValueError, as it may have lost its last hops."""
    subgoals = check_plan(value)
    if cut_runaway(subgoals) == subgoals:
        raise ValueError("the plan was cut off")
    return subgoals


def runaway_reply(text: str) -> list[str] | None:
    """The sub-goals of a plan reply cut off by the token limit while repeating one sub-goal (what
    `plan_runaway_cut` cuts), else None."""
    if extract_json(text) is not None:  # a whole reply: not cut off
        return None
    value = extract_json(close_json(strip_think(text), finished=True))
    try:
        return check_runaway_plan(value)
    except (ValueError, TypeError):
        return None


def cut_off_reader(ctx: Any) -> Callable[[Any], list[str]] | None:
    """How the Plan agent's call reads a reply cut off by the token limit (ask_json's `cut_off`): only to cut it,
    and only when `plan_runaway_cut` acts; else such a reply is malformed."""
    return check_runaway_plan if enforced(ctx, PLAN_RUNAWAY_CUT) else None


def cut_plan(ctx: Any, parsed: Parsed, cap: int, firings: list[dict]) -> list[str] | None:
    """`plan_runaway_cut` on the Plan agent's reply: its sub-goals, cut before the repeats when the reply was cut
    off or reached `cap` sub-goals (where a grammar stops it); None when no plan was read. In log mode, a reply
    cut off while repeating is recorded with the cut the guard would make."""
    if is_on(ctx, PLAN_RUNAWAY_CUT) and not enforced(ctx, PLAN_RUNAWAY_CUT) and (
            runaway := runaway_reply(parsed.raw[0])):
        firings.append(firing(PLAN_RUNAWAY_CUT, runaway, cut_runaway(runaway), False))
    if parsed.value is None:
        return None
    if parsed.cut_off or len(parsed.value) >= cap:
        return apply(ctx, PLAN_RUNAWAY_CUT, parsed.value, lambda: cut_runaway(parsed.value), firings)
    return parsed.value


# -- the analysis: `analysis_refusal`, `analysis_grounded` ----------------------------------
NO_ANSWER, NOT_IN_A_PASSAGE = "no answer", "not in any passage"  # the flags of the analysis guards


def analysis_flag(ctx: Any, answer: str, sufficient: bool, passages: list[str] | None,
                  log: list[dict]) -> str | None:
    """The analysis guards on a non-empty answer, the first that fires ending the chain: NO_ANSWER when it says
    there is none (`analysis_refusal`), NOT_IN_A_PASSAGE when it is short and none of `passages` contains it
    (`analysis_grounded`; not tested without `passages`); None when neither acts. Firings go to `log`."""
    rules = [Rule(ANALYSIS_REFUSAL, lambda: is_no_answer(answer), answer, "")]
    if passages is not None:
        rules.append(Rule(ANALYSIS_GROUNDED, lambda: not grounded(answer, passages),
                          f"{answer} (sufficient: {sufficient})", f"{answer} (sufficient: False)"))
    acted = first_that_fires(ctx, rules, log)
    return NO_ANSWER if acted is ANALYSIS_REFUSAL else NOT_IN_A_PASSAGE if acted is ANALYSIS_GROUNDED else None


# -- the synthesis: `options_line` ----------------------------------------------------------
def options_line(ctx: Any, question: str, firings: list[dict]) -> str:
    """The question as the synthesis is asked it: for a date comparison, with a line telling it to answer with
    one of the two options (`options_line`); else as it is."""
    options = comparison(question)
    with_options = question + (P.ANSWER_OPTIONS.format(a=options[0], b=options[1]) if options else "")
    return with_options if options and check(ctx, OPTIONS_LINE, lambda: True, question, with_options,
                                             firings) else question
