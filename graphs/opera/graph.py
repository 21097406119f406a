"""OPERA (arXiv 2508.16438): an orchestrated planner-executor for multi-hop retrieval.

The Plan agent splits the question into ordered sub-goals; a later sub-goal names the answer of an earlier
one with a placeholder (`plan`). Each sub-goal is executed: fill its placeholders, retrieve, and let
the Analysis-Answer agent judge sufficiency and extract the answer; when the passages are not enough, the
Rewrite agent reformulates the query and retrieval runs again with a larger top-k (its passages join the
earlier ones), at most `max_rewrites` times. A final synthesis turns the sub-goal answers into the answer.

    plan -> schedule -(Send per ready sub-goal)-> retrieve -> analyze -> (rewrite -> retrieve -> analyze ...)
         -> schedule -> ... -> synthesize

Departures from the paper:
- Sub-goals that wait on no unfinished sub-goal run in parallel (one LangGraph `Send` task chain each); the
  paper runs them in order.
- Retrieval searches `corpus`; with only `graph` set, it reads the facts of the best-matching entities.
- A placeholder whose step has no answer is left as written and the sub-goal is searched together with the
  question; another step's answer is never put in its place.
- Guards (graphs/guards/, each switchable and recorded in `guards`; their rules in `guard_rules`):
  `plan_runaway_cut`, `analysis_refusal` and `analysis_grounded`, and at the synthesis `options_line`,
  `date_comparison` and `option_answer` (graphs/option_guards.py), which may replace the synthesis's answer.

Replies each role is expected to give (what `fake_llms` scripts; `prompts` holds their formats):
- plan: `{"subgoals": ["Who directed Inception?", "Where was [Answer1] born?"]}` (a bare JSON list works too).
- analysis: `{"reasoning": "...", "sufficient": true, "answer": "Christopher Nolan"}` (no "reasoning" when
  `think` is off; `"status": "yes"|"no"` stands for "sufficient"; a missing "sufficient" means no).
- rewrite: `{"query": "new search query"}`, or one plain line.
- answer: the final answer as plain text (`{"answer": ...}`, `<answer>...</answer>` or "Answer: ..." work too).
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command, Overwrite, Send

from mhqa_graph.errors import EntityNotFound, ModelError, StoreError
from mhqa_graph.notes import MALFORMED, WARNING, Note, note, note_kind
from mhqa_graph.store.base import MAX_K
from mhqa_graph.text import topic_entities
from mhqa_graph.tools import MAX_FACTS, format_passages
from mhqa_graph.types import PassageHit

from ..answers import Step
from ..calls import ask, ask_json, ask_message, get_llm, get_store, reply_text
from ..mechanisms import fact_answer_schema, worked_plans
from ..option_guards import DATE_NOTE, OPTION_NOTE, settle_options
from ..settings import QAInput, check_question, context_as
from . import prompts as P
from .analysis import check_analysis, parse_final, read_analysis, read_rewrite
from .guard_rules import NOT_IN_A_PASSAGE, cut_off_reader, cut_plan, options_line
from .plan import check_plan, dependencies, fill_placeholders, plan_subgoals
from .state import RECURSION_LIMIT, OperaContext, OperaOutput, State, SubgoalTask, new_step


def topk_for(ctx: OperaContext, attempt: int) -> int:
    """The top-k of retrieval attempt `attempt` (0-based) of a sub-goal."""
    schedule = [int(k) for k in ctx.topk_schedule] or [ctx.top_k * (i + 1) for i in range(ctx.max_rewrites + 1)]
    return max(1, min(MAX_K, schedule[min(attempt, len(schedule) - 1)]))


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


def merge_pool(pool: list[dict], hits: list[PassageHit]) -> list[dict]:
    """The passages of every attempt of a sub-goal: one per id (its best score), best first."""
    best: dict[str, dict] = {p["id"]: p for p in pool}
    for h in hits:
        item = {"id": h.id, "title": h.title, "text": h.text, "score": round(float(h.score), 6)}
        if h.id not in best or item["score"] > best[h.id]["score"]:
            best[h.id] = item
    return sorted(best.values(), key=lambda p: -p["score"])


def _passages(pool: list[dict]) -> list[PassageHit]:
    return [PassageHit(id=p["id"], title=p["title"], text=p["text"], score=p["score"]) for p in pool]


# -- state helpers -----------------------------------------------------------------------
def _findings(steps: list[dict]) -> str:
    lines = [f"{s['n']}. {s['query']} -> {s['answer'] or 'not found'}" + ("" if s["sufficient"] else " (unconfirmed)")
             for s in steps]
    return "\n".join(lines) or "none"


def _compared_steps(steps: list[dict]) -> list[Step]:
    """The sub-goals as `compare_dates` reads them: the text searched, the confirmed answer, the steps used."""
    position = {s["n"]: i for i, s in enumerate(steps, start=1)}
    return [Step(s["query"], s["answer"] if s["sufficient"] else "",
                 [position[d] for d in s["depends_on"] if d in position]) for s in steps]


def _halted(state: State) -> bool:
    return bool(state.get("halted")) or any(s.get("halted") for s in state.get("steps") or [])


def _end_step(task: SubgoalTask, update: dict, error: Note) -> Command:
    """Stop the sub-goal after a model or store failure, keeping its best answer, and halt the run."""
    return Command(update={"steps": [{"n": task["n"], "answer": task["best"], "done": True, "halted": True,
                                      "attempt": {"i": task["attempt"], "error": error, **update}}],
                           "notes": [error]}, goto="schedule")


# -- nodes -------------------------------------------------------------------------------
def plan(state: State, runtime: Runtime[OperaContext]) -> dict[str, Any]:
    """Plan agent: the question's sub-goals; the question itself when no usable plan comes back.
    Resets every run field, as a checkpointed thread may be reused for a new question."""
    question = check_question(state.get("question"))
    ctx = context_as(OperaContext, runtime)
    entities = topic_entities(state.get("topic_entities"))
    fresh: dict[str, Any] = {"question": question, "plan": [], "depends_on": [], "plan_raw": [], "synthesis_raw": "",
                             "answer": "", "error": None, "halted": False, "placeholders": {},
                             "steps": Overwrite([])}
    if not (ctx.corpus or ctx.graph):
        return fresh | {"halted": True, "notes": Overwrite([note("InvalidInput", P.NO_SOURCE)]),
                        "guards": Overwrite([])}
    hint = P.PLAN_HINT.format(entities=", ".join(entities)) if entities else ""
    worked, warning = worked_plans(ctx, question)
    notes = [warning] if warning else []
    messages = [SystemMessage(P.plan_system(ctx.ask_as)), HumanMessage(P.PLAN_USER.format(
        worked=P.PLAN_WORKED.format(examples=P.worked_examples(worked)) if worked else "", question=question,
        hint=hint))]
    try:
        fmt = P.plan_format(ctx.max_rounds, entities, ctx.ask_as)
        parsed = ask_json(get_llm(ctx, "plan", reply=fmt), messages, fmt, plan_subgoals, check_plan,
                          ctx.parse_retries, cut_off=cut_off_reader(ctx))
    except ModelError as exc:
        return fresh | {"halted": True, "notes": Overwrite([*notes, note("ModelError", f"plan: {exc}")]),
                        "guards": Overwrite([])}
    firings: list[dict] = []
    subgoals = cut_plan(ctx, parsed, ctx.max_rounds, firings)
    if subgoals is None:
        subgoals = [question]
        notes.append(Note(f"{parsed.error} (plan; planned the question as one sub-goal)", MALFORMED))
    elif len(subgoals) < len(parsed.value):
        notes.append(note(WARNING, f"the plan repeats one sub-goal; cut {len(parsed.value) - len(subgoals)} repeats"))
    if len(subgoals) > ctx.max_rounds:
        notes.append(note(WARNING, f"plan has {len(subgoals)} sub-goals; kept the first {ctx.max_rounds}"))
        subgoals = subgoals[:ctx.max_rounds]
    return fresh | {"plan": subgoals, "depends_on": dependencies(subgoals), "plan_raw": parsed.raw,
                    "notes": Overwrite(notes), "guards": Overwrite(firings)}


def schedule(state: State) -> Command[Literal["retrieve", "synthesize"]]:
    """Start every sub-goal whose dependencies are done (placeholders filled), each in its own task chain;
    synthesize once all are done, or once nothing runs after a halt; else wait for the running ones."""
    steps = {s["n"]: s for s in state.get("steps") or []}
    running = [n for n, s in steps.items() if not s["done"]]
    plan_, deps = state.get("plan") or [], state.get("depends_on") or []
    ready = [] if _halted(state) else [
        n for n in range(1, len(plan_) + 1)
        if n not in steps and all(d in steps and steps[d]["done"] for d in deps[n - 1])]
    if not ready:
        return Command() if running else Command(goto="synthesize")
    answers = {n: s["answer"] for n, s in steps.items() if s["done"]}
    findings = _findings([s for s in steps.values() if s["done"]])
    records, sends, notes = [], [], []
    for n in ready:
        subgoal = plan_[n - 1]
        filled, resolved, warnings = fill_placeholders(subgoal, n, answers)
        query = P.UNRESOLVED_QUERY.format(subgoal=filled, question=state["question"]) if warnings else filled
        notes += [note(WARNING, f"sub-goal {n}: {w}") for w in warnings]
        records.append(new_step(n, subgoal, filled, deps[n - 1], resolved + len(warnings), resolved, warnings))
        sends.append(Send("retrieve", SubgoalTask(n=n, question=state["question"], subgoal=filled, query=query,
                                                  attempt=0, tried=[query], findings=findings, pool=[], hits=[],
                                                  best="", reason="")))
    return Command(update={"steps": records, "notes": notes}, goto=sends)


def retrieve(task: SubgoalTask, runtime: Runtime[OperaContext]) -> Command[Literal["analyze", "schedule"]]:
    """Search for the sub-goal's current query; the passages join those of its earlier attempts."""
    ctx = context_as(OperaContext, runtime)
    k = topk_for(ctx, task["attempt"])
    attempt = {"i": task["attempt"], "query": task["query"], "k": k}
    try:
        hits = retrieve_contexts(ctx, task["query"], k)
    except StoreError as exc:
        return _end_step(task, attempt, note(type(exc).__name__, str(exc)))
    pool = merge_pool(task["pool"], hits)
    attempt["hits"] = [{"id": h.id, "title": h.title, "score": round(float(h.score), 6)} for h in hits]
    attempt["shown"] = [p["id"] for p in pool]
    return Command(update={"steps": [{"n": task["n"], "attempt": attempt}]},
                   goto=Send("analyze", {**task, "pool": pool, "hits": attempt["hits"]}))


