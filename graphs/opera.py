"""OPERA (arXiv 2508.16438): an orchestrated planner-executor for multi-hop retrieval.

The Plan agent splits the question into ordered sub-goals whose later items refer to earlier answers with
placeholders ([Answer1], [entity from step 2]). Each sub-goal is then executed: fill its placeholders,
retrieve, and let the Analysis-Answer agent judge sufficiency and extract the answer; when the passages are
not enough, the Rewrite agent reformulates the query and retrieval runs again with a larger top-k, at most
`max_rewrites` times. A final synthesis turns the sub-goal answers into the answer.

    plan -> retrieve -> analyze -> (rewrite -> retrieve ...) -> next sub-goal ... -> synthesize

Retrieval searches `corpus`; with only `graph` set, it reads the facts of the best-matching entities.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from typing_extensions import TypedDict

from mhqa_graph.errors import EntityNotFound, ModelError, StoreError
from mhqa_graph.parsing import extract_json, final_answer, strip_think
from mhqa_graph.store.base import MAX_K
from mhqa_graph.tools import MAX_FACTS, format_passages
from mhqa_graph.types import PassageHit

from . import opera_prompts as P
from .common import (
    AgentContext,
    QAInput,
    QAOutput,
    ask,
    ask_json,
    check_question,
    clean_answer,
    context_as,
    get_llm,
    get_store,
    setting,
)

RECURSION_LIMIT = 1000  # graph steps; a run takes 2 + sub-goals * (3 * max_rewrites + 2)


@dataclass
class OperaContext(AgentContext):
    """OPERA settings: `max_rounds` caps the number of sub-goals, `max_rewrites` the rewrites per sub-goal."""

    topk_schedule: tuple[int, ...] = setting((), help="Top-k of retrieval attempt 1, 2, ... of a sub-goal; "
                                             "empty = top_k, 2*top_k, 3*top_k, ...")


class State(TypedDict, total=False):
    question: str
    topic_entities: list[str]
    plan: list[str]  # sub-goals, placeholders unfilled
    plan_raw: list[str]  # Plan agent replies (more than one after a repair)
    steps: list[dict[str, Any]]  # one record per executed sub-goal, see _new_step and _new_attempt
    synthesis_raw: str
    answer: str
    error: str | None  # the first typed failure of the run
    notes: list[str]  # every failure and warning, in order
    halted: bool  # a model or store failure stopped execution


class OperaOutput(QAOutput):
    plan: list[str]
    steps: list[dict[str, Any]]
    notes: list[str]




def topk_for(ctx: OperaContext, attempt: int) -> int:
    """The top-k of retrieval attempt `attempt` (0-based) of a sub-goal."""
    schedule = [int(k) for k in ctx.topk_schedule] or [ctx.top_k * (i + 1) for i in range(ctx.max_rewrites + 1)]
    return max(1, min(MAX_K, schedule[min(attempt, len(schedule) - 1)]))


# -- placeholders ----------------------------------------------------------------------
# Bracketed text holding a 1-2 digit step number: [Answer1], [answer 2], [entity from step 2], [#1].
_PLACEHOLDER = re.compile(r"\[([^\[\]\d]{0,40}?)(\d{1,2})([^\[\]\d]{0,40})\]")


def fill_placeholders(text: str, answers: list[str]) -> tuple[str, list[str]]:
    """`text` with each placeholder replaced by the answer of the step it names (`answers[n - 1]`).
    A placeholder naming a step without an answer gets the closest earlier answer, or is removed;
    each such case is returned as a warning."""
    warnings: list[str] = []

    def replace(match: re.Match) -> str:
        n = int(match.group(2))
        if 1 <= n <= len(answers) and answers[n - 1]:
            return answers[n - 1]
        fallback = next((a for a in reversed(answers) if a), "")
        why = "has no answer" if 1 <= n <= len(answers) else "is not an earlier step"
        warnings.append(f"placeholder {match.group(0)}: step {n} {why}; "
                        + (f"used {fallback!r}" if fallback else "removed it"))
        return fallback

    filled = " ".join(_PLACEHOLDER.sub(replace, text).split())
    return re.sub(r" ([?.,;:!])", r"\1", filled), warnings


# -- parsing the agents' replies ---------------------------------------------------------
_PLAN_KEYS = ("subgoals", "sub_goals", "sub-goals", "subquestions", "sub_questions", "questions", "steps", "plan")
_ITEM_KEYS = ("subgoal", "sub_goal", "question", "subquestion", "query", "goal", "text")
_NO_ANSWER = {"", "none", "null", "unknown", "n/a", "na", "not found", "not available", "insufficient",
              "insufficient information", "cannot be determined", "not mentioned"}


def check_plan(value: Any) -> list[str]:
    """The sub-goals of a Plan agent reply ({"subgoals": [...]} or a bare list); ValueError if there are none."""
    if isinstance(value, dict):
        lowered = {str(k).lower(): v for k, v in value.items()}
        key = next((k for k in _PLAN_KEYS if k in lowered), None)
        if key is None:
            raise ValueError(f'expected a "subgoals" list, got the keys {sorted(lowered)}')
        value = lowered[key]
    if not isinstance(value, list):
        raise ValueError('"subgoals" must be a list of strings')
    subgoals = []
    for item in value:
        if isinstance(item, dict):
            item = next((item[k] for k in _ITEM_KEYS if isinstance(item.get(k), str)), None)
        if isinstance(item, str) and item.strip():
            subgoals.append(" ".join(item.split()))
    if not subgoals:
        raise ValueError("the plan has no sub-goals")
    return subgoals


def _truthy(flag: Any) -> bool:
    if isinstance(flag, str):
        return flag.strip().lower() in ("true", "yes", "y", "1", "sufficient")
    return bool(flag)


def check_analysis(value: Any) -> dict[str, Any]:
    """{"reasoning", "sufficient", "answer"} from an Analysis-Answer reply; also takes the
    {"status": "yes"|"no", "analysis": ...} form. Sufficient needs a non-empty answer."""
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    v = {str(k).lower(): x for k, x in value.items()}
    if not any(k in v for k in ("sufficient", "status", "answer")):
        raise ValueError(f'expected the keys "sufficient" and "answer", got {sorted(v)}')
    answer = clean_answer(str(v.get("answer") or ""))
    if answer.lower().strip(".") in _NO_ANSWER:
        answer = ""
    flag = v.get("sufficient", v.get("status"))
    sufficient = (_truthy(flag) if flag is not None else True) and bool(answer)
    return {"reasoning": str(v.get("reasoning") or v.get("analysis") or ""), "sufficient": sufficient, "answer": answer}


_QUERY_FIELD = re.compile(r'"query"\s*:\s*"([^"]*)', re.IGNORECASE)


def parse_rewrite(text: str) -> str:
    """The query of a Rewrite agent reply: JSON {"query": ...} (even cut off) or the first line of plain text."""
    value = extract_json(text, dict)
    if value is not None:
        query = next((v for k, v in value.items() if str(k).lower() == "query"), "")
        return " ".join(str(query).split())
    text = strip_think(text)
    if match := _QUERY_FIELD.search(text):
        return " ".join(match.group(1).split())
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = re.sub(r"^(new |rewritten |search )?query\s*:\s*", "", line, flags=re.IGNORECASE)
    return line.strip(" \"'`*")


def parse_final(text: str) -> str:
    value = extract_json(text, dict)
    if value is not None and value.get("answer") is not None:
        return clean_answer(str(value["answer"]))
    return clean_answer(final_answer(text))


# -- retrieval ---------------------------------------------------------------------------
def retrieve_contexts(ctx: OperaContext, query: str, k: int) -> list[PassageHit]:
    """Top-k passages of `ctx.corpus`; without a corpus, the facts of the entities of `ctx.graph`
    that best match `query` (one context per entity; more entities as k grows)."""
    store = get_store(ctx)
    if ctx.corpus:
        return store.search(ctx.corpus, query, k=k, mode="hybrid")
    contexts = []
    for hit in store.match_entities(ctx.graph, query, k=max(2, k // 3)):
        try:
            info = store.node_info(ctx.graph, hit.name)
        except EntityNotFound:
            continue
        facts = [f.as_text(info.name) for f in info.facts[:MAX_FACTS]]
        if facts:
            contexts.append(PassageHit(id=info.name, title=info.name, text="\n".join(facts), score=hit.score))
    return contexts


# -- state helpers -----------------------------------------------------------------------
def _new_step(subgoal: str, query: str, warnings: list[str]) -> dict[str, Any]:
    return {"subgoal": subgoal, "query": query, "warnings": warnings, "attempts": [],
            "answer": "", "sufficient": False, "done": False}


def _new_attempt(query: str, k: int) -> dict[str, Any]:
    return {"query": query, "k": k, "hits": [], "context": "", "analysis_raw": [], "analysis": None,
            "rewrite_raw": None, "rewrite": None, "error": None}


def _copy_last(state: State) -> tuple[list[dict], dict, dict]:
    """Copies of the steps, the last step and its last attempt, safe to modify."""
    steps = list(state["steps"])
    step = steps[-1] = {**steps[-1], "attempts": list(steps[-1]["attempts"])}
    attempt = step["attempts"][-1] = dict(step["attempts"][-1])
    return steps, step, attempt


def _best_answer(step: dict) -> str:
    """The latest non-empty answer of the step's attempts, sufficient or not."""
    return next((a["analysis"]["answer"] for a in reversed(step["attempts"])
                 if a["analysis"] and a["analysis"]["answer"]), "")


