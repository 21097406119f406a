"""OPERA's state, settings and reducers (the design itself is `graph`): the run's state with one record per
sub-goal (`merge_steps` merges their updates), what one sub-goal's task chain carries, and OPERA's settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from typing_extensions import TypedDict

from ..mechanisms import ANSWER_FROM_FACTS
from ..settings import AgentContext, QAOutput, extend, setting

RECURSION_LIMIT = 1000  # graph steps; a chain of n sub-goals takes 2 + n * (3 * max_rewrites + 3) + 1


@dataclass
class OperaContext(AgentContext):
    """OPERA settings: `max_rounds` caps the number of sub-goals, `max_rewrites` the rewrites per sub-goal."""

    agent: ClassVar[str] = "opera"

    topk_schedule: tuple[int, ...] = setting((), help="Top-k of retrieval attempt 1, 2, ... of a sub-goal; "
                                             "empty = top_k, 2*top_k, 3*top_k, ...")
    answer_from_facts: bool = setting(True, help=ANSWER_FROM_FACTS)


def merge_steps(left: list[dict], right: list[dict] | None) -> list[dict]:
    """Sub-goal records by number `n`. An update is {"n", field: value, ...}, optionally with
    "attempt": {"i", field: value, ...} which creates or updates attempt i (0-based). None resets."""
    if right is None:
        return []
    steps = {s["n"]: s for s in left}
    for update in right:
        fields = {k: v for k, v in update.items() if k != "attempt"}
        step = {"attempts": [], **steps.get(update["n"], {}), **fields}
        if "attempt" in update:
            attempts = list(step["attempts"])
            i = update["attempt"]["i"]
            change = {k: v for k, v in update["attempt"].items() if k != "i"}
            if i < len(attempts):
                attempts[i] = {**attempts[i], **change}
            else:
                attempts.append({**new_attempt(), **change})
            step["attempts"] = attempts
        steps[update["n"]] = step
    return [steps[n] for n in sorted(steps)]


class State(TypedDict, total=False):
    question: str
    topic_entities: list[str]
    plan: list[str]  # sub-goals, placeholders unfilled
    depends_on: list[list[int]]  # per sub-goal, the earlier sub-goals (1-based) its placeholders name
    plan_raw: list[str]  # Plan agent replies (more than one after a repair)
    steps: Annotated[list[dict[str, Any]], merge_steps]  # one record per started sub-goal, see new_step
    synthesis_raw: str
    answer: str
    error: str | None  # the first typed failure of the run (set by synthesize, from the notes)
    notes: Annotated[list[str], extend]  # every failure, warning, "DateComparison: ..." and "OptionAnswer: ..."
    guards: Annotated[list[dict], extend]  # every guard firing (graphs/guards/)
    halted: bool  # the run cannot execute sub-goals (no source, the Plan agent failed)
    placeholders: dict[str, Any]  # {"written", "resolved", "fill_rate"} over the executed sub-goals


class OperaOutput(QAOutput):
    plan: list[str]
    steps: list[dict[str, Any]]
    notes: list[str]
    guards: list[dict]
    placeholders: dict[str, Any]


class SubgoalTask(TypedDict):
    """What one sub-goal's task chain carries between retrieve, analyze and rewrite (never in the state)."""

    n: int  # sub-goal number, 1-based
    question: str
    subgoal: str  # the sub-goal with its placeholders filled, as the agents see it
    query: str  # this attempt's query
    attempt: int  # 0-based
    tried: list[str]  # queries so far
    findings: str  # earlier sub-goals' answers, rendered for the analysis prompt
    pool: list[dict]  # passages of all attempts so far (id, title, text, score), best first
    hits: list[dict]  # this attempt's hits (id, title, score)
    best: str  # the latest non-empty answer of the sub-goal's attempts
    reason: str  # why the last attempt was not enough, for the Rewrite agent


def new_step(n: int, subgoal: str, filled: str, depends_on: list[int], written: int, resolved: int,
             warnings: list[str]) -> dict[str, Any]:
    """A sub-goal's record: as planned, with its placeholders filled ("query"; the first attempt searches it,
    with the question beside it when a placeholder stayed), and its outcome."""
    return {"n": n, "subgoal": subgoal, "query": filled, "depends_on": depends_on, "warnings": warnings,
            "placeholders": written, "resolved": resolved, "answer": "", "sufficient": False, "done": False,
            "halted": False}


def new_attempt() -> dict[str, Any]:
    return {"query": "", "k": 0, "hits": [], "shown": [], "analysis_raw": [], "analysis": None,
            "rewrite_raw": None, "rewrite": None, "error": None}
