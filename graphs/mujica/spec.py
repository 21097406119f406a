"""Mujica as the registry and the core read it (`SPEC`): its DAG and sub-question answers in traces and the demo,
its workers in health."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from mhqa_graph.messages import RETRIES, last_kind
from mhqa_graph.text import one_line
from mhqa_graph.traces import PlanItem, Step, Trace, as_retrieved

from ..spec import DesignSpec, Output, TraceParts
from .graph import build
from .state import MujicaContext


def trace_parts(output: Output) -> TraceParts:
    """The DAG as the plan, each sub-question asked as a step (a re-asked one: its earlier asks first, "q2.1")."""
    plan = [PlanItem(id=q["id"], question=q["question"], depends_on=list(q.get("depends_on", [])))
            for q in output.get("dag") or []]
    steps = [Step(id=sid if r is last else f"{sid}.{r.get('attempt', 1)}", kind="subquestion",
                  question=r.get("question", ""), query=r.get("query", ""), retrieved=as_retrieved(r.get("retrieved")),
                  answer=r.get("answer") or "", error=r.get("error"))
             for sid, last in (output.get("results") or {}).items() for r in [*(last.get("earlier") or []), last]]
    return plan, steps, []


def dag_levels(dag: list[dict]) -> list[tuple[int, dict]]:
    """(level, sub-question) in level order: level 0 depends on nothing, level n on levels < n."""
    level: dict[str, int] = {}

    def of(sub_id: str, seen: frozenset = frozenset()) -> int:
        if sub_id not in level:
            sub = next((s for s in dag if s["id"] == sub_id), None)
            deps = [d for d in (sub or {}).get("depends_on", []) if d not in seen]
            level[sub_id] = 1 + max((of(d, seen | {sub_id}) for d in deps), default=-1)
        return level[sub_id]

    return sorted(((of(sub["id"]), sub) for sub in dag), key=lambda pair: pair[0])


def demo_lines(output: Output, supporting_titles: Collection[str]) -> list[str]:
    """The DAG by level, each sub-question with its query and answer."""
    results = output.get("results") or {}
    levels = []
    for level, sub in dag_levels(output.get("dag") or []):
        done = results.get(sub["id"], {})
        levels.append(f"level {level}: {sub['id']} {one_line(done.get('query') or sub['question'])} "
                      f"-> {done.get('answer')!r}")
    return levels or ["(no sub-question)"]


def consulted_a_worker(trace: Trace) -> bool:
    """Mujica's action: the planner dispatched at least one worker."""
    return any(c.role == "worker" for c in trace.llm_calls)


def rates(traces: list[dict]) -> dict[str, Any]:
    """`worker_rate` (questions with a worker consulted) and `dispatches` (worker calls, repairs not counted)."""
    workers = [(bool(t.get("kinds")), [c for c in t.get("llm_calls") or [] if c.get("role") == "worker"])
               for t in traces]
    return {"worker_rate": sum(bool(w) for _, w in workers) / max(1, len(traces)),
            "dispatches": sum(last_kind(c, kinds) not in RETRIES for kinds, w in workers for c in w)}


SPEC = DesignSpec(name="mujica", build=build, context=MujicaContext, roles=("planner", "worker"), min_calls=3,
                  demo_lines=demo_lines, trace_parts=trace_parts, acted=consulted_a_worker, rates=rates)