def analyze(task: SubgoalTask, runtime: Runtime[OperaContext]) -> Command[Literal["rewrite", "schedule"]]:
    """Analysis-Answer agent: are the passages sufficient for the sub-goal, and what is the answer.
    The sub-goal ends when they are, or when its rewrites are used up (keeping the best answer seen)."""
    ctx = context_as(OperaContext, runtime)
    n, i = task["n"], task["attempt"]
    texts = [f"{p['title']} {p['text']}" for p in task["pool"]]
    line = P.ANALYSIS_FORMAT_THINK if ctx.think else P.ANALYSIS_FORMAT_DIRECT
    passages = format_passages(_passages(task["pool"]))
    messages = [SystemMessage(P.ANALYSIS_SYSTEM),
                HumanMessage(P.ANALYSIS_USER.format(question=task["question"], findings=task["findings"],
                                                    subgoal=task["subgoal"], passages=passages, format=line))]
    firings: list[dict] = []
    try:
        answer = None if ctx.corpus else fact_answer_schema(ctx, [p["text"] for p in task["pool"]], P.FACT_NONE)
        fmt = P.analysis_format(ctx.think, answer)
        parsed = ask_json(get_llm(ctx, "analysis", reply=fmt), messages, fmt,
                          lambda reply: read_analysis(reply, texts, ctx, firings),
                          lambda value: check_analysis(value, texts, ctx, firings), ctx.parse_retries, want=dict)
    except ModelError as exc:
        return _end_step(task, {}, note("ModelError", f"analysis: {exc}"))
    attempt = {"i": i, "analysis_raw": parsed.raw, "analysis": parsed.value, "error": parsed.error}
    notes = [Note(f"{parsed.error} (analysis of sub-goal {n}, attempt {i + 1})", MALFORMED)] if parsed.error else []
    firings = [dict(f, at=f"sub-goal {n}, attempt {i + 1}") for f in firings]
    best = (parsed.value or {}).get("answer") or task["best"]
    if parsed.value and parsed.value["sufficient"]:
        step = {"answer": parsed.value["answer"], "sufficient": True, "done": True}
    elif i >= ctx.max_rewrites:
        step = {"answer": best, "done": True}
    else:
        return Command(update={"steps": [{"n": n, "attempt": attempt}], "notes": notes, "guards": firings},
                       goto=Send("rewrite", {**task, "best": best, "reason": _reason(parsed.value)}))
    return Command(update={"steps": [{"n": n, **step, "attempt": attempt}], "notes": notes, "guards": firings},
                   goto="schedule")


