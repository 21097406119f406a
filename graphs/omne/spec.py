"""Omne as the registry and the core read it (`SPEC`): its tool calls in traces and the demo, the calls that
returned a result in health."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from mhqa_graph.text import one_line
from mhqa_graph.traces import Step, ToolCall, Trace

from ..spec import DesignSpec, Output, TraceParts
from .graph import build
from .state import OmneContext


def trace_parts(output: Output) -> TraceParts:
    """Each tool call, as a tool call and as a step searching its first argument."""
    calls = [ToolCall(name=c.get("name", ""), args=c.get("args", {}), output=c.get("result_preview", ""))
             for c in output.get("tool_calls") or []]
    steps = [Step(id=str(i), kind="tool", query=str(next(iter(c.args.values()), "")) if isinstance(c.args, dict)
                  else c.args, answer=c.output) for i, c in enumerate(calls, start=1)]
    return [], steps, calls


def demo_lines(output: Output, supporting_titles: Collection[str]) -> list[str]:
    """Each tool call with its arguments and the start of its result."""
    calls = [f"{call['name']}({', '.join(f'{k}={v!r}' for k, v in call['args'].items())}) -> "
             f"{one_line(call.get('result_preview'), 80)}" for call in output.get("tool_calls") or []]
    return calls or ["(no tool call)"]


def successful_call(call: Any) -> bool:
    """Whether a tool call (as the final state records it) returned a result: not an error, not a repeat."""
    return isinstance(call, dict) and not call.get("repeated") \
        and not str(call.get("result_preview", "")).startswith("Error")


def called_a_tool(trace: Trace) -> bool:
    """Omne's action: a tool call returned a result."""
    return any(map(successful_call, trace.design.get("tool_calls") or []))


def rates(traces: list[dict]) -> dict[str, Any]:
    """`tool_rate` (questions with a tool call), `acted_rate` (with a successful one) and `successful_calls`."""
    calls = [(t.get("design") or {}).get("tool_calls") or [] for t in traces]
    n = max(1, len(traces))
    return {"tool_rate": sum(bool(c) for c in calls) / n,
            "acted_rate": sum(any(map(successful_call, c)) for c in calls) / n,
            "successful_calls": sum(sum(map(successful_call, c)) for c in calls)}


SPEC = DesignSpec(name="omne", build=build, context=OmneContext, roles=("tool-agent",), min_calls=2,
                  demo_lines=demo_lines, trace_parts=trace_parts, acted=called_a_tool, rates=rates)
