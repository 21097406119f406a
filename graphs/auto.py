"""`auto`: answer cheaply first, escalate to a multi-hop design only when the cheap answer is not supported.

    START -> start -> first (the `rag` graph, the judge; `rag` again with second_look) --stop----------> END
                                                              \\-escalate-> escalate (omne | opera | mujica)
                                                                                 -> reconcile -> END

- **first** runs `rag` as a subgraph: one retrieval, one constrained answer; then its **judge** decides from the
  evidence, without a model call. It stops when the answer is supported: found in
  a shown passage or fact and, on a graph, one the question names (one of its options, or yes/no). On a graph,
  `rag` shows the facts of the entities the question names, so an entity it answers with is one or two facts
  from them, where a multi-hop answer is usually the bridge, not the end of the chain ("which nationality is
  X's husband?" answered with the husband): finding the end is the walk's work. An empty answer, a refusal, an
  answer no evidence holds, or a graph entity the question does not name escalates; with `form_check`, so does an
  answer not of the form the question asks for (neither of its two options, or not yes/no to a yes-no question).
  A supported answer the model gave a low probability (below `min_confidence`, 0.5) escalates too (FLARE's signal:
  the probability of the answer's least likely token, from the backend's token log-probabilities); with
  `trust_confidence`, a graph answer the question does not name stops when the model is at least that sure of it.
  With `second_look` (on a corpus), a supported answer is looked at again before it stops: `rag` searches for the
  question with that answer added (the next hop's passages, when the answer is a bridge) and answers again; the
  two answers agreeing stops, differing escalates.
- **escalate** runs the design that suits the store: Omne over a graph, OPERA over a corpus (`escalate_to`).
  Its calls are capped by what `budget` leaves after the first stage. With `hand_over`, Omne starts from what
  the first stage found: the facts of the entities rag matched that the question names are its first tool
  results, so its turns could go to the hops beyond them (off by default: the 1.5B model calls node_info on
  those entities again and loops on the repeat; docs/benchmarks.md).
- **reconcile** keeps the design's answer when it has one, else the first answer (a design that failed,
  raised or ran out of budget falls back to it). Two answers that agree are marked so.

Every step appends to `decisions` ({stage, action, reason, answer; rag's confidence when it reports one});
`answered_by` names the stage whose answer stands. Both are in the output, the trace (`design`) and the eval
records, and `mhqa report` counts them.
With both a corpus and a graph, the first stage reads the corpus (as `rag` does) and the escalation is Omne.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Annotated, Any, ClassVar, NotRequired

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Overwrite
from typing_extensions import TypedDict

from mhqa_graph.errors import InvalidInput, MhqaError
from mhqa_graph.eval.scoring import normalize_answer
from mhqa_graph.parsing import words

from .calls import CALL_GATE
from .guards.compare import asks_yes_or_no, options
from .guards.refusals import grounded, is_no_answer
from .settings import AgentContext, QAInput, QAOutput, check_question, context_as, extend, setting

DESIGNS = ("opera", "mujica", "omne")  # what auto may escalate to
MIN_CALLS = {"rag": 1, "opera": 3, "mujica": 3, "omne": 2}  # the fewest model calls a stage can answer in


class BudgetExhausted(MhqaError):
    """auto's `budget` of model calls is spent: the stage that asked for one more stops."""


@dataclass
class AutoContext(AgentContext):
    """auto's settings: the common ones go to every stage (roles of `role_llms` to the stage that has them)."""

    agent: ClassVar[str] = "auto"

    escalate_to: str = setting("auto", help="The design asked when the first answer is not supported: opera, "
                               "mujica, omne, or auto (omne over a graph, opera over a corpus).")
    hand_over: bool = setting(False, help="Omne starts its walk from the entities rag matched that the question "
                              "names (the best match when it names none): their facts are looked up for it before "
                              "its first turn, in place of the entity_matcher and node_info turns it would spend. "
                              "Off by default: with qwen2.5-coder-1.5b it cost F1 on PQ-2H (docs/benchmarks.md).")
    form_check: bool = setting(False, help="An answer not of the form the question asks for escalates: neither of "
                               "the two options an 'X or Y?' question names, or not yes or no to a yes-no question.")
    second_look: bool = setting(False, help="On a corpus, a supported first answer is checked by a second rag call "
                                "over the passages found for the question with that answer added: the two answers "
                                "agreeing stops, differing escalates (one more call a question).")
    min_confidence: float = setting(0.5, help="A supported first answer whose confidence (the probability the "
                                    "model gave the answer's least likely token) is below this escalates; 0 = off. "
                                    "Needs a backend with token log-probabilities (llama.cpp, OpenAI-compatible "
                                    "servers); without them the rule does not apply. 0.5 was read on HotpotQA "
                                    "questions 0-59 with qwen2.5-coder-1.5b (docs/benchmarks.md).")
    trust_confidence: float = setting(0.0, help="On a graph, an answer in its facts that the question does not "
                                      "name stops when the model's confidence in it is at least this (it escalates "
                                      "otherwise, as the walk's to find); 0 = off. Log-probabilities as for "
                                      "min_confidence. Off by default: at 0.9 it cost F1 on PQ-2H with "
                                      "qwen2.5-coder-1.5b (docs/benchmarks.md).")
    budget: int = setting(12, help="Most model calls a question may take, all stages together (repairs "
                          "included); 0 = no cap. Below what the first stage and the design need, it is refused.")

    def check(self) -> None:
        check_settings(self)


