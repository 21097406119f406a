"""auto as the registry and the core read it (`SPEC`): its stages, each read by the spec of the design it ran, and
its decisions, in traces, the demo and the eval records (`route`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from mhqa_graph.traces import Trace

from ..spec import DesignSpec, Output, TraceParts
from .graph import build
from .state import DESIGNS, MIN_CALLS, STAGE_SPECS, AutoContext


def trace_parts(output: Output) -> TraceParts:
    """Its stages' plans, steps and tool calls, in order."""
    parts = [STAGE_SPECS[s["stage"]].trace_parts(s) for s in output.get("stages") or []
             if isinstance(s, Mapping) and s.get("stage") in STAGE_SPECS]
    return ([p for plan, _, _ in parts for p in plan], [s for _, steps, _ in parts for s in steps],
            [c for _, _, calls in parts for c in calls])


def demo_lines(output: Output, supporting_titles: Collection[str]) -> list[str]:
    """Each decision after the first lines of its stage."""
    stages = {s.get("stage"): s for s in output.get("stages") or []}
    return [line for d in output.get("decisions") or []
            for line in [*STAGE_SPECS[d["stage"]].demo_lines(stages.get(d["stage"], {}), supporting_titles)[:3],
                         f"{d['stage']}: {d['action']} ({d['reason']}) -> {d.get('answer')!r}"]]


def route(output: Output, trace: Trace) -> dict[str, Any]:
    """auto's decisions, compact: the stage that answered, each decision (stage, action, reason, the stage's
    answer) and each stage's calls, seconds, tokens and the entities it was handed (its calls are the next ones
    of the trace: stages run one after the other)."""
    stages, calls = [], iter(trace.llm_calls)
    for s in output.get("stages") or []:
        mine = [c for _, c in zip(range(int(s.get("calls") or 0)), calls)]
        stages.append({k: s.get(k) for k in ("stage", "calls", "seconds")} | (
            {"start_from": s["start_from"]} if s.get("start_from") else {}) | {"tokens": {
            "input": sum(c.input_tokens for c in mine), "output": sum(c.output_tokens for c in mine),
            "total": sum(c.input_tokens + c.output_tokens for c in mine),
            "cached": sum(c.cached_tokens for c in mine)}})
    return {"answered_by": output.get("answered_by") or "",
            "decisions": [{k: d.get(k) for k in ("stage", "action", "reason", "answer")}
                          | ({"confidence": d["confidence"]} if d.get("confidence") is not None else {})
                          for d in output.get("decisions") or []],
            "stages": stages}


def route_field(output: Output, trace: Trace) -> dict[str, Any]:
    """An eval record's `route`: which stage answered, and why each stopped or escalated."""
    return {"route": route(output, trace)}


SPEC = DesignSpec(name="auto", build=build, context=AutoContext,
                  roles=tuple(dict.fromkeys(r for s in ("rag", *DESIGNS) for r in STAGE_SPECS[s].roles)),
                  min_calls=MIN_CALLS["rag"], demo_lines=demo_lines, trace_parts=trace_parts,
                  record_fields=route_field)