def _noted(state: State, *messages: str) -> dict[str, Any]:
    """The state update adding `messages` to the notes."""
    return {"notes": [*state.get("notes", []), *messages]}


def _failure(state: State, message: str, halt: bool = False) -> dict[str, Any]:
    """The state update recording a typed failure: `error` keeps the first one, `notes` all."""
    update: dict[str, Any] = {"error": state.get("error") or message, **_noted(state, message)}
    if halt:
        update["halted"] = True
    return update


def _findings(steps: list[dict]) -> str:
    lines = [f"{i}. {s['query']} -> {s['answer'] or 'not found'}" + ("" if s["sufficient"] else " (unconfirmed)")
             for i, s in enumerate(steps, start=1)]
    return "\n".join(lines) or "none"


# -- nodes -------------------------------------------------------------------------------
def plan(state: State, runtime: Runtime[OperaContext]) -> dict[str, Any]:
    """Plan agent: the question's sub-goals; the question itself when no usable plan comes back.
    Resets every run field, as a checkpointed thread may be reused for a new question."""
    question = check_question(state.get("question"))
    ctx = context_as(OperaContext, runtime)
    entities = [e for e in state.get("topic_entities") or [] if isinstance(e, str) and e.strip()]
    fresh: State = {"question": question, "plan": [], "plan_raw": [], "steps": [], "synthesis_raw": "",
                    "answer": "", "error": None, "notes": [], "halted": False}
    if not (ctx.corpus or ctx.graph):
        return fresh | _failure(fresh, "InvalidInput: OPERA needs a corpus or a graph in the context", halt=True)
    hint = P.PLAN_HINT.format(entities=", ".join(entities)) if entities else ""
    messages = [SystemMessage(P.PLAN_SYSTEM), HumanMessage(P.PLAN_USER.format(question=question, hint=hint))]
    try:
        parsed = ask_json(get_llm(ctx, "plan"), messages, check_plan, ctx.parse_retries)
    except ModelError as exc:
        return fresh | _failure(fresh, f"ModelError: plan: {exc}", halt=True)
    fresh["plan_raw"] = parsed.raw
    if parsed.value is None:
        failure = _failure(fresh, f"{parsed.error} (plan; planned the question as one sub-goal)")
        return fresh | {"plan": [question]} | failure
    subgoals = parsed.value
    if len(subgoals) > ctx.max_rounds:
        fresh |= _noted(fresh, f"warning: plan has {len(subgoals)} sub-goals; kept the first {ctx.max_rounds}")
        subgoals = subgoals[:ctx.max_rounds]
    return fresh | {"plan": subgoals}


