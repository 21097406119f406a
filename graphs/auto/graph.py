"""auto's graph: its stages as nodes, each design's compiled graph run as a subgraph (`run_stage`); the
figure and the rules are in the package's docstring."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Overwrite

from mhqa_graph.errors import InvalidInput

from ..answers import is_no_answer
from ..settings import QAInput, check_question, context_as
from .judge import same_answer, starting_entities, supported
from .limit import run_stage
from .state import (
    DESIGNS,
    STAGE_SPECS,
    AutoContext,
    AutoOutput,
    AutoState,
    calls_left,
    decision,
    design_for,
    looks_again,
    stage_context,
)

RAG_KEYS = ["answer", "error", "source", "retrieved", "context", "raw", "confidence"]  # what auto reads of rag
Node = Callable[[AutoState, RunnableConfig, Runtime[AutoContext]], dict]


def _inputs(state: AutoState) -> dict:
    return {"question": state["question"], "topic_entities": state.get("topic_entities") or []}


def _stage(name: str, output: dict, error: str | None) -> dict:
    """A stage's record: its output but the passages it read, with the error that stopped it or its own."""
    return {"stage": name, **{k: v for k, v in output.items() if k not in ("context", "messages")},
            "error": error or output.get("error")}


def start(state: AutoState, runtime: Runtime[AutoContext]) -> dict:
    ctx = context_as(AutoContext, runtime)
    ctx.check()  # a context made without make_context (Studio, a dict)
    if not (ctx.corpus or ctx.graph):
        raise InvalidInput("auto needs a corpus or a graph to answer from (set corpus= or graph=)")
    # a new run on a checkpointed thread starts its lists afresh: their reducers would extend the last run's
    return {"question": check_question(state.get("question")), "answer": "", "error": None, "answered_by": "",
            "design": design_for(ctx), "calls": 0, "failure": None, "evidence": "",
            "decisions": Overwrite([]), "stages": Overwrite([]), "guards": Overwrite([])}


def first_answer(rag: CompiledStateGraph) -> Node:
    """The node that asks `rag`: one retrieval, one constrained answer."""

    def rag_stage(state: AutoState, config: RunnableConfig, runtime: Runtime[AutoContext]) -> dict:
        ctx = context_as(AutoContext, runtime)
        output, calls, error = run_stage(rag, _inputs(state), config, stage_context(ctx, "rag"),
                                         calls_left(ctx, state["calls"], "rag"), RAG_KEYS)
        answer, stage = output.get("answer") or "", _stage("rag", output, error)
        return {"answer": answer, "error": stage["error"], "answered_by": "rag" if answer else "", "failure": error,
                "evidence": output.get("context") or "", "calls": state["calls"] + calls, "stages": [stage]}

    return rag_stage


def judge(state: AutoState, runtime: Runtime[AutoContext]) -> dict:
    """Whether rag's answer is supported by its own evidence (`supported`), without a model call: stop, look again
    or escalate."""
    ctx = context_as(AutoContext, runtime)
    first, answer = state["stages"][-1] | {"context": state["evidence"]}, state["answer"]
    ok, code = (False, "stage_failed") if state["failure"] else supported(
        state["question"], answer, first, ctx.form_check, ctx.min_confidence, ctx.trust_confidence)
    action = ("look again" if looks_again(ctx) else "stop") if ok else "escalate"
    sure = {"confidence": first["confidence"]} if first.get("confidence") is not None else {}
    return {"decisions": [decision("rag", action, code, answer, state["failure"], **sure)]}


def second_look(rag: CompiledStateGraph) -> Node:
    """The node that asks `rag` again, for the question with the first answer added: the two answers agreeing
    stops, differing escalates."""

    def second_look(state: AutoState, config: RunnableConfig, runtime: Runtime[AutoContext]) -> dict:
        ctx = context_as(AutoContext, runtime)
        answer = state["answer"]
        query = f"{state['question']} {answer}"
        again, calls, error = run_stage(rag, _inputs(state) | {"query": query}, config, stage_context(ctx, "rag"),
                                        calls_left(ctx, state["calls"], "second_look"), RAG_KEYS)
        said = again.get("answer") or ""
        agree = not error and bool(said) and same_answer(said, answer)
        code = "stage_failed" if error else "answers_agree" if agree else "answers_differ"
        return {"calls": state["calls"] + calls, "stages": [_stage("second_look", again, error) | {"query": query}],
                "decisions": [decision("second_look", "stop" if agree else "escalate", code, said, error)]}

    return second_look


def design_stage(name: str, design: CompiledStateGraph) -> Node:
    """The node that runs the design `name` within what the budget leaves; with `hand_over`, Omne starts from the
    entities rag matched (`starting_entities`)."""

    def run_design(state: AutoState, config: RunnableConfig, runtime: Runtime[AutoContext]) -> dict:
        ctx = context_as(AutoContext, runtime)
        start_from = starting_entities(state["question"], state["stages"][0]) if name == "omne" and ctx.hand_over \
            else []
        inputs = _inputs(state) | ({"start_from": start_from} if start_from else {})
        output, calls, error = run_stage(design, inputs, config, stage_context(ctx, name),
                                         calls_left(ctx, state["calls"], name))
        stage = _stage(name, output, error) | ({"start_from": start_from} if start_from else {})
        return {"stages": [stage], "guards": list(output.get("guards") or []), "calls": state["calls"] + calls}

    return run_design


def reconcile(state: AutoState) -> dict:
    """The design's answer when it gave one, else the first answer; agreement is recorded."""
    design = state["stages"][-1]
    said, before, name = design.get("answer") or "", state["answer"], design["stage"]
    if said and not is_no_answer(said):
        code = ("agrees_with_rag" if same_answer(said, before) else "rag_had_none" if not before
                else "differs_from_rag")
        return {"answer": said, "error": design.get("error"), "answered_by": name,
                "decisions": [decision(name, "answer", code, said)]}
    code = "stage_failed" if design.get("error") else "refusal" if said else "no_answer"
    return {"decisions": [decision(name, "fallback", code, said, design.get("error"))],
            "error": state["error"] or design.get("error")}


def _next(state: AutoState) -> str:
    """After the judge or the second look: END on a stop, else the next stage."""
    action = state["decisions"][-1]["action"]
    return END if action == "stop" else "second_look" if action == "look again" else state["design"]


def build(checkpointer: Any = None) -> CompiledStateGraph:
    rag = STAGE_SPECS["rag"].build()
    g = StateGraph(AutoState, context_schema=AutoContext, input_schema=QAInput, output_schema=AutoOutput)
    g.add_node("start", start)
    g.add_node("rag", first_answer(rag))
    g.add_node("judge", judge)
    g.add_node("second_look", second_look(rag))
    for name in DESIGNS:
        g.add_node(name, design_stage(name, STAGE_SPECS[name].build()))
    g.add_node("reconcile", reconcile)
    g.add_edge(START, "start")
    g.add_edge("start", "rag")
    g.add_edge("rag", "judge")
    g.add_conditional_edges("judge", _next, [END, "second_look", *DESIGNS])
    g.add_conditional_edges("second_look", _next, [END, *DESIGNS])
    for name in DESIGNS:
        g.add_edge(name, "reconcile")
    g.add_edge("reconcile", END)
    return g.compile(checkpointer=checkpointer)


graph = build()
