"""The agent designs, installed as `mhqa_graph.graphs`: OPERA, Mujica, Omne, two baselines and `auto`, which
answers with `rag` first and escalates to a design when that answer is not supported.

    from mhqa_graph.graphs import build_graph, make_context, as_tool
    graph = build_graph("opera")
    graph.invoke({"question": "..."}, context=make_context("opera", llm="qwen2.5-coder-1.5b", corpus="hotpotqa-dev_a"))

Each design declares a spec (`DesignSpec`, graphs/spec.py): how it is built, its settings, its roles, the fewest
model calls it answers in, and how its runs are read. `SPECS` holds them by agent name.

What each role (`SPECS[agent].roles`, the keys of `role_llms`) must reply, e.g. to script fake models:

    opera   plan        {"subgoals": ["Who directed Inception?", "Where was [Answer1] born?"]}
            analysis    {"reasoning": "...", "sufficient": true, "answer": "Christopher Nolan"}
            rewrite     {"query": "Christopher Nolan birthplace"}
            answer      London  (or <answer>London</answer>)
    mujica  planner     {"subquestions": [{"id": "q1", "question": "...", "depends_on": []},
                                          {"id": "q2", "question": "... #q1 ...", "depends_on": ["q1"]}]}
                        or, to finish, {"answer": "London"}
            worker      {"relevant": [1, 3], "answer": "Christopher Nolan"}
    omne    tool-agent  <think>...</think><tool_call>{"name": "entity_matcher",
                        "arguments": {"query": "Inception", "graph_type": "kg"}}</tool_call>,
                        node_info with {"entity", "graph_type"}, then <answer>London</answer>
    rag, direct answer  <think>...</think><answer>London</answer>
    auto    rag's answer, then the roles of the design it escalates to (graphs/auto/)
"""

from __future__ import annotations

import dataclasses
import typing
import uuid
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from mhqa_graph.errors import InvalidInput

from .auto import SPEC as AUTO_SPEC
from .baselines import DIRECT_SPEC, RAG_SPEC
from .calls import check_sources
from .mujica import SPEC as MUJICA_SPEC
from .omne import SPEC as OMNE_SPEC
from .opera import SPEC as OPERA_SPEC
from .settings import validate_context
from .spec import DesignSpec

# agent name -> its design's spec
SPECS: dict[str, DesignSpec] = {s.name: s for s in (OPERA_SPEC, MUJICA_SPEC, OMNE_SPEC, RAG_SPEC, DIRECT_SPEC,
                                                    AUTO_SPEC)}


def design_spec(agent: str) -> DesignSpec:
    """The spec of `agent`; InvalidInput, naming the agents, for an unknown one."""
    if agent not in SPECS:
        raise InvalidInput(f"unknown agent {agent!r}; choose one of {', '.join(SPECS)}")
    return SPECS[agent]


def build_graph(agent: str, checkpointer: Any = None) -> Any:
    """The compiled LangGraph graph of `agent` (opera | mujica | omne | rag | direct | auto)."""
    return design_spec(agent).build(checkpointer=checkpointer)


def context_schema(agent: str) -> type:
    """The context dataclass of `agent` (an AgentContext subclass)."""
    return design_spec(agent).context


def make_context(agent: str, *, require_source: bool = True, **settings: Any) -> Any:
    """The run context of `agent`, from keyword settings; None values keep the defaults. Unknown
    settings, `role_llms` keys that are not the agent's roles (its spec's), model specs that cannot load,
    values of the wrong type and, for an agent that searches the store (all but `direct`), neither a corpus nor a
    graph raise InvalidInput / ModelError here, before any work. `require_source=False` checks settings that
    name their corpus or graph later (an eval before its environment is built, a Studio assistant whose runs name
    it)."""
    schema = context_schema(agent)
    known = {f.name for f in dataclasses.fields(schema)}
    settings = {k: v for k, v in settings.items() if v is not None}
    unknown = set(settings) - known
    if unknown:
        raise InvalidInput(f"{agent} has no setting(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    context = schema(**settings)
    validate_context(context, SPECS[agent].roles)
    if require_source and SPECS[agent].searches and not (context.corpus or context.graph):
        raise InvalidInput(f"{agent} searches the store: set corpus or graph (`mhqa stats` lists them), or use the "
                           "direct agent")
    return context


def parse_settings(agent: str, items: list[str]) -> dict[str, Any]:
    """`["hand_over=false", "max_rounds=5"]` (the CLI's `--set`) as settings of `agent`, each value read as its
    field's type (true/false, integers, numbers, text, one of a setting's choices). InvalidInput names an item
    without `=`, an unknown setting or a value of the wrong type, in one line."""
    fields = {f.name: f for f in dataclasses.fields(context_schema(agent))}
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InvalidInput(f"--set {item!r}: write NAME=VALUE")
        if name not in fields:
            raise InvalidInput(f"{agent} has no setting {name!r}; known: {', '.join(sorted(fields))}")
        kind = fields[name].type if isinstance(fields[name].type, str) else getattr(fields[name].type, "__name__", "")
        scalar = kind.split("|")[0].strip()
        if scalar.startswith("Literal["):
            choices = typing.get_args(typing.get_type_hints(context_schema(agent))[name])
            if value.strip() not in choices:
                raise InvalidInput(f"--set {name}={value}: expected one of {', '.join(map(str, choices))}")
            out[name] = value.strip()
            continue
        if name == "store" or scalar not in SCALARS:
            raise InvalidInput(f"--set {name}: {'give --store' if name == 'store' else f'a {kind} setting'}; "
                               "--set takes text, numbers and true/false (set the others in Python or Studio)")
        try:
            out[name] = _read_value(scalar, value.strip())
        except ValueError:
            raise InvalidInput(f"--set {name}={value}: expected {kind}") from None
    return out


SCALARS = ("bool", "int", "float", "str")  # the setting types `--set` reads


def _read_value(kind: str, value: str) -> Any:
    if kind == "bool":
        if value.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ValueError(value)
        return value.lower() in ("true", "1", "yes", "on")
    return int(value) if kind == "int" else float(value) if kind == "float" else value


def as_tool(agent: str, name: str | None = None, description: str | None = None, checkpointer: Any = None,
            **settings: Any) -> BaseTool:
    """A LangChain tool that answers a multi-hop question with `agent`, for use inside other agents.
    Its settings are checked as `make_context` does, and its corpus/graph must be in an existing store. With a
    `checkpointer`, each call runs in a thread of its own (a new `thread_id`), so a plain `.invoke` works."""
    graph = build_graph(agent, checkpointer=checkpointer)
    context = make_context(agent, **settings)
    check_sources(context)

    def config() -> dict | None:  # with a checkpointer, each call is a thread of its own
        return {"configurable": {"thread_id": f"{agent}-{uuid.uuid4().hex}"}} if checkpointer is not None else None

    def answer(question: str) -> str:
        result = graph.invoke({"question": question}, config(), context=context)
        return result.get("answer") or f"No answer ({result.get('error') or 'unknown reason'})"

    async def aanswer(question: str) -> str:
        result = await graph.ainvoke({"question": question}, config(), context=context)
        return result.get("answer") or f"No answer ({result.get('error') or 'unknown reason'})"

    return StructuredTool.from_function(
        func=answer, coroutine=aanswer, name=name or f"{agent}_multihop_qa",
        description=description
        or f"Answer a multi-hop factual question with the {agent} agent over the knowledge store.")


__all__ = ["SPECS", "DesignSpec", "as_tool", "build_graph", "check_sources", "context_schema", "design_spec",
           "make_context"]
