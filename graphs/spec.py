"""What a design declares (`DesignSpec`): how the registry builds and sets it up, and how the core reads its runs.
Traces, health, the demo and the eval records ask an agent's spec (`mhqa_graph.designs.spec_of`), never which keys
its output has."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from langgraph.graph.state import CompiledStateGraph

from mhqa_graph.traces import PlanItem, Step, ToolCall, Trace

from .settings import AgentContext

Output = Mapping[str, Any]  # a run's final state, or a graph's output
TraceParts = tuple[list[PlanItem], list[Step], list[ToolCall]]


def no_parts(output: Output) -> TraceParts:
    """The trace parts of a design that retrieves nothing."""
    return [], [], []


def no_action(trace: Trace) -> bool | None:
    """`acted` of a design with no action of its own."""
    return None


def retrieved_something(trace: Trace) -> bool:
    """`acted` of a design whose action is retrieval: a step of its run found something."""
    return any(step.retrieved for step in trace.steps)


def no_rates(traces: list[dict]) -> dict[str, Any]:
    """`rates` of a design with no behaviour rates of its own."""
    return {}


def no_fields(output: Output, trace: Trace) -> dict[str, Any]:
    """`record_fields` of a design whose records add nothing."""
    return {}


@dataclass(frozen=True)
class DesignSpec:
    """One design, as the registry (`mhqa_graph.graphs.SPECS`) and the core know it:

    - `build(checkpointer=None)`: its compiled graph; `context`: its settings class (`context_schema`);
    - `roles`: what its model calls play, the keys of `role_llms` and the `role` of its trace LLM calls;
    - `min_calls`: the fewest model calls it answers in;
    - `demo_lines(output, supporting_titles)`: what `mhqa demo` shows of an output, supporting titles marked;
    - `trace_parts(output)`: the plan, retrieval steps and tool calls of an output, as its traces show them;
    - `acted(trace)`: health's `acted`, whether its own action happened (None: it has none);
    - `rates(traces)`: health's `behaviour` rates of its own over a run's traces (their JSON form);
    - `record_fields(output, trace)`: what its eval records add from an output;
    - `searches`: a run needs a corpus or a graph to search.
    """

    name: str
    build: Callable[..., CompiledStateGraph]
    context: type[AgentContext]
    roles: tuple[str, ...]
    min_calls: int
    demo_lines: Callable[[Output, Collection[str]], list[str]]
    trace_parts: Callable[[Output], TraceParts] = no_parts
    acted: Callable[[Trace], bool | None] = no_action
    rates: Callable[[list[dict]], dict[str, Any]] = no_rates
    record_fields: Callable[[Output, Trace], dict[str, Any]] = no_fields
    searches: bool = True