class AutoOutput(QAOutput):
    answered_by: str  # the stage whose answer stands: rag or the design's name ("" when none answered)
    decisions: list[dict[str, Any]]  # {stage, action: stop | escalate | answer | fallback, reason, answer}
    stages: list[dict[str, Any]]  # each stage's output (the design's own fields, its calls and seconds), in order
    guards: list[dict]  # every stage's guard firings


class AutoState(TypedDict):
    question: str
    topic_entities: NotRequired[list[str]]
    answer: str
    error: str | None
    answered_by: str
    decisions: Annotated[list[dict[str, Any]], extend]
    stages: Annotated[list[dict[str, Any]], extend]
    guards: Annotated[list[dict], extend]
    calls: int  # model calls made so far


# -- settings ----------------------------------------------------------------------------------
def design_for(ctx: AgentContext) -> str:
    """The design auto escalates to under these settings."""
    choice = getattr(ctx, "escalate_to", "auto")
    if choice != "auto":
        return choice
    return "omne" if ctx.graph else "opera"


def check_settings(ctx: AutoContext) -> None:
    """InvalidInput, in one line, for an unknown design, a design the sources cannot serve, or a budget below
    what the first stage and the design need. (No source at all is `make_context`'s to refuse, and the run's, when it
    starts from a context made without it.)"""
    for name in ("min_confidence", "trust_confidence"):
        if not 0.0 <= getattr(ctx, name) <= 1.0:
            raise InvalidInput(f"{name} is a probability, from 0 (off) to 1; got {getattr(ctx, name)}")
    if ctx.escalate_to not in ("auto", *DESIGNS):
        raise InvalidInput(f"escalate_to must be auto or one of {', '.join(DESIGNS)}, got {ctx.escalate_to!r}")
    design = design_for(ctx)
    if design == "omne" and ctx.corpus and not ctx.graph:
        raise InvalidInput("escalate_to=omne needs a graph (set graph=), or choose opera or mujica")
    looks = 1 + (ctx.second_look and bool(ctx.corpus))
    need = looks * MIN_CALLS["rag"] + MIN_CALLS[design]
    if ctx.budget and ctx.budget < need:
        raise InvalidInput(f"budget {ctx.budget} is below the {need} calls auto needs (rag {MIN_CALLS['rag']}"
                           f"{' twice' if looks > 1 else ''}, {design} {MIN_CALLS[design]}); give at least {need}, "
                           "or 0 for no cap")


def stage_context(ctx: AutoContext, agent: str) -> Any:
    """The context of the stage `agent`: auto's common settings, and the `role_llms` of its roles (`rag` reports
    its confidence when `min_confidence` or `trust_confidence` is set)."""
    from . import ROLES, context_schema

    common = {f.name: getattr(ctx, f.name) for f in fields(AgentContext)}
    common["role_llms"] = {r: m for r, m in ctx.role_llms.items() if r in ROLES[agent]}
    own = {"confidence": True} if agent == "rag" and (ctx.min_confidence or ctx.trust_confidence) else {}
    return context_schema(agent)(**common, **own)


# -- calls and their cap -----------------------------------------------------------------------
class CallCounter(BaseCallbackHandler):
    """Counts the model calls of a stage (each attempt, retries too); once `cap` (0 = none) are made, `check` raises
    BudgetExhausted. It is the stage's `CALL_GATE`, run before each call: a callback that raises stops the call too,
    but LangChain logs it as the callback's error (so the callback raises only for a retry past the cap)."""

    raise_error = True

    def __init__(self, cap: int = 0) -> None:
        self.cap, self.calls = cap, 0

    def check(self) -> None:
        if self.cap and self.calls >= self.cap:
            raise BudgetExhausted(f"auto's budget is spent ({self.cap} calls left to this stage, all made)")

    def _count(self) -> None:
        self.check()
        self.calls += 1

    def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        self._count()

    def on_llm_start(self, *args: Any, **kwargs: Any) -> None:
        self._count()