def retrieve(state: State, runtime: Runtime[OperaContext]) -> dict[str, Any]:
    """Start the next sub-goal (placeholders filled) or retry the current one with its rewritten query."""
    ctx = context_as(OperaContext, runtime)
    notes: list[str] = []
    if not state["steps"] or state["steps"][-1]["done"]:
        index = len(state["steps"])
        query, warnings = fill_placeholders(state["plan"][index], [s["answer"] for s in state["steps"]])
        query = query or state["question"]
        steps = [*state["steps"], _new_step(state["plan"][index], query, warnings)]
        step = steps[-1]
        notes = [f"warning: sub-goal {index + 1}: {w}" for w in warnings]
    else:
        steps, step, last = _copy_last(state)
        query = last["rewrite"] or last["query"]
    attempt = _new_attempt(query, topk_for(ctx, len(step["attempts"])))
    step["attempts"].append(attempt)
    try:
        hits = retrieve_contexts(ctx, query, attempt["k"])
    except StoreError as exc:
        message = f"{type(exc).__name__}: {exc}"
        attempt["error"] = message
        step.update(answer=_best_answer(step), done=True)
        return {"steps": steps} | _failure({**state, **_noted(state, *notes)}, message, halt=True)
    attempt["hits"] = [{"id": h.id, "title": h.title, "score": round(float(h.score), 6)} for h in hits]
    attempt["context"] = format_passages(hits)
    return {"steps": steps} | _noted(state, *notes)


