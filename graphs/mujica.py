"""Mujica: a planner writes a DAG of sub-questions, workers answer them in parallel, and the
planner loops on their answers until it concludes.

    start -> planner -(Send, one per ready sub-question)-> worker ... -> planner -> ... -> END

A round is one planner call. Each round, every sub-question whose dependencies are answered goes to
its own `worker` task; LangGraph runs the tasks of a step concurrently under both `invoke` (thread
pool) and `ainvoke`. A worker is a mini-RAG: retrieve contexts from the corpus or the knowledge
graph, then one model call selects the relevant ones and answers. Bad plans (cycles,
self-dependencies, unknown ids, duplicate ids) are repaired and noted; after a malformed reply or a
round that can run nothing, and in round `max_rounds`, the planner call must give the final answer.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send
from mhqa_graph.graphs import mujica_prompts as P
from typing_extensions import TypedDict

from mhqa_graph.errors import EntityNotFound, InvalidInput, MhqaError, ModelError
from mhqa_graph.parsing import strip_think, think_text
from mhqa_graph.tools import MAX_PASSAGE_CHARS, cap_text

from .common import (
    AgentContext,
    QAInput,
    QAOutput,
    ask_json,
    check_question,
    clean_answer,
    context_as,
    get_llm,
    get_store,
    setting,
)

REF = re.compile(r"#([\w-]+)|\[([\w-]+)\]")  # how a sub-question cites an earlier answer: #q1 or [q1]


@dataclass
class MujicaContext(AgentContext):
    max_subquestions: int = setting(12, help="Sub-questions per run; more are dropped with a note.")
    source: Literal["auto", "corpus", "graph"] = setting("auto", help="Where workers retrieve: corpus or graph; "
                                                         "auto = the corpus if set, else the graph.")
    kg_entities: int = setting(3, help="Entities matched per sub-question on the graph source.")
    max_facts: int = setting(30, help="Facts shown per sub-question on the graph source.")


class SubQuestion(TypedDict):
    id: str
    question: str  # as the planner wrote it, possibly citing #ids
    depends_on: list[str]
    round: int  # planner round that asked it


def merge_results(left: dict[str, dict], right: dict[str, dict] | None) -> dict[str, dict]:
    """Worker results keyed by sub-question id, in plan order whatever order workers finished in.
    None resets (a new question on the same thread)."""
    if right is None:
        return {}
    merged = {**left, **right}
    return dict(sorted(merged.items(), key=lambda kv: (kv[1]["order"], kv[0])))


def extend(left: list, right: list | None) -> list:
    """Append-only log; None resets."""
    return [] if right is None else left + right


class State(TypedDict):
    question: str
    topic_entities: NotRequired[list[str]]
    answer: str
    error: str | None
    dag: list[SubQuestion]
    results: Annotated[dict[str, dict], merge_results]  # id -> query, retrieved, selected, answer, raw, error
    notes: Annotated[list[str], extend]  # typed notes: "InvalidPlan: ...", "MalformedOutput: ...", "RoundCap: ..."
    planner_log: Annotated[list[dict], extend]  # one entry per planner call, with its raw replies
    rounds: int
    force_final: bool  # the next planner call must answer
    done: bool


class WorkerTask(TypedDict):
    sub: dict  # id, order, question, query (the question with cited answers filled in)


class MujicaOutput(QAOutput):
    dag: list[SubQuestion]
    results: dict[str, dict]
    notes: list[str]
    rounds: int


# -- plans ---------------------------------------------------------------------------------
def clean_id(value: Any) -> str:
    return re.sub(r"[^\w-]", "", str(value)) if value is not None else ""


def read_plan(value: Any, final: bool, pending: bool) -> tuple[str, Any]:
    """A planner reply as ("answer", text) or ("plan", (items, notes)); ValueError if unusable."""
    if isinstance(value, list):
        value = {"subquestions": value}
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    if "answer" in value:
        if not isinstance(value["answer"], (str, int, float)):
            raise ValueError("the answer must be a string")
        answer = clean_answer(str(value["answer"]))
        if not answer:
            raise ValueError("the answer is empty")
        return "answer", answer
    if final:
        raise ValueError('expected {"answer": "..."}')
    items = value.get("subquestions", value.get("sub_questions"))
    if not isinstance(items, list):
        raise ValueError('expected a key "answer" or "subquestions"')
    plan, notes = [], []
    for n, item in enumerate(items, start=1):
        if isinstance(item, str):
            item = {"question": item}
        question = item.get("question") if isinstance(item, dict) else None
        deps = item.get("depends_on", []) if isinstance(item, dict) else []
        deps = [deps] if isinstance(deps, str) else deps
        if not isinstance(question, str) or not question.strip() or not isinstance(deps, list):
            notes.append(f"InvalidPlan: sub-question {n} has no question text or a malformed depends_on")
            continue
        plan.append({"id": clean_id(item.get("id")), "question": " ".join(question.split()),
                     "depends_on": [d for d in map(clean_id, deps) if d]})
    if not plan and not pending:
        raise ValueError("no usable sub-questions and no answer")
    return "plan", (plan, notes)


def repair_plan(items: list[dict], dag: list[SubQuestion], cap: int, rnd: int) -> tuple[list[SubQuestion], list[str]]:
    """The new sub-questions of a plan, made valid, and notes on every repair. Ids are unique
    (a repeat within the reply is dropped, one reusing an earlier round's id is renamed), dependencies
    point to known ids (cited #ids count), and self-dependencies and cycle-closing edges are removed."""
    notes: list[str] = []
    known = {q["id"]: q for q in dag}
    taken, kept, seen, rename = set(known), [], set(), {}
    for item in items:
        sid = item["id"]
        if sid in known and known[sid]["question"] == item["question"]:
            continue  # an earlier sub-question restated
        if sid and sid in seen:
            notes.append(f"InvalidPlan: duplicate id {sid}; dropped {item['question']!r}")
            continue
        seen.add(sid)
        new = sid if sid and sid not in taken else next(f"q{i}" for i in itertools.count(1) if f"q{i}" not in taken)
        if sid in known:
            notes.append(f"InvalidPlan: duplicate id {sid} (asked in an earlier round); renamed {new}")
        if len(dag) + len(kept) >= cap:
            notes.append(f"InvalidPlan: sub-question cap {cap} reached; dropped {new}")
            continue
        if sid:
            rename[sid] = new
        taken.add(new)
        kept.append({"id": new, "question": item["question"], "depends_on": item["depends_on"], "round": rnd})

    ids = set(known) | {q["id"] for q in kept}

    def recite(m: re.Match) -> str:  # a citation of a renamed id follows the rename
        new = rename.get(m.group(1) or m.group(2), m.group(1) or m.group(2))
        return m.group(0) if new not in ids else f"#{new}" if m.group(1) else f"[{new}]"

    for q in kept:
        q["question"] = REF.sub(recite, q["question"])
        cited = [m.group(1) or m.group(2) for m in REF.finditer(q["question"])]
        deps = []
        for d in [rename.get(d, d) for d in q["depends_on"]] + [c for c in cited if c in ids]:
            if d == q["id"]:
                notes.append(f"InvalidPlan: self-dependency {d}->{d}")
            elif d not in ids:
                notes.append(f"InvalidPlan: dangling dependency {q['id']}->{d}")
            elif d not in deps:
                deps.append(d)
        q["depends_on"] = deps
    notes += _break_cycles(kept)
    return kept, list(dict.fromkeys(notes))


def _break_cycles(plan: list[SubQuestion]) -> list[str]:
    """Remove the edge that closes each dependency cycle among `plan` (depth-first, plan order)."""
    by_id = {q["id"]: q for q in plan}
    notes, state = [], {}  # id -> "open" | "closed"

    def visit(sid: str, stack: list[str]) -> None:
        state[sid] = "open"
        q = by_id[sid]
        for dep in list(q["depends_on"]):
            if dep not in by_id or state.get(dep) == "closed":
                continue
            if state.get(dep) == "open":
                cycle = stack[stack.index(dep):] + [sid, dep]
                notes.append("InvalidPlan: cycle " + "->".join(cycle))
                q["depends_on"].remove(dep)
            else:
                visit(dep, stack + [sid])
        state[sid] = "closed"

    for q in plan:
        if q["id"] not in state:
            visit(q["id"], [])
    return notes


def ready(dag: list[SubQuestion], results: dict[str, dict]) -> list[SubQuestion]:
    """Unanswered sub-questions whose dependencies are all answered."""
    return [q for q in dag if q["id"] not in results and all(d in results for d in q["depends_on"])]


def fill(question: str, results: dict[str, dict]) -> str:
    """The sub-question with each cited answer (#q1 or [q1]) written in."""
    return REF.sub(lambda m: (results[r]["answer"] or "unknown") if (r := m.group(1) or m.group(2)) in results
                   else m.group(0), question)


def progress(dag: list[SubQuestion], results: dict[str, dict]) -> str:
    """The plan as the planner sees it: each sub-question with its answer or its wait."""
    lines = []
    for q in dag:
        if r := results.get(q["id"]):
            lines.append(f"{q['id']}: {r['query']} -> {r['answer'] or '(no answer found)'}")
        else:
            after = f" (after {', '.join(q['depends_on'])})" if q["depends_on"] else ""
            lines.append(f"{q['id']}: {q['question']}{after} -> (not answered yet)")
    return "\n".join(lines) or P.NO_PROGRESS


def best_effort(results: dict[str, dict]) -> str:
    """The last non-empty worker answer in plan order, or ""."""
    return next((r["answer"] for r in reversed(results.values()) if r["answer"]), "")


# -- nodes ---------------------------------------------------------------------------------
def pick_source(ctx: MujicaContext) -> str:
    """"corpus" or "graph"; InvalidInput when the chosen source is not configured."""
    source = ctx.source if ctx.source != "auto" else ("corpus" if ctx.corpus else "graph")
    if source not in ("corpus", "graph") or not (ctx.corpus if source == "corpus" else ctx.graph):
        raise InvalidInput(f"source {ctx.source!r} needs a corpus or a graph to search; set corpus or graph")
    return source


def start(state: State, runtime: Runtime[MujicaContext]) -> dict:
    """Check the question and the source; reset the state of a reused thread."""
    pick_source(context_as(MujicaContext, runtime))
    return {"question": check_question(state["question"]), "answer": "", "error": None, "dag": [],
            "results": None, "notes": None, "planner_log": None, "rounds": 0, "force_final": False, "done": False}


def planner(state: State, runtime: Runtime[MujicaContext]) -> dict:
    """One planner round: conclude, or add sub-questions to the DAG (repaired, with notes)."""
    ctx, results, dag = context_as(MujicaContext, runtime), state["results"], state["dag"]
    failed = next((r["error"] for r in results.values() if (r["error"] or "").startswith("ModelError")), None)
    if failed:
        return {"answer": best_effort(results), "error": failed, "done": True}
    rnd = state["rounds"] + 1
    final = state["force_final"] or rnd >= ctx.max_rounds
    notes = [] if state["force_final"] or not final else [f"RoundCap: round {rnd} of {ctx.max_rounds} must answer"]
    topic = P.TOPIC.format(entities=", ".join(state["topic_entities"])) if state.get("topic_entities") else ""
    prompt = P.FINAL_USER if final else P.PLANNER_USER
    messages = [SystemMessage(P.PLANNER_SYSTEM), HumanMessage(prompt.format(
        question=state["question"], topic=topic, progress=progress(dag, results), round=rnd,
        max_rounds=ctx.max_rounds, think=P.THINK_FIRST if ctx.think else P.NO_THINK))]
    pending = bool(ready(dag, results))
    update: dict[str, Any] = {"rounds": rnd, "force_final": False}
    log = {"round": rnd, "final": final, "raw": [], "thought": "", "action": "", "error": None}
    try:
        parsed = ask_json(get_llm(ctx, "planner"), messages, lambda v: read_plan(v, final, pending),
                          retries=ctx.parse_retries)
    except ModelError as exc:
        error = f"ModelError: {exc}"
        log.update(action="failed", error=error)
        return {**update, "answer": best_effort(results), "error": error, "done": True,
                "notes": notes, "planner_log": [log]}
    log.update(raw=parsed.raw, thought=_thought(parsed.raw[-1]))
    if parsed.error:
        log.update(action="failed", error=parsed.error)
        notes.append(parsed.error)
        if final:
            return {**update, "answer": best_effort(results), "error": parsed.error, "done": True,
                    "notes": notes, "planner_log": [log]}
        return {**update, "force_final": True, "notes": notes, "planner_log": [log]}
    kind, value = parsed.value
    if kind == "answer":
        log.update(action="answer", answer=value)
        return {**update, "answer": value, "done": True, "notes": notes, "planner_log": [log]}
    items, read_notes = value
    new, repair_notes = repair_plan(items, dag, ctx.max_subquestions, rnd)
    notes += read_notes + repair_notes
    log.update(action="plan", plan=new)
    dag = dag + new
    if not ready(dag, results):
        notes.append(f"NoProgress: round {rnd} planned nothing that can run")
        update["force_final"] = True
    return {**update, "dag": dag, "notes": notes, "planner_log": [log]}


def _thought(raw: str) -> str:
    """The planner's reasoning: its <think> block, else the prose before its JSON."""
    return think_text(raw) or strip_think(raw).split("{")[0].split("```")[0].strip()


def route(state: State) -> str | list[Send]:
    """END when answered, the planner again for a forced answer, else one worker per ready sub-question."""
    if state["done"]:
        return END
    if state["force_final"]:
        return "planner"
    order = {q["id"]: i for i, q in enumerate(state["dag"])}
    return [Send("worker", {"sub": {"id": q["id"], "order": order[q["id"]], "question": q["question"],
                                    "query": fill(q["question"], state["results"])}})
            for q in ready(state["dag"], state["results"])]


@dataclass(frozen=True)
class Snippet:
    id: str  # passage id, or the fact line on the graph source
    text: str
    score: float


def retrieve(ctx: MujicaContext, query: str) -> tuple[str, list[Snippet]]:
    """The worker's source and its top contexts for `query`."""
    source, store = pick_source(ctx), get_store(ctx)
    if source == "corpus":
        hits = store.search(ctx.corpus, query, k=ctx.top_k)
        return source, [Snippet(h.id, f"{h.title}: {h.text[:MAX_PASSAGE_CHARS]}", h.score) for h in hits]
    per_entity = []
    for hit in store.match_entities(ctx.graph, query, k=ctx.kg_entities):
        try:
            info = store.node_info(ctx.graph, hit.name)
        except EntityNotFound:
            continue
        per_entity.append([Snippet(line, line, hit.score) for line in (f.as_text(info.name) for f in info.facts)])
    facts = {}  # round-robin over entities, so each matched entity contributes
    for c in itertools.chain.from_iterable(itertools.zip_longest(*per_entity)):
        if c is not None:
            facts.setdefault(c.id, c)
    return source, list(facts.values())[:ctx.max_facts]


def read_worker(value: Any, n: int) -> tuple[list[int], str]:
    """A worker reply as (selected 1-based context numbers, answer); numbers out of range are ignored."""
    if not isinstance(value, dict) or not isinstance(value.get("answer"), (str, int, float)):
        raise ValueError('expected {"relevant": [...], "answer": "..."}')
    relevant = value.get("relevant", [])
    selected = []
    for x in relevant if isinstance(relevant, list) else [relevant]:
        try:
            i = int(str(x).strip(" []#"))
        except ValueError:
            continue
        if 1 <= i <= n and i not in selected:
            selected.append(i)
    return selected, clean_answer(str(value["answer"]))


def worker(task: WorkerTask, runtime: Runtime[MujicaContext]) -> dict:
    """Answer one sub-question: retrieve contexts, then one call that selects the relevant ones and answers."""
    ctx, sub = context_as(MujicaContext, runtime), task["sub"]
    record = {"id": sub["id"], "order": sub["order"], "question": sub["question"], "query": sub["query"],
              "source": None, "retrieved": [], "selected": [], "answer": "", "raw": [], "error": None}
    contexts: list[Snippet] = []
    try:
        record["source"], contexts = retrieve(ctx, sub["query"])
    except MhqaError as exc:  # an unknown corpus or graph, a store that is down: answer without contexts
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["retrieved"] = [{"id": c.id, "score": c.score} for c in contexts]
    listing = cap_text("\n".join(f"[{i}] {c.text}" for i, c in enumerate(contexts, start=1))) or P.NO_CONTEXTS
    messages = [SystemMessage(P.WORKER_SYSTEM), HumanMessage(P.WORKER_USER.format(
        question=sub["query"], contexts=listing, think=P.THINK_FIRST if ctx.think else P.NO_THINK))]
    try:
        parsed = ask_json(get_llm(ctx, "worker"), messages, lambda v: read_worker(v, len(contexts)),
                          retries=ctx.parse_retries, want=dict)
    except ModelError as exc:
        record["error"] = f"ModelError: {exc}"
        return {"results": {sub["id"]: record}}
    record["raw"] = parsed.raw
    if parsed.error:
        record["error"] = parsed.error
    else:
        record["selected"], record["answer"] = parsed.value
    return {"results": {sub["id"]: record}}


def build(checkpointer=None) -> CompiledStateGraph:
    g = StateGraph(State, context_schema=MujicaContext, input_schema=QAInput, output_schema=MujicaOutput)
    g.add_node("start", start)
    g.add_node("planner", planner)
    g.add_node("worker", worker)
    g.add_edge(START, "start")
    g.add_edge("start", "planner")
    g.add_conditional_edges("planner", route, ["worker", "planner", END])
    g.add_edge("worker", "planner")
    return g.compile(checkpointer=checkpointer)


graph = build()