def _with_handler(config: RunnableConfig, handler: BaseCallbackHandler) -> RunnableConfig:
    callbacks = config.get("callbacks")
    if isinstance(callbacks, BaseCallbackManager):
        callbacks = callbacks.copy()
        callbacks.add_handler(handler, inherit=True)
    else:
        callbacks = [*(callbacks or []), handler]
    return {**config, "callbacks": callbacks}


def run_stage(agent: str, ctx: AutoContext, inputs: dict, config: RunnableConfig, cap: int,
              output_keys: list[str] | None = None) -> tuple[dict, int, str | None]:
    """(the stage's output with its `calls` and `seconds`, the calls it made, the error that stopped it or None).
    A stage that raises is recorded, not propagated."""
    started = time.perf_counter()
    output, calls, error = _invoke(agent, ctx, inputs, config, cap, output_keys)
    return output | {"calls": calls, "seconds": round(time.perf_counter() - started, 3)}, calls, error


def _invoke(agent: str, ctx: AutoContext, inputs: dict, config: RunnableConfig, cap: int,
            output_keys: list[str] | None) -> tuple[dict, int, str | None]:
    from . import build_graph

    counter = CallCounter(cap)
    gate = CALL_GATE.set(counter.check)  # the stage's nodes (in LangGraph's threads too) run with a copy of it
    try:
        if agent not in _graphs:
            _graphs[agent] = build_graph(agent)
        graph = _graphs[agent]
        output = graph.invoke(inputs, _with_handler(config, counter), context=stage_context(ctx, agent),
                              **({"output_keys": output_keys} if output_keys else {}))
        return dict(output), counter.calls, None
    except Exception as exc:  # a stage failing is a decision to record; auto answers with what it has
        return {}, counter.calls, f"{type(exc).__name__}: {exc}"
    finally:
        CALL_GATE.reset(gate)


_graphs: dict[str, CompiledStateGraph] = {}


# -- the cheap answer and its judge ------------------------------------------------------------
def supported(question: str, answer: str, first: dict, form_check: bool = False, min_confidence: float = 0.0,
              trust_confidence: float = 0.0) -> tuple[bool, str]:
    """(whether the first answer is supported by its own evidence, why); `form_check`, `min_confidence`,
    `trust_confidence`: see AutoContext."""
    if not answer:
        return False, "no answer"
    if is_no_answer(answer):
        return False, "a refusal"
    if not grounded(answer, [first.get("context") or ""]):
        return False, "not in its evidence"
    said, sure = words(answer), first.get("confidence")
    if str(first.get("source", "")).startswith("graph:") and said not in ("yes", "no") \
            and f" {said} " not in f" {words(question)} ":
        if trust_confidence and sure is not None and sure >= trust_confidence:
            return True, "a graph answer the model is sure of"
        return False, "a graph answer the question does not name"  # the end of a chain: the walk's to find
    if form_check and not of_the_asked_form(question, said):
        return False, "not of the form the question asks"
    if min_confidence and sure is not None and sure < min_confidence:
        return False, "the model is unsure of it"
    return True, "found in its evidence"


def of_the_asked_form(question: str, said: str) -> bool:
    """Whether an answer (`words`-normalised) has the form the question asks for: one of the two options an
    "X or Y?" question names (the one, or within it), yes or no to a yes-no question; any answer to other questions."""
    if pair := options(question):
        return bool(said) and any(f" {said} " in f" {words(o)} " for o in pair)
    return said in ("yes", "no") if asks_yes_or_no(question) else True


def starting_entities(question: str, first: dict) -> list[dict[str, str]]:
    """What the first stage hands Omne ({"entity", "graph"}): the graph entities rag matched that the question names
    (not one named only inside another's name: "france" in "marguerite of france"), else its best match (none when
    rag read a corpus)."""
    matched = [{"entity": r["entity"], "graph": r.get("graph") or ""} for r in first.get("retrieved") or []
               if r.get("entity")]
    named = [m for m in matched if f" {words(m['entity'])} " in f" {words(question)} "]
    named = [m for m in named if not any(o["entity"] != m["entity"] and f" {words(m['entity'])} " in
                                         f" {words(o['entity'])} " for o in named)]
    return named or matched[:1]


def _inputs(state: AutoState) -> dict:
    return {"question": state["question"], "topic_entities": state.get("topic_entities") or []}


# -- nodes ---------------------------------------------------------------------------------------
def start(state: AutoState, runtime: Runtime[AutoContext]) -> dict:
    ctx = context_as(AutoContext, runtime)
    ctx.check()  # a context made without make_context (Studio, a dict)
    if not (ctx.corpus or ctx.graph):
        raise InvalidInput("auto needs a corpus or a graph to answer from (set corpus= or graph=)")
    # a new run on a checkpointed thread starts its lists afresh: their reducers would extend the last run's
    return {"question": check_question(state.get("question")), "answer": "", "error": None, "answered_by": "",
            "calls": 0, "decisions": Overwrite([]), "stages": Overwrite([]), "guards": Overwrite([])}