def analyze(state: State, runtime: Runtime[OperaContext]) -> dict[str, Any]:
    """Analysis-Answer agent: is the retrieved context sufficient for the sub-goal, and what is the answer.
    The sub-goal ends when it is, or when its rewrites are used up (keeping the best answer seen)."""
    ctx = context_as(OperaContext, runtime)
    steps, step, attempt = _copy_last(state)
    fmt = P.ANALYSIS_FORMAT_THINK if ctx.think else P.ANALYSIS_FORMAT_DIRECT
    messages = [SystemMessage(P.ANALYSIS_SYSTEM),
                HumanMessage(P.ANALYSIS_USER.format(question=state["question"], findings=_findings(steps[:-1]),
                                                    subgoal=step["query"], passages=attempt["context"], format=fmt))]
    update: dict[str, Any] = {"steps": steps}
    try:
        parsed = ask_json(get_llm(ctx, "analysis"), messages, check_analysis, ctx.parse_retries, want=dict)
    except ModelError as exc:
        attempt["error"] = f"ModelError: analysis: {exc}"
        step.update(answer=_best_answer(step), done=True)
        return update | _failure(state, attempt["error"], halt=True)
    attempt.update(analysis_raw=parsed.raw, analysis=parsed.value)
    if parsed.error:
        attempt["error"] = parsed.error
        where = f"analysis of sub-goal {len(steps)}, attempt {len(step['attempts'])}"
        update |= _failure(state, f"{parsed.error} ({where})")
    if parsed.value and parsed.value["sufficient"]:
        step.update(answer=parsed.value["answer"], sufficient=True, done=True)
    elif len(step["attempts"]) > ctx.max_rewrites:
        step.update(answer=_best_answer(step), done=True)
    return update


