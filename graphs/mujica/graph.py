"""Mujica (arXiv 2505.17086): a planner writes a DAG of sub-questions, workers answer them in parallel,
and the planner loops on their answers until it concludes.

    start -> planner -(Send, one per ready sub-question)-> worker ... -> collect
          collect -(every answer of the wave usable, and dependents the planner already wrote are ready)-> worker ...
          collect -> planner -> ... -> END

A round is one planner call. A sub-question is ready when every sub-question it depends on has an answer;
each goes to its own `worker` task, and LangGraph runs the tasks of a step concurrently. A worker is a
mini-RAG: retrieve contexts from the corpus or the knowledge graph, then one model call selects the relevant
ones and answers, or says "unknown". A sub-question with no answer blocks the ones that depend on it; the
planner sees it as such and may re-ask it (the same id, rephrased), ask something else, or conclude. The
planner keeps one conversation across rounds (`chat`), as the paper's planner and worker are each
other's user and assistant.

Departures from the paper:
- When a wave of workers all answered and the plan already holds sub-questions that are now ready, they go
  straight to the workers without a planner call (`straight_dispatch`, a setting).
- Bad plans (cycles, self-dependencies, unknown or duplicate ids, repeats, more than `max_subquestions`) are
  repaired and noted (`plan`); after a malformed reply or a round that can run nothing, and in round
  `max_rounds`, the planner must give the final answer. It may conclude only after `min_worker_rounds` waves;
  before that, a round that asks nothing sends the question itself to a worker.
- A round that plans nothing that can run is answered with a turn of its own, naming what it asked again,
  `send_back_rounds` times (off by default); with `cite_answers` the planner sees the results as a table and may
  conclude by citing one (`{"answer": "#q2"}`).
- Guards (graphs/guards/, each switchable and recorded in `guards`; their rules in `guard_rules` and
  `conclusion`; the default set is what paid on questions 100-139, docs/benchmarks.md): on the plan `unecho`,
  `plan_made_up_entity`, `plan_example_copy`, and off by default `plan_off_topic` and `plan_unanchored` (a first
  sub-question naming nothing the question names is sent back once a round); on worker answers
  `worker_refusal` and `unknown_contexts` (a sub-question without an answer is reported with the contexts the
  worker retrieved, so the planner can ask on about the entities they name; off by default: on questions 140-159
  it turned 2 answers right and 3 wrong); on the conclusion `date_comparison`, `option_answer`, and off by
  default `no_answer_fallback`, `short_answer_reask`, `conclusion_bridge` (a conclusion repeating the answer a
  later sub-question builds on is sent back once) and `conclusion_ungrounded` (one that is no worker's answer).
  Their send-backs leave the rejected reply out of the conversation that asks again.
- On graph facts the worker's prompt names relation synonyms (released: publication date); with `rank_facts`
  the facts of the relation a sub-question names are listed first.

Replies each role is expected to give (what `fake_llms` scripts; `prompts` holds their formats):
- planner: `{"subquestions": [{"id": "q1", "question": "Who directed Inception?", "depends_on": []},
  {"id": "q2", "question": "Where was #q1 born?", "depends_on": ["q1"]}]}` to ask, or `{"answer": "London"}`
  to conclude (a `"answer": null` or `""` beside sub-questions is ignored). `#q1` or `[q1]` in a
  sub-question stands for q1's answer. A `<think>` block may come first.
- worker: `{"relevant": [1, 3], "answer": "Christopher Nolan"}`, or `"answer": "unknown"` when the contexts
  do not hold it. A `<think>` block may come first.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send

from mhqa_graph.errors import EntityNotFound, InvalidInput, MhqaError, ModelError
from mhqa_graph.notes import INVALID_PLAN, MALFORMED, NO_PROGRESS, ROUND_CAP, SENT_BACK, Note, note
from mhqa_graph.text import topic_entities
from mhqa_graph.tools import MAX_PASSAGE_CHARS, cap_text, ranked_facts

from ..calls import SentBack, ask_json, clean_answer, get_llm, get_store
from ..guards import CONCLUSION_BRIDGE, CONCLUSION_UNGROUNDED, PLAN_UNANCHORED, Guard
from ..mechanisms import fact_answer_schema, worked_plans
from ..settings import QAInput, check_question, context_as
from . import prompts as P
from .chat import (
    EVIDENCE_CHARS,
    EVIDENCE_CONTEXTS,
    best_effort,
    conversation,
    progress,
    report,
    said,
    table,
    thought_of,
)
from .conclusion import conclude
from .guard_rules import bridge, question_names, unanchored, ungrounded, worker_answer
from .plan import (
    ANSWERED,
    FAILED,
    REF,
    UNKNOWN,
    SubQuestion,
    asks,
    fill,
    merge_dag,
    read_plan,
    read_turn,
    ready,
    repair_plan,
    status,
)
from .replies import Worker
from .state import RECURSION_LIMIT, MujicaContext, MujicaOutput, State, WorkerTask

CITATION = re.compile(r"#\s*([\w-]+)|\[\s*([\w-]+)\s*\]|([\w-]+)")  # how a conclusion cites a sub-question


def cited(answer: str, ids: list[str]) -> str | None:
    """The id a conclusion cites (`cite_answers`): "#q2", "[q2]", "q2" or "#Q2." for a plan holding q2; one marked
    as a citation ("#q9") whatever the plan holds; else None (an answer written out)."""
    m = CITATION.fullmatch(answer.strip().rstrip(".!").strip())
    if m is None:
        return None
    sid = (m.group(1) or m.group(2) or m.group(3)).lower()
    known = {i.lower(): i for i in ids}
    return known.get(sid, sid if m.group(3) is None else None)


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
    return {"question": check_question(state["question"]),
            "topic_entities": topic_entities(state.get("topic_entities")), "answer": "", "error": None, "dag": None,
            "results": None, "notes": None, "guards": None, "planner_log": None, "rounds": 0, "waves": 0,
            "force_final": False, "sent_back": 0, "done": False}


def _prompt(state: State, ctx: MujicaContext, rnd: int, final: bool,
            may_answer: bool) -> tuple[tuple[str, str], str, list[Note]]:
    """This round's user message to the planner: the workers' news since the last round (in full, and
    summarised), what is asked of it, and a warning when the worked plans could not be searched."""
    think = P.THINK_FIRST if ctx.think else P.NO_THINK
    plan = (table if ctx.cite_answers else progress)(state["dag"], state["results"])
    must_ask = "" if may_answer else P.MUST_ASK
    if not state["planner_log"]:
        topic = P.TOPIC.format(entities=", ".join(state["topic_entities"])) if state.get("topic_entities") else ""
        worked, warning = worked_plans(ctx, state["question"])
        worked_text = P.WORKED.format(examples=P.worked_examples(worked)) if worked else ""
        return ("", ""), P.PLANNER_USER.format(worked=worked_text, question=state["question"], topic=topic,
                                               progress=plan, round=rnd, max_rounds=ctx.max_rounds,
                                               must_ask=must_ask, think=think), [warning] if warning else []
    last = state["planner_log"][-1]
    news = ("", "") if ctx.cite_answers else report(state["results"], last.get("waves", 0))  # the table shows them
    if final:
        conclude_as = P.CITE_FINAL if ctx.cite_answers else P.CONCLUDE
        return news, P.FINAL_USER.format(progress=plan, conclude=conclude_as, think=think), []
    if last.get("sent_back"):
        return news, P.SENT_BACK_USER.format(progress=plan, why=last["sent_back"], round=rnd,
                                             max_rounds=ctx.max_rounds, think=think), []
    return news, P.NEXT_USER.format(progress=plan, round=rnd, max_rounds=ctx.max_rounds, must_ask=must_ask,
                                    think=think), []


def _ask_the_question(state: State, dag: list[SubQuestion], rnd: int, cap: int) -> tuple[list[SubQuestion], Note]:
    """The question itself as a sub-question, when the planner gave workers nothing before it may conclude."""
    if asks(dag) >= cap:
        return [], note("NoWorker", f"round {rnd} gave the workers nothing and the sub-question cap {cap} is reached")
    taken = {q["id"] for q in dag}
    sid = next(f"q{i}" for i in itertools.count(1) if f"q{i}" not in taken)
    return ([{"id": sid, "question": state["question"], "depends_on": [], "round": rnd, "attempt": 1}],
            note("NoWorker", f"round {rnd} gave the workers nothing; asked the question itself as {sid}"))


def planner(state: State, runtime: Runtime[MujicaContext]) -> dict:
    """One planner round: conclude, or add sub-questions to the DAG (repaired, with notes)."""
    ctx, results, dag = context_as(MujicaContext, runtime), state["results"], state["dag"]
    failed = next((r["error"] for r in results.values() if (r["error"] or "").startswith("ModelError")), None)
    if failed:
        return {"answer": best_effort(results), "error": failed, "done": True}
    rnd = state["rounds"] + 1
    final = state["force_final"] or rnd >= ctx.max_rounds
    may_answer = final or state["waves"] >= ctx.min_worker_rounds
    capped = final and not state["force_final"]
    notes = [note(ROUND_CAP, f"round {rnd} of {ctx.max_rounds} must answer")] if capped else []
    news, ask, warnings = _prompt(state, ctx, rnd, final, may_answer)
    notes += warnings
    messages, prompt = conversation(state["planner_log"], news, ask, ctx.planner_budget,
                                    P.planner_system(ctx.ask_as, ctx.cite_answers),
                                    final=final and bool(state["planner_log"]))  # FINAL_USER: answer now
    brief = (news[1] or P.NO_NEW_ANSWERS) if state["planner_log"] else prompt
    pending = bool(ready(dag, results))
    update: dict[str, Any] = {"rounds": rnd, "force_final": False}
    log = {"round": rnd, "final": final, "waves": state["waves"], "prompt": prompt, "brief": brief, "raw": [],
           "thought": "", "action": "", "error": None}
    firings: list[dict] = []
    entities = state.get("topic_entities") or []
    replans: list[str] = []  # why each reply sent back for planning nothing that can run did not count
    sent: list[dict] = []  # the firings of the guards that sent a reply back (kept whichever reply is used)
    names = question_names(state["question"], entities)

    def validate(read_reply: Callable[[list[dict]], tuple[str, Any]]) -> tuple[str, Any]:
        firings.clear()  # the firings of the reply that is kept only
        kind, read = read_reply(firings)
        if kind == "answer":
            return kind, _concluded(ctx, state["question"], read, dag, results, log, sent, final)
        items, read_notes = read
        roots = [(q["id"], q["question"]) for q in items if not q["depends_on"] and not REF.search(q["question"])]
        found = [r["answer"] for r in results.values() if r["status"] == ANSWERED]
        if not _sent_back_by(PLAN_UNANCHORED, sent) and (off := unanchored(ctx, roots, names, found, sent)):
            raise SentBack(P.UNANCHORED.format(ids=", ".join(off), verb="uses" if len(off) == 1 else "use",
                                               names_verb="names" if len(off) == 1 else "name",
                                               names=", ".join(f'"{n}"' for n in names)), hide_reply=True)
        new, repaired = repair_plan(items, dag, ctx.max_subquestions, rnd, results,
                                    " ".join([state["question"], *entities]), entities, ctx, firings)
        repair_notes = [Note(n, INVALID_PLAN) for n in repaired]
        if items and not ready(merge_dag(dag, new), results) and len(replans) < ctx.replan_retries:
            why = "; ".join(n.detail for n in repair_notes) or "its sub-questions wait"
            replans.append(why)
            raise SentBack(P.NOTHING_TO_RUN.format(why=why))
        return kind, (new, [Note(n, INVALID_PLAN) for n in read_notes] + repair_notes)

    fmt = P.planner_format(final, may_answer, ctx.think, ctx.max_subquestions, entities or None, ctx.ask_as)
    try:
        llm = get_llm(ctx, "planner", reply=fmt)
        parsed = ask_json(llm, messages, fmt,
                          lambda reply: validate(partial(read_turn, reply, pending, may_answer, ctx)),
                          lambda value: validate(partial(read_plan, value, final, pending, may_answer, ctx)),
                          retries=ctx.parse_retries + ctx.replan_retries)
    except ModelError as exc:
        error = f"ModelError: {exc}"
        log.update(action="failed", error=error)
        return {**update, "answer": best_effort(results), "error": error, "done": True,
                "notes": notes, "planner_log": [log], "guards": sent}
    log.update(raw=parsed.raw, thought=thought_of(parsed.raw[-1]))
    recalled = log["thought"] if ctx.recall_thoughts else ""  # what later rounds see of this one's reasoning
    notes += [note("Replan", f"round {rnd} planned nothing that can run ({why}); sent back") for why in replans]
    new: list[SubQuestion] = []
    if parsed.error:
        firings[:] = sent  # the send-backs stay; the firings of a reply that was not used go
        log.update(action="failed", error=parsed.error)
        notes.append(Note(parsed.error, MALFORMED))
        if final:
            return {**update, "answer": best_effort(results), "error": parsed.error, "done": True,
                    "notes": notes, "planner_log": [log], "guards": firings}
        update["force_final"] = True
    else:
        firings[:0] = sent
        kind, value = parsed.value
        if kind == "answer":
            value = conclude(ctx, state, value, log, notes, firings)
            log.update(action="answer", answer=value, reply=said(recalled, {"answer": value}, ctx.think))
            return {**update, "answer": value, "done": True, "notes": notes, "planner_log": [log], "guards": firings}
        new, plan_notes = value
        notes += plan_notes
        log.update(action="plan", plan=new)
        if not ready(merge_dag(dag, new), results):
            turns = state.get("sent_back", 0)  # a thread checkpointed before the setting has none
            if may_answer and not final and turns < ctx.send_back_rounds:
                log["sent_back"] = _why_nothing_runs(new, plan_notes)
                notes.append(note(SENT_BACK, f"round {rnd} planned nothing that can run; answered with a new turn"))
                update["sent_back"] = turns + 1
            else:
                notes.append(note(NO_PROGRESS, f"round {rnd} planned nothing that can run"))
                update["force_final"] = True
    if update["force_final"] and not may_answer:  # the workers must be consulted first: ask the question
        asked, why_asked = _ask_the_question(state, merge_dag(dag, new), rnd, ctx.max_subquestions)
        new, notes, update["force_final"] = new + asked, notes + [why_asked], not asked
        log["plan"] = log.get("plan", []) + asked
    asked_now = [{"id": q["id"], "entity": q["entity"], "relation": q["relation"]} if "relation" in q else
                 {"id": q["id"], "question": q["question"], "depends_on": q["depends_on"]} for q in new]
    log["reply"] = said(recalled, {"subquestions": asked_now}, ctx.think)
    return {**update, "dag": new, "notes": notes, "planner_log": [log], "guards": firings}


def _why_nothing_runs(new: list[SubQuestion], plan_notes: list[Note]) -> str:
    """What the send-back turn (`send_back_rounds`) tells the planner about a round that planned nothing that can
    run: the repairs that dropped its sub-questions (a repeat names the sub-question that answered it), and those
    that wait for a sub-question without an answer."""
    why = [n.detail.removesuffix("; dropped") for n in plan_notes if n.kind == INVALID_PLAN]
    if new:
        why.append(f"{', '.join(q['id'] for q in new)} {'waits' if len(new) == 1 else 'wait'} for a sub-question "
                   "without an answer")
    return "; ".join(why) or P.NOTHING_NEW


def _concluded(ctx: MujicaContext, question: str, answer: str, dag: list[SubQuestion], results: dict[str, dict],
               log: dict, sent: list[dict], final: bool) -> str:
    """The planner's conclusion as read: a citation (#q2, with `cite_answers`) is the answer of the sub-question it
    cites (ValueError when it has none); one that cites nothing and repeats the answer another sub-question builds
    on is sent back once (`conclusion_bridge`), and so is one that is no worker's answer (`conclusion_ungrounded`);
    in the `final` round, a send-back asks only for the answer."""
    if ctx.cite_answers and (sid := cited(answer, [q["id"] for q in dag])):
        r = results.get(sid)
        if r is None or r["status"] != ANSWERED:
            raise ValueError(P.UNCITED.format(sid=sid))
        log["cited"] = sid
        return r["answer"]
    log.pop("cited", None)
    steps = [(q["id"], results[q["id"]]["answer"] if status(q, results) == ANSWERED else "", q["depends_on"])
             for q in dag]
    then = P.ANSWER_NOW if final else P.ANSWER_OR_ASK
    if not _sent_back_by(CONCLUSION_BRIDGE, sent) and (found := bridge(ctx, answer, steps, sent)):
        raise SentBack(P.BRIDGE.format(answer=answer, sid=found[0], later=found[1], then=then), hide_reply=True)
    said = [(sid, a) for sid, a, _ in steps if a]
    if not _sent_back_by(CONCLUSION_UNGROUNDED, sent) and ungrounded(ctx, question, answer, [a for _, a in said], sent):
        said_by = "; ".join(f"{sid}: {a}" for sid, a in said)
        raise SentBack(P.UNGROUNDED.format(answer=answer, said=said_by, then=then), hide_reply=True)
    return answer


def _sent_back_by(guard: Guard, sent: list[dict]) -> bool:
    """Whether `guard` already fired in this planner call: each send-back guard fires once a call."""
    return any(f["guard"] == guard.name for f in sent)


def _dispatch(state: State) -> list[Send]:
    """One worker task per ready sub-question, in the next wave."""
    order = {q["id"]: i for i, q in enumerate(state["dag"])}
    wave = state["waves"] + 1
    return [Send("worker", {"sub": {"id": q["id"], "order": order[q["id"]], "attempt": q.get("attempt", 1),
                                    "wave": wave, "question": q["question"],
                                    "query": fill(q["question"], state["results"])}})
            for q in ready(state["dag"], state["results"])]


def route(state: State) -> str | list[Send]:
    """END when answered, the planner again for a forced answer, else one worker per ready sub-question."""
    if state["done"]:
        return END
    if state["force_final"]:
        return "planner"
    return _dispatch(state) or "planner"


def collect(state: State) -> dict:
    """Count the wave of workers that just finished."""
    return {"waves": state["waves"] + 1}


def after_wave(state: State, runtime: Runtime[MujicaContext]) -> str | list[Send]:
    """Straight to the workers with the sub-questions the planner already wrote that are now ready, when every
    answer of the wave is usable (`straight_dispatch`); else back to the planner."""
    wave = [r for r in state["results"].values() if r["wave"] == state["waves"]]
    if not context_as(MujicaContext, runtime).straight_dispatch or any(r["status"] != ANSWERED for r in wave):
        return "planner"
    return _dispatch(state) or "planner"


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
        shown = ranked_facts(info, query) if ctx.rank_facts else info.facts
        per_entity.append([Snippet(line, line, hit.score) for line in (f.as_text(info.name) for f in shown)])
    facts = {}  # round-robin over entities, so each matched entity contributes
    for c in itertools.chain.from_iterable(itertools.zip_longest(*per_entity)):
        if c is not None:
            facts.setdefault(c.id, c)
    return source, list(facts.values())[:ctx.max_facts]


def worker_reply(reply: Worker, n: int) -> tuple[list[int], str]:
    """A worker reply as (selected 1-based context numbers, answer); numbers out of range are ignored."""
    return list(dict.fromkeys(i for i in reply.relevant if 1 <= i <= n)), clean_answer(reply.answer)


def read_worker(value: Any, n: int) -> tuple[list[int], str]:
    """A worker reply read tolerantly (`worker_reply`): the answer a number, the context numbers as text ("[2]",
    "#2") or one number alone."""
    if not isinstance(value, dict) or not isinstance(value.get("answer"), (str, int, float)):
        raise ValueError('expected {"relevant": [...], "answer": "..."}')
    relevant = value.get("relevant", [])
    numbers = []
    for x in relevant if isinstance(relevant, list) else [relevant]:
        try:
            numbers.append(int(str(x).strip(" []#")))
        except ValueError:
            continue
    return worker_reply(Worker.model_construct(relevant=numbers, answer=str(value["answer"])), n)


def worker(task: WorkerTask, runtime: Runtime[MujicaContext]) -> dict:
    """Answer one sub-question: retrieve contexts, then one call that selects the relevant ones and answers.
    The result's status: answered, unknown (the worker said so), or failed (no usable reply, empty answer)."""
    ctx, sub = context_as(MujicaContext, runtime), task["sub"]
    record = {"id": sub["id"], "order": sub["order"], "attempt": sub.get("attempt", 1), "wave": sub.get("wave", 1),
              "question": sub["question"], "query": sub["query"], "source": None, "retrieved": [], "selected": [],
              "evidence": [], "answer": "", "status": FAILED, "raw": [], "error": None}
    contexts: list[Snippet] = []
    try:
        record["source"], contexts = retrieve(ctx, sub["query"])
    except MhqaError as exc:  # an unknown corpus or graph, a store that is down: answer without contexts
        record["error"] = f"{type(exc).__name__}: {exc}"
    record["retrieved"] = [{"id": c.id, "score": c.score} for c in contexts]
    listing = cap_text("\n".join(f"[{i}] {c.text}" for i, c in enumerate(contexts, start=1))) or P.NO_CONTEXTS
    system = P.GRAPH_WORKER_SYSTEM if record["source"] == "graph" else P.WORKER_SYSTEM
    messages = [SystemMessage(system), HumanMessage(P.WORKER_USER.format(
        question=sub["query"], contexts=listing, format=Worker.line(),
        think=P.THINK_FIRST if ctx.think else P.NO_THINK))]
    answer = fact_answer_schema(ctx, [c.text for c in contexts if c.text in listing],  # the listing is capped
                                P.FACT_NONE, capitalised=True) if record["source"] == "graph" else None
    try:
        fmt = P.worker_format(len(contexts), ctx.think, answer)
        parsed = ask_json(get_llm(ctx, "worker", reply=fmt), messages, fmt,
                          lambda reply: worker_reply(reply, len(contexts)),
                          lambda value: read_worker(value, len(contexts)), retries=ctx.parse_retries, want=dict)
    except ModelError as exc:
        record["error"] = f"ModelError: {exc}"
        return {"results": {sub["id"]: record}}
    record["raw"] = parsed.raw
    if parsed.error:
        record["error"] = parsed.error
        return {"results": {sub["id"]: record}}
    selected, answer = parsed.value

    def evidence(shown: list[Snippet]) -> list[str]:
        return [cap_text(c.text, EVIDENCE_CHARS) for c in shown[:EVIDENCE_CONTEXTS]]

    record["selected"] = selected
    record["evidence"] = evidence([contexts[i - 1] for i in selected])
    firings: list[dict] = []
    if answer:
        unknown, with_retrieved = worker_answer(ctx, sub["id"], answer, bool(selected), len(contexts),
                                                min(len(contexts), EVIDENCE_CONTEXTS), firings)
        if unknown:
            record["status"] = UNKNOWN
        else:
            record.update(answer=answer, status=ANSWERED)
        if with_retrieved:
            record["evidence"] = evidence(contexts)  # retrieved, none selected (chat.report labels them)
    return {"results": {sub["id"]: record}, "guards": firings}


def build(checkpointer=None) -> CompiledStateGraph:
    g = StateGraph(State, context_schema=MujicaContext, input_schema=QAInput, output_schema=MujicaOutput)
    g.add_node("start", start)
    g.add_node("planner", planner)
    g.add_node("worker", worker)
    g.add_node("collect", collect)
    g.add_edge(START, "start")
    g.add_edge("start", "planner")
    g.add_conditional_edges("planner", route, ["worker", "planner", END])
    g.add_edge("worker", "collect")
    g.add_conditional_edges("collect", after_wave, ["worker", "planner"])
    # a copy of the compiled graph with the limit in its own config (Pregel.with_config returns the same class)
    return g.compile(checkpointer=checkpointer, name="mujica").with_config(recursion_limit=RECURSION_LIMIT)


graph = build()