RAG_KEYS = ["answer", "error", "source", "retrieved", "context", "raw", "confidence"]  # what auto reads of rag


def first(state: AutoState, config: RunnableConfig, runtime: Runtime[AutoContext]) -> dict:
    ctx = context_as(AutoContext, runtime)
    reserve = MIN_CALLS[design_for(ctx)]
    look_again = ctx.second_look and bool(ctx.corpus)
    cap = ctx.budget - reserve - look_again if ctx.budget else 0
    output, calls, error = run_stage("rag", ctx, _inputs(state), config, cap, output_keys=RAG_KEYS)
    answer = output.get("answer") or ""
    ok, why = supported(state["question"], answer, output, ctx.form_check, ctx.min_confidence,
                        ctx.trust_confidence) if not error else (False, error)
    action = ("look again" if look_again else "stop") if ok else "escalate"
    sure = {"confidence": output["confidence"]} if output.get("confidence") is not None else {}
    decisions = [{"stage": "rag", "action": action, "reason": why, "answer": answer, **sure}]
    stages = [_stage("rag", output, error)]
    if action == "look again":
        query = f"{state['question']} {answer}"
        again, more, error = run_stage("rag", ctx, _inputs(state) | {"query": query}, config,
                                       max(1, ctx.budget - calls - reserve) if ctx.budget else 0, output_keys=RAG_KEYS)
        calls += more
        said = again.get("answer") or ""
        agree = not error and bool(said) and same_answer(said, answer)
        decisions.append({"stage": "second_look", "action": "stop" if agree else "escalate",
                          "reason": error or ("the two answers agree" if agree else "the two answers differ"),
                          "answer": said})
        stages.append(_stage("second_look", again, error) | {"query": query})
    return {"answer": answer, "error": stages[0]["error"], "answered_by": "rag" if answer else "",
            "calls": calls, "decisions": decisions, "stages": stages}


def _stage(name: str, output: dict, error: str | None) -> dict:
    return {"stage": name, **{k: v for k, v in output.items() if k != "context"}, "error": error or output.get("error")}


def same_answer(a: str, b: str) -> bool:
    """Whether two short answers name the same thing: equal once normalised, or one the other's words within it
    ("Nolan" and "Christopher Nolan")."""
    x, y = normalize_answer(a), normalize_answer(b)
    return bool(x and y) and (x == y or f" {x} " in f" {y} " or f" {y} " in f" {x} ")


def escalate(state: AutoState, config: RunnableConfig, runtime: Runtime[AutoContext]) -> dict:
    ctx = context_as(AutoContext, runtime)
    design = design_for(ctx)
    cap = max(1, ctx.budget - state["calls"]) if ctx.budget else 0
    start_from = starting_entities(state["question"], state["stages"][0]) if design == "omne" and ctx.hand_over \
        else []
    inputs = _inputs(state) | ({"start_from": start_from} if start_from else {})
    output, calls, error = run_stage(design, ctx, inputs, config, cap)
    stage = {"stage": design, **{k: v for k, v in output.items() if k != "messages"},
             "error": error or output.get("error"), **({"start_from": start_from} if start_from else {})}
    return {"stages": [stage], "guards": list(output.get("guards") or []), "calls": state["calls"] + calls}


def reconcile(state: AutoState) -> dict:
    """The design's answer when it gave one, else the first answer; agreement is recorded."""
    design = state["stages"][-1]
    said, before = design.get("answer") or "", state["answer"]
    if said and not is_no_answer(said):
        agree = same_answer(said, before)
        reason = "agrees with rag" if agree else ("rag had none" if not before else "differs from rag")
        return {"answer": said, "error": design.get("error"), "answered_by": design["stage"],
                "decisions": [{"stage": design["stage"], "action": "answer", "reason": reason, "answer": said}]}
    why = design.get("error") or ("a refusal" if said else "no answer")
    return {"decisions": [{"stage": design["stage"], "action": "fallback", "reason": why, "answer": said}],
            "error": state["error"] or design.get("error")}


def _after_first(state: AutoState) -> str:
    return END if state["decisions"][-1]["action"] == "stop" else "escalate"


def build(checkpointer: Any = None) -> CompiledStateGraph:
    g = StateGraph(AutoState, context_schema=AutoContext, input_schema=QAInput, output_schema=AutoOutput)
    g.add_node("start", start)
    g.add_node("first", first)
    g.add_node("escalate", escalate)
    g.add_node("reconcile", reconcile)
    g.add_edge(START, "start")
    g.add_edge("start", "first")
    g.add_conditional_edges("first", _after_first, ["escalate", END])
    g.add_edge("escalate", "reconcile")
    g.add_edge("reconcile", END)
    return g.compile(checkpointer=checkpointer)


graph = build()