def _reason(analysis: dict | None) -> str:
    analysis = analysis or {}
    if analysis.get("flag") == NOT_IN_A_PASSAGE:
        return f"the answer {analysis['answer']!r} does not appear in any passage"
    return analysis.get("reasoning") or "the passages do not contain the answer"


def rewrite(task: SubgoalTask, runtime: Runtime[OperaContext]) -> Command[Literal["retrieve", "schedule"]]:
    """Rewrite agent: a new query for the sub-goal; an unusable reply keeps the last query."""
    ctx = context_as(OperaContext, runtime)
    n, i = task["n"], task["attempt"]
    tried = "\n".join(f"- {q}" for q in task["tried"])
    titles = ", ".join(h["title"] for h in task["hits"]) or "none"
    messages = [SystemMessage(P.REWRITE_SYSTEM),
                HumanMessage(P.REWRITE_USER.format(question=task["question"], subgoal=task["subgoal"],
                                                   tried=tried, reason=task["reason"], titles=titles))]
    try:
        reply = ask_message(get_llm(ctx, "rewrite", reply=P.REWRITE_FORMAT), messages)
    except ModelError as exc:
        return _end_step(task, {}, note("ModelError", f"rewrite: {exc}"))
    text, query = reply_text(reply), read_rewrite(reply)
    notes = [] if query else [note(WARNING, f"sub-goal {n}: empty rewrite; kept the last query")]
    nxt = query or task["query"]
    return Command(update={"steps": [{"n": n, "attempt": {"i": i, "rewrite_raw": text, "rewrite": query or None}}],
                           "notes": notes},
                   goto=Send("retrieve", {**task, "attempt": i + 1, "query": nxt, "tried": [*task["tried"], nxt]}))


