"""Mujica's state, settings and reducers (the design itself is `graph`): the planner's DAG of sub-questions
(`plan.merge_dag`) and the workers' results by id (`merge_results`), what one worker task carries, and
Mujica's settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, NotRequired

from typing_extensions import TypedDict

from ..mechanisms import ANSWER_FROM_FACTS
from ..settings import AgentContext, QAOutput, extend, setting
from .plan import SubQuestion, merge_dag

RECURSION_LIMIT = 1000  # graph steps: start, then per round a planner step and its worker waves (two steps each)
EARLIER_FIELDS = ("attempt", "question", "query", "retrieved", "answer", "status", "error")  # kept of a re-asked result


@dataclass
class MujicaContext(AgentContext):
    agent: ClassVar[str] = "mujica"
    max_subquestions: int = setting(12, help="Sub-questions asked per run, re-asks included; more are dropped "
                                    "with a note.")
    source: Literal["auto", "corpus", "graph"] = setting("auto", help="Where workers retrieve: corpus or graph; "
                                                         "auto = the corpus if set, else the graph.")
    kg_entities: int = setting(3, help="Entities matched per sub-question on the graph source.")
    max_facts: int = setting(30, help="Facts shown per sub-question on the graph source.")
    rank_facts: bool = setting(False, help="On the graph source, each matched entity's facts whose relation the "
                               "sub-question names come first (then those naming its other words); the entities still "
                               "take turns. Off: each entity's facts in stored order.")
    answer_from_facts: bool = setting(False, help=ANSWER_FROM_FACTS)
    min_worker_rounds: int = setting(1, help="Waves of workers before the planner may conclude (a round cap still "
                                     "ends the run).")
    replan_retries: int = setting(0, help="Times a round whose sub-questions can none run (each asked before, or "
                                  "dropped) is sent back with why, before the planner must give its final answer.")
    send_back_rounds: int = setting(0, help="Times a round that plans nothing that can run is answered with a new "
                                    "turn (what it asked again, and the choice to conclude or ask something new) "
                                    "before the planner must give its final answer.")
    cite_answers: bool = setting(False, help="The planner sees the workers' results as a table (sub-question, "
                                 "answer, evidence) and may conclude by citing one (#q2: q2's answer).")
    recall_thoughts: bool = setting(True, help="The planner's conversation keeps each earlier turn's reasoning (its "
                                    "first 300 characters) before what the turn did; off: only what it did (a small "
                                    "planner copies its earlier reasoning word for word).")
    straight_dispatch: bool = setting(True, help="When every answer of a wave is usable, send the sub-questions the "
                                      "planner already wrote that are now ready to the workers without a planner "
                                      "call (off: the planner sees every wave, as in the paper).")
    planner_budget: int = setting(8000, help="Characters of the planner's conversation; older worker contexts are "
                                  "summarised to fit.")


def merge_results(left: dict[str, dict], right: dict[str, dict] | None) -> dict[str, dict]:
    """Worker results keyed by sub-question id, in plan order whatever order workers finished in; the
    result of a re-ask keeps its predecessors in `earlier`. None resets (a new question on the same thread)."""
    if right is None:
        return {}
    merged = dict(left)
    for sid, record in right.items():
        old = merged.get(sid)
        if old is not None and record.get("attempt", 1) > old.get("attempt", 1):
            summary = {k: old.get(k) for k in EARLIER_FIELDS}
            record = {**record, "earlier": [*old.get("earlier", []), summary]}
        merged[sid] = record
    return dict(sorted(merged.items(), key=lambda kv: (kv[1]["order"], kv[0])))


class State(TypedDict):
    question: str
    topic_entities: NotRequired[list[str]]
    answer: str
    error: str | None
    dag: Annotated[list[SubQuestion], merge_dag]
    results: Annotated[dict[str, dict], merge_results]  # id -> query, retrieved, selected, evidence, answer, status
    notes: Annotated[list[str], extend]  # typed notes: "InvalidPlan: ...", "MalformedOutput: ...", "RoundCap: ..."
    guards: Annotated[list[dict], extend]  # every guard firing (graphs/guards/)
    planner_log: Annotated[list[dict], extend]  # one entry per planner call: its prompt, raw replies, action
    rounds: int  # planner calls
    waves: int  # worker waves
    force_final: bool  # the next planner call must answer
    sent_back: int  # rounds that planned nothing that can run and were answered with a new turn (`send_back_rounds`)
    done: bool


class WorkerTask(TypedDict):
    sub: dict  # id, order, attempt, wave, question, query (the question with cited answers filled in)


class MujicaOutput(QAOutput):
    dag: list[SubQuestion]
    results: dict[str, dict]
    notes: list[str]
    guards: list[dict]
    rounds: int
    waves: int
