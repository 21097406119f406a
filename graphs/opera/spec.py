"""OPERA as the registry and the core read it (`SPEC`): its plan and sub-goal attempts in traces and the demo."""

from __future__ import annotations

import re
from collections.abc import Collection

from mhqa_graph.text import one_line
from mhqa_graph.traces import PlanItem, Step, as_retrieved

from ..spec import DesignSpec, Output, TraceParts, retrieved_something
from .graph import build
from .state import OperaContext

# placeholders ([Answer1]) in states from before OPERA recorded `depends_on`
_CITED_STEP = re.compile(r"\[[^\[\]\d]{0,40}?(\d{1,2})[^\[\]\d]{0,40}\]")


def trace_parts(output: Output) -> TraceParts:
    """The sub-goals as the plan, each retrieval attempt as a step ("2.1": sub-goal 2, attempt 1)."""
    subgoals = output.get("plan") or []
    deps = output.get("depends_on") or [sorted(set(_CITED_STEP.findall(q)), key=int) for q in subgoals]
    plan = [PlanItem(id=str(i), question=q, depends_on=[str(d) for d in (deps[i - 1] if i <= len(deps) else [])])
            for i, q in enumerate(subgoals, start=1)]
    steps = [Step(id=f"{s.get('n', i)}.{j}", kind="attempt", question=s.get("subgoal", ""), query=a.get("query", ""),
                  retrieved=as_retrieved(a.get("hits")), answer=(a.get("analysis") or {}).get("answer", ""),
                  error=a.get("error"))
             for i, s in enumerate(output.get("steps") or [], start=1) for j, a in enumerate(s.get("attempts", []), 1)]
    return plan, steps, []


def demo_lines(output: Output, supporting_titles: Collection[str]) -> list[str]:
    """The plan, then each sub-goal's query, answer, sufficiency and retrievals."""
    lines = [f"plan: {' | '.join(output.get('plan') or []) or '(none)'}"]
    for i, step in enumerate(output.get("steps") or [], 1):
        attempts = len(step.get("attempts") or [])
        lines.append(f"sub-goal {i}: {one_line(step.get('query'))} -> {step.get('answer')!r} "
                     f"({'sufficient' if step.get('sufficient') else 'not sufficient'}, "
                     f"{attempts} retrieval{'s' * (attempts != 1)})")
    return lines


SPEC = DesignSpec(name="opera", build=build, context=OperaContext, roles=("plan", "analysis", "rewrite", "answer"),
                  min_calls=3, demo_lines=demo_lines, trace_parts=trace_parts, acted=retrieved_something)