def rewrite(state: State, runtime: Runtime[OperaContext]) -> dict[str, Any]:
    """Rewrite agent: a new query for the current sub-goal; an unusable reply keeps the last query."""
    ctx = context_as(OperaContext, runtime)
    steps, step, attempt = _copy_last(state)
    tried = "\n".join(f"- {a['query']}" for a in step["attempts"])
    reason = (attempt["analysis"] or {}).get("reasoning") or "the passages do not contain the answer"
    titles = ", ".join(h["title"] for h in attempt["hits"]) or "none"
    messages = [SystemMessage(P.REWRITE_SYSTEM),
                HumanMessage(P.REWRITE_USER.format(question=state["question"], subgoal=step["query"], tried=tried,
                                                   reason=reason, titles=titles))]
    try:
        text = ask(get_llm(ctx, "rewrite"), messages)
    except ModelError as exc:
        attempt["error"] = f"ModelError: rewrite: {exc}"
        step.update(answer=_best_answer(step), done=True)
        return {"steps": steps} | _failure(state, attempt["error"], halt=True)
    query = parse_rewrite(text)
    attempt.update(rewrite_raw=text, rewrite=query or None)
    if not query:
        return {"steps": steps} | _noted(state, f"warning: sub-goal {len(steps)}: empty rewrite; kept the last query")
    return {"steps": steps}


def synthesize(state: State, runtime: Runtime[OperaContext]) -> dict[str, Any]:
    """The final answer from the sub-goal answers; the last sub-goal answer when the model gives none
    or the run was halted."""
    ctx = context_as(OperaContext, runtime)
    steps = state.get("steps") or []
    fallback = next((s["answer"] for s in reversed(steps) if s["answer"]), "")
    if state.get("halted") or not steps:
        return {"answer": fallback}
    messages = [SystemMessage(P.ANSWER_SYSTEM),
                HumanMessage(P.ANSWER_USER.format(question=state["question"], findings=_findings(steps)))]
    try:
        text = ask(get_llm(ctx, "answer"), messages)
    except ModelError as exc:
        return {"answer": fallback} | _failure(state, f"ModelError: answer: {exc}")
    answer = parse_final(text)
    if not answer:
        return {"answer": fallback, "synthesis_raw": text} | _failure(state, "MalformedOutput: empty final answer")
    return {"answer": answer, "synthesis_raw": text}


# -- routing -----------------------------------------------------------------------------
def _after_plan(state: State) -> str:
    return "synthesize" if state.get("halted") or not state["plan"] else "retrieve"


def _after_retrieve(state: State) -> str:
    return "synthesize" if state.get("halted") else "analyze"


def _after_analyze(state: State) -> str:
    if state.get("halted"):
        return "synthesize"
    if not state["steps"][-1]["done"]:
        return "rewrite"
    return "retrieve" if len(state["steps"]) < len(state["plan"]) else "synthesize"


def _after_rewrite(state: State) -> str:
    return "synthesize" if state.get("halted") else "retrieve"


def build(checkpointer: Any = None) -> CompiledStateGraph:
    g = StateGraph(State, context_schema=OperaContext, input_schema=QAInput, output_schema=OperaOutput)
    g.add_node("plan", plan)
    g.add_node("retrieve", retrieve)
    g.add_node("analyze", analyze)
    g.add_node("rewrite", rewrite)
    g.add_node("synthesize", synthesize)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", _after_plan, ["retrieve", "synthesize"])
    g.add_conditional_edges("retrieve", _after_retrieve, ["analyze", "synthesize"])
    g.add_conditional_edges("analyze", _after_analyze, ["rewrite", "retrieve", "synthesize"])
    g.add_conditional_edges("rewrite", _after_rewrite, ["retrieve", "synthesize"])
    g.add_edge("synthesize", END)
    return g.compile(checkpointer=checkpointer, name="opera").with_config(recursion_limit=RECURSION_LIMIT)


graph = build()