def synthesize(state: State, runtime: Runtime[OperaContext]) -> dict[str, Any]:
    """The final answer from the sub-goal answers: the model's synthesis, else the last sub-goal answer (no
    reply, or the run was halted). Guards may then replace it with the option a date comparison picks
    (`date_comparison`) or the option a step about it found (`option_answer`). Sets `error` (the first typed
    failure in the notes) and the placeholder counts."""
    ctx = context_as(OperaContext, runtime)
    steps = state.get("steps") or []
    written, resolved = sum(s["placeholders"] for s in steps), sum(s["resolved"] for s in steps)
    update: dict[str, Any] = {"placeholders": {"written": written, "resolved": resolved,
                                               "fill_rate": round(resolved / written, 4) if written else None}}
    answer = next((s["answer"] for s in reversed(steps) if s["answer"]), "")
    new: list[Note] = []
    firings: list[dict] = []
    question, final = state["question"], ""
    if not _halted(state) and steps:
        asked = options_line(ctx, question, firings)
        messages = [SystemMessage(P.ANSWER_SYSTEM), HumanMessage(P.ANSWER_USER.format(question=asked,
                                                                                      findings=_findings(steps)))]
        try:
            text = ask(get_llm(ctx, "answer", reply=P.ANSWER_FORMAT), messages)
        except ModelError as exc:
            new.append(note("ModelError", f"answer: {exc}"))
        else:
            update["synthesis_raw"] = text
            if final := parse_final(text):
                answer = final
            else:
                new.append(note(MALFORMED, "empty final answer"))
    # an answer is mapped to an option only when the synthesis said it, not as the fallback of a halted run
    guarded, settled = settle_options(ctx, question, answer, _compared_steps(steps), firings, "the synthesis said",
                                      map_option=bool(final))
    if settled:  # the guard gave the answer
        new = [n for n in new if n.kind != MALFORMED] + [settled]
    error = next((n for n in [*(state.get("notes") or []), *new]
                  if note_kind(n) not in (WARNING, DATE_NOTE, OPTION_NOTE)), None)
    return update | {"answer": guarded, "error": error, "notes": new, "guards": firings}


def build(checkpointer: Any = None) -> CompiledStateGraph:
    g = StateGraph(State, context_schema=OperaContext, input_schema=QAInput, output_schema=OperaOutput)
    g.add_node("plan", plan)
    g.add_node("schedule", schedule)
    g.add_node("retrieve", retrieve)
    g.add_node("analyze", analyze)
    g.add_node("rewrite", rewrite)
    g.add_node("synthesize", synthesize)
    g.add_edge(START, "plan")
    g.add_edge("plan", "schedule")
    # the nodes' Commands make the others: schedule -> retrieve (a Send per ready sub-goal) | synthesize;
    # retrieve -> analyze | schedule; analyze -> rewrite | schedule; rewrite -> retrieve | schedule
    g.add_edge("synthesize", END)
    # a copy of the compiled graph with the limit in its own config (Pregel.with_config returns the same class)
    return g.compile(checkpointer=checkpointer, name="opera").with_config(recursion_limit=RECURSION_LIMIT)


graph = build()
