"""Mujica (arXiv 2505.17086): a planner writes a DAG of sub-questions, workers answer them in parallel,
and the planner loops on their answers until it concludes.

    start -> planner -(Send, one per ready sub-question)-> worker ... -> collect
          collect -(every answer of the wave usable, and dependents the planner already wrote are ready)-> worker ...
          collect -> planner -> ... -> END

A round is one planner call. A sub-question is ready when every sub-question it depends on has an answer;
each goes to its own `worker` task, and LangGraph runs the tasks of a step concurrently under both `invoke`
(thread pool) and `ainvoke`. A worker is a mini-RAG: retrieve contexts from the corpus or the knowledge
graph, then one model call selects the relevant ones and answers, or says "unknown". When a wave of
workers all answered and the plan already holds sub-questions that are now ready, they go straight to the
workers; otherwise the planner is asked. A sub-question answered "unknown", with an empty answer or with no
usable reply has no answer: the sub-questions that depend on it stay blocked, and the planner sees it as
such and may re-ask it (the same id, rephrased), ask something else, or conclude.

The planner keeps one conversation across rounds, as the paper's planner and worker are each other's user
and assistant: each round adds the workers' answers (with the contexts they selected) and the state of the
plan. Its own turns are kept as what it did: its reasoning (cut to `THOUGHT_CHARS`) and the sub-questions
that ran, after repairs, or its answer; a refused early answer or a copied progress line is not shown back
to it as its own words. When the conversation outgrows `planner_budget` characters, older rounds lose their
contexts, then the oldest rounds after the first are left out. The planner may conclude only after
`min_worker_rounds` waves of workers; an answer before that is repaired, and if it stands, the question
itself goes to a worker. If the planner then concludes "unknown" although a worker answered the question
itself, that answer stands. A conclusion that reads as a sentence ("X's son is the parent of Y.") and is no
worker's answer is asked for once more, afresh, as a short answer; the sentence stands if none comes. A date
comparison the workers' dates decide is settled in code, and an answer to "which ..., X or Y?" that is what
a worker found about one option (its director) becomes that option (`graphs/compare.py`).

Bad plans (cycles, self-dependencies, unknown ids, duplicate ids, empty sub-questions, more than
`max_subquestions`) are repaired and noted. What a planner copies from the plan's progress lines into a
sub-question ("q1: ", "(after q1)", "-> answer") is cut. After a malformed reply or a round that can run
nothing, and in round `max_rounds`, the planner call must give the final answer.

Replies each role is expected to give (what `fake_llms` scripts):
- planner: `{"subquestions": [{"id": "q1", "question": "Who directed Inception?", "depends_on": []},
  {"id": "q2", "question": "Where was #q1 born?", "depends_on": ["q1"]}]}` to ask, or `{"answer": "London"}`
  to conclude (a `"answer": null` or `""` beside sub-questions is ignored; a sentence is asked again). `#q1`
  or `[q1]` in a sub-question stands for q1's answer. A `<think>` block may come first.
- worker: `{"relevant": [1, 3], "answer": "Christopher Nolan"}`, or `"answer": "unknown"` when the contexts
  do not hold it. A `<think>` block may come first.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import Runnable
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send
from typing_extensions import TypedDict

from mhqa_graph.errors import EntityNotFound, InvalidInput, MhqaError, ModelError
from mhqa_graph.parsing import strip_think, think_text
from mhqa_graph.tools import MAX_PASSAGE_CHARS, cap_text, stems

from . import mujica_prompts as P
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
from .compare import NOTE as DATE_NOTE
from .compare import OPTION_NOTE, Step, as_option, asks_yes_or_no, compare_dates
from .refusals import is_no_answer, is_sentence

REF = re.compile(r"#([\w-]+)|\[([\w-]+)\]")  # how a sub-question cites an earlier answer: #q1 or [q1]
# what a planner copies from `progress` lines into a sub-question: "q1: ", " (after q1)", " -> answer"
ECHO = re.compile(r"^q[\w.-]*:\s+|\s*\((?:after [^)]*|blocked: [^)]*|not answered yet)\)|\s+->(?:\s.*)?$")
RECURSION_LIMIT = 1000  # graph steps: start, then per round a planner step and its worker waves (two steps each)
ANSWERED, UNKNOWN, FAILED = "answered", "unknown", "failed"
EVIDENCE_CONTEXTS = 3  # selected contexts of a sub-question shown to the planner
EVIDENCE_CHARS = 300  # of each
THOUGHT_CHARS = 300  # of the planner's reasoning kept in its conversation
EARLIER_FIELDS = ("attempt", "question", "query", "retrieved", "answer", "status", "error")  # kept of a re-asked result


@dataclass
class MujicaContext(AgentContext):
    max_subquestions: int = setting(12, help="Sub-questions asked per run, re-asks included; more are dropped "
                                    "with a note.")
    source: Literal["auto", "corpus", "graph"] = setting("auto", help="Where workers retrieve: corpus or graph; "
                                                         "auto = the corpus if set, else the graph.")
    kg_entities: int = setting(3, help="Entities matched per sub-question on the graph source.")
    max_facts: int = setting(30, help="Facts shown per sub-question on the graph source.")
    min_worker_rounds: int = setting(1, help="Waves of workers before the planner may conclude (a round cap still "
                                     "ends the run).")
    planner_budget: int = setting(8000, help="Characters of the planner's conversation; older worker contexts are "
                                  "summarised to fit.")


class SubQuestion(TypedDict):
    id: str
    question: str  # as the planner wrote it, possibly citing #ids
    depends_on: list[str]
    round: int  # planner round that asked it (last)
    attempt: int  # times asked: 1, then one more per re-ask after no answer


def merge_dag(left: list[SubQuestion], right: list[SubQuestion] | None) -> list[SubQuestion]:
    """The plan: a sub-question with a known id replaces it in place (a re-ask), others are appended.
    None resets."""
    if right is None:
        return []
    merged = {q["id"]: q for q in left}
    merged.update({q["id"]: q for q in right})
    return list(merged.values())


def merge_results(left: dict[str, dict], right: dict[str, dict] | None) -> dict[str, dict]:
    """Worker results keyed by sub-question id, in plan order whatever order workers finished in; the
    result of a re-ask keeps its predecessors in `earlier`. None resets (a new question on the same thread)."""
    if right is None:
        return {}
    merged = dict(left)
    for sid, record in right.items():
        old = merged.get(sid)
        if old is not None and record.get("attempt", 1) > old.get("attempt", 1):
            summary = {k: old.get(k) for k in EARLIER_FIELDS}
            record = {**record, "earlier": [*old.get("earlier", []), summary]}
        merged[sid] = record
    return dict(sorted(merged.items(), key=lambda kv: (kv[1]["order"], kv[0])))


def extend(left: list, right: list | None) -> list:
    """Append-only log; None resets."""
    return [] if right is None else left + right


class State(TypedDict):
    question: str
    topic_entities: NotRequired[list[str]]
    answer: str
    error: str | None
    dag: Annotated[list[SubQuestion], merge_dag]
    results: Annotated[dict[str, dict], merge_results]  # id -> query, retrieved, selected, evidence, answer, status
    notes: Annotated[list[str], extend]  # typed notes: "InvalidPlan: ...", "MalformedOutput: ...", "RoundCap: ..."
    planner_log: Annotated[list[dict], extend]  # one entry per planner call: its prompt, raw replies, action
    rounds: int  # planner calls
    waves: int  # worker waves
    force_final: bool  # the next planner call must answer
    done: bool


class WorkerTask(TypedDict):
    sub: dict  # id, order, attempt, wave, question, query (the question with cited answers filled in)


class MujicaOutput(QAOutput):
    dag: list[SubQuestion]
    results: dict[str, dict]
    notes: list[str]
    rounds: int
    waves: int


# -- plans ---------------------------------------------------------------------------------
def clean_id(value: Any) -> str:
    return re.sub(r"[^\w-]", "", str(value)) if value is not None else ""


def _stated(value: Any) -> str:
    """The planner's answer as text; "" when it gave none (missing, null, blank)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return ""
    if not isinstance(value, (str, int, float)):
        raise ValueError("the answer must be a string")
    answer = clean_answer(str(value))
    if not answer:
        raise ValueError("the answer is empty")
    return answer


def read_plan(value: Any, final: bool, pending: bool, may_answer: bool = True) -> tuple[str, Any]:
    """A planner reply as ("answer", text) or ("plan", (items, notes)); ValueError if unusable. An answer
    beside sub-questions counts only when it says something and the planner may conclude. An empty list of
    sub-questions is a plan with nothing to run (the planner then gives its final answer)."""
    if isinstance(value, list):
        value = {"subquestions": value}
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    items = value.get("subquestions", value.get("sub_questions"))
    asks = isinstance(items, list) and bool(items) and not final
    if "answer" in value and not (asks and value["answer"] in (None, "")):
        answer = _stated(value["answer"])
        if not answer and not asks:
            raise ValueError("the answer is empty")
        if answer and not (asks and (not may_answer or is_no_answer(answer))):
            if not may_answer:
                raise ValueError(P.TOO_EARLY)
            return "answer", answer
    if final:
        raise ValueError('expected {"answer": "..."}')
    if not isinstance(items, list):
        raise ValueError('expected a key "answer" or "subquestions"')
    if not items:  # nothing more to ask: the round plans nothing, and the planner is asked for its answer
        return "plan", ([], [])
    plan, notes = [], []
    for n, item in enumerate(items, start=1):
        if isinstance(item, str):
            item = {"question": item}
        question = item.get("question") if isinstance(item, dict) else None
        question = unecho(question) if isinstance(question, str) else question
        deps = item.get("depends_on", []) if isinstance(item, dict) else []
        deps = [deps] if isinstance(deps, str) else deps
        if not isinstance(question, str) or not question.strip() or not isinstance(deps, list):
            notes.append(f"InvalidPlan: sub-question {n} has no question text or a malformed depends_on")
            continue
        plan.append({"id": clean_id(item.get("id")), "question": question,
                     "depends_on": [d for d in map(clean_id, deps) if d]})
    if not plan and not pending:
        raise ValueError("no usable sub-questions and no answer")
    return "plan", (plan, notes)


def unecho(text: str) -> str:
    """A sub-question without what the planner copied from the plan's progress lines: a leading "q1: ", a
    "(after q1)" or "(blocked: ...)" remark, and " -> " with the answer after it."""
    text = " ".join(text.split())
    while (stripped := ECHO.sub("", text).strip()) != text:
        text = stripped
    return text


def status(q: SubQuestion, results: dict[str, dict]) -> str | None:
    """answered | unknown | failed for the sub-question's latest ask, or None while it has not run."""
    r = results.get(q["id"])
    return r["status"] if r is not None and r.get("attempt", 1) == q.get("attempt", 1) else None


def asks(dag: list[SubQuestion]) -> int:
    """Sub-questions asked so far, re-asks included (what `max_subquestions` caps)."""
    return sum(q.get("attempt", 1) for q in dag)


def repair_plan(items: list[dict], dag: list[SubQuestion], cap: int, rnd: int,
                results: dict[str, dict] | None = None, about: str = "",
                entities: list[str] | None = None) -> tuple[list[SubQuestion], list[str]]:
    """The new and re-asked sub-questions of a plan, made valid, and notes on every repair.

    - With `about` (the question and its topic entities), a sub-question off the topic is dropped: it shares
      no word stem (`tools.stems`) with `about` or with an answer so far, and cites no sub-question that
      stays (a small planner copies the prompt's example: "Who directed Inception?"). So is a copy of one of
      the examples' sub-questions that shares no word stem with `about` ("Where was #q1 born?" for a
      question about a nationality), and one that names an entity of the examples that `about` does not
      ("When was Jaws released?" for a question about two other films).
    - With the question's topic `entities`, a sub-question that cites none is dropped when it shares no word
      stem with a topic entity or an answer so far: it is about an entity the planner made up ("What is the
      nationality of King Hamlet?" for Claudius's parents).
    - A sub-question that repeats the text of an answered one under another id is dropped (its answer stands),
      and so is one that repeats the text of one answered "unknown" (ask it in other words).
    - An id already in the plan: restating it is ignored; rephrasing one that has not run replaces it; one
      without an answer (unknown or failed) is re-asked, rephrased or not (not unchanged after "unknown");
      one with an answer keeps it, and the new sub-question is renamed.
    - Ids are unique (a repeat within the reply is dropped), dependencies point to known ids (cited #ids
      count), and self-dependencies and cycle-closing edges are removed.
    - Asks beyond `cap` are dropped."""
    results = results or {}
    notes: list[str] = []
    known = {q["id"]: q for q in dag}
    taken, kept, seen, rename = set(known), [], set(), {}
    answered = {_key(q["question"]): q["id"] for q in dag if status(q, results) == ANSWERED}
    unknown = {_key(q["question"]): q["id"] for q in dag if status(q, results) == UNKNOWN}
    examples = {_key(x) for x in P.EXAMPLE_SUBQUESTIONS}
    budget = cap - asks(dag)
    found = set().union(*(stems(str(r.get("answer") or "")) for r in results.values()))
    topic = stems(about) | found
    anchors = set().union(*(stems(e) for e in entities)) | found if entities else set()
    off: set[str] = set()
    for item in items:
        sid, text = item["id"], item["question"]
        cites = {m.group(1) or m.group(2) for m in REF.finditer(text)} | set(item["depends_on"])
        if about and not stems(REF.sub(" ", text)) & topic and not cites - off:
            notes.append(f"InvalidPlan: {sid or 'a sub-question'} is off the question's topic; dropped {text!r}")
            off.add(sid)
            continue
        if anchors and not cites and not stems(text) & anchors:
            notes.append(f"InvalidPlan: {sid or 'a sub-question'} names no topic entity and no answer so far; "
                         f"dropped {text!r}")
            off.add(sid)
            continue
        if about and (_key(text) in examples and not stems(REF.sub(" ", text)) & stems(about)
                      or _names_an_example(text, about)):
            notes.append(f"InvalidPlan: {sid or 'a sub-question'} copies the prompt's example; dropped {text!r}")
            off.add(sid)
            continue
        old = known.get(sid)
        state = status(old, results) if old else None
        if old and (state is None or state == ANSWERED) and old["question"] == text:
            continue  # an earlier sub-question restated
        same = answered.get(_key(text))
        if same and same != sid:
            notes.append(f"InvalidPlan: {sid or 'a new id'} asks again what {same} answered; dropped")
            continue
        same = unknown.get(_key(text))
        if same and same != sid:
            notes.append(f"InvalidPlan: {sid or 'a new id'} asks again unchanged what {same} could not answer; "
                         "dropped")
            continue
        if sid and sid in seen:
            notes.append(f"InvalidPlan: duplicate id {sid}; dropped {text!r}")
            continue
        seen.add(sid)
        if old and state == UNKNOWN and old["question"] == text:
            notes.append(f"InvalidPlan: {sid} was asked again unchanged after 'unknown'; rephrase it to re-ask")
            continue
        attempt = 1
        if old and state != ANSWERED:  # a re-ask (after no answer) or a rephrasing (before it ran)
            new, attempt = sid, old.get("attempt", 1) + (state is not None)
        else:
            new = sid if sid and sid not in taken else next(f"q{i}" for i in itertools.count(1) if f"q{i}" not in taken)
            if old:
                notes.append(f"InvalidPlan: duplicate id {sid} (asked in an earlier round); renamed {new}")
        cost = 1 if new not in known or state is not None else 0
        if cost > budget:
            notes.append(f"InvalidPlan: sub-question cap {cap} reached; dropped {new}")
            continue
        budget -= cost
        if sid:
            rename[sid] = new
        taken.add(new)
        kept.append({"id": new, "question": text, "depends_on": item["depends_on"], "round": rnd, "attempt": attempt})

    ids = set(known) | {q["id"] for q in kept}

    def recite(m: re.Match) -> str:  # a citation of a renamed id follows the rename
        new = rename.get(m.group(1) or m.group(2), m.group(1) or m.group(2))
        return m.group(0) if new not in ids else f"#{new}" if m.group(1) else f"[{new}]"

    by_id = {**known, **{q["id"]: q for q in kept}}
    for q in kept:
        q["question"] = REF.sub(recite, q["question"])
        cited = [m.group(1) or m.group(2) for m in REF.finditer(q["question"])]
        deps = []
        for d in [rename.get(d, d) for d in q["depends_on"]] + [c for c in cited if c in ids]:
            if d == q["id"]:
                notes.append(f"InvalidPlan: self-dependency {d}->{d}")
            elif d not in ids:
                notes.append(f"InvalidPlan: dangling dependency {q['id']}->{d}")
            elif q["id"] in known and _waits_on(by_id, d, q["id"]):
                notes.append(f"InvalidPlan: cycle {q['id']}->{d}->{q['id']}")
            elif d not in deps:
                deps.append(d)
        q["depends_on"] = deps
    notes += _break_cycles(kept)
    return kept, list(dict.fromkeys(notes))


def _names_an_example(text: str, about: str) -> bool:
    """Whether `text` names an entity of the prompt's examples that `about` does not name."""
    return any(re.search(rf"\b{re.escape(name)}\b", text, re.IGNORECASE)
               and not re.search(rf"\b{re.escape(name)}\b", about, re.IGNORECASE) for name in P.EXAMPLE_NAMES)


def _key(text: str) -> str:
    """A sub-question's text as repeats are compared: case and spacing ignored."""
    return " ".join(text.lower().split())


def _waits_on(by_id: dict[str, SubQuestion], sid: str, target: str) -> bool:
    """Whether `sid` depends on `target`, directly or through others, in the plan as it stood."""
    stack, seen = [sid], set()
    while stack:
        q = by_id.get(stack.pop())
        if q is None or q["id"] in seen:
            continue
        seen.add(q["id"])
        if target in q["depends_on"]:
            return True
        stack += q["depends_on"]
    return False


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
    """Sub-questions not run (in their latest ask) whose dependencies all have an answer."""
    by_id = {q["id"]: q for q in dag}
    return [q for q in dag if status(q, results) is None
            and all(d in by_id and status(by_id[d], results) == ANSWERED for d in q["depends_on"])]


def fill(question: str, results: dict[str, dict]) -> str:
    """The sub-question with each cited answer (#q1 or [q1]) written in; citations without an answer stay."""
    def answer(m: re.Match) -> str:
        r = results.get(m.group(1) or m.group(2))
        return r["answer"] if r is not None and r["status"] == ANSWERED else m.group(0)
    return REF.sub(answer, question)


def _outcome(r: dict) -> str:
    if r["status"] == ANSWERED:
        return r["answer"]
    return P.UNKNOWN if r["status"] == UNKNOWN else P.FAILED


def progress(dag: list[SubQuestion], results: dict[str, dict]) -> str:
    """The plan as the planner sees it: each sub-question with its answer, or why it has none, or its wait."""
    by_id, lines = {q["id"]: q for q in dag}, []
    for q in dag:
        if status(q, results) is not None:
            r = results[q["id"]]
            lines.append(f"{q['id']}: {r['query']} -> {_outcome(r)}")
            continue
        after = f" (after {', '.join(q['depends_on'])})" if q["depends_on"] else ""
        missing = [d for d in q["depends_on"] if d in by_id and status(by_id[d], results) in (UNKNOWN, FAILED)]
        wait = P.BLOCKED.format(ids=", ".join(missing)) if missing else P.WAITING
        lines.append(f"{q['id']}: {q['question']}{after} -> {wait}")
    return "\n".join(lines) or P.NO_PROGRESS


def best_effort(results: dict[str, dict]) -> str:
    """The last worker answer in plan order, or ""."""
    return next((r["answer"] for r in reversed(results.values()) if r["status"] == ANSWERED), "")


# -- the planner's conversation --------------------------------------------------------------
def report(results: dict[str, dict], since_wave: int) -> tuple[str, str]:
    """The workers' answers since wave `since_wave`, with the contexts they selected, and the same without
    the contexts (how older rounds are summarised)."""
    full, brief = [], []
    for r in results.values():
        if r["wave"] <= since_wave:
            continue
        line = f"{r['id']}: {r['query']} -> {_outcome(r)}"
        brief.append(line)
        full += [line] + [f"  context: {e}" for e in r.get("evidence", [])]
    if not brief:
        return "", ""
    return P.REPORT.format(answers="\n".join(full)), P.REPORT.format(answers="\n".join(brief))


def conversation(log: list[dict], news: tuple[str, str], ask: str, budget: int) -> tuple[list[BaseMessage], str]:
    """The planner's chat: the system prompt, each earlier round (its prompt and what it did), then this round's
    prompt: the workers' news (in full, or summarised) and `ask`. Over `budget` characters, older rounds'
    prompts give way to their summaries (oldest first), then the oldest rounds after the first are left out,
    then this round's news is summarised, then cut. Returns the messages and this round's prompt."""
    turns = [[e["prompt"], e["brief"], e["reply"]] for e in log if e.get("reply")]
    prompt = news[0] + ask

    def size() -> int:
        return len(P.PLANNER_SYSTEM) + len(prompt) + sum(len(t[0]) + len(t[2]) for t in turns)

    for turn in turns[1:]:
        if size() <= budget:
            break
        turn[0] = turn[1]
    while size() > budget and len(turns) > 1:
        del turns[1]
    if size() > budget:
        prompt = news[1] + ask
    if size() > budget:
        prompt = cap_text(news[1], max(100, budget - size() + len(news[1]))) + "\n\n" + ask
    messages: list[BaseMessage] = [SystemMessage(P.PLANNER_SYSTEM)]
    for text, _, reply in turns:
        messages += [HumanMessage(text), AIMessage(reply)]
    return messages + [HumanMessage(prompt)], prompt


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
    return {"question": check_question(state["question"]), "answer": "", "error": None, "dag": None,
            "results": None, "notes": None, "planner_log": None, "rounds": 0, "waves": 0, "force_final": False,
            "done": False}


def _prompt(state: State, ctx: MujicaContext, rnd: int, final: bool, may_answer: bool) -> tuple[tuple[str, str], str]:
    """This round's user message to the planner: the workers' news since the last round (in full, and
    summarised) and what is asked of it."""
    think = P.THINK_FIRST if ctx.think else P.NO_THINK
    plan = progress(state["dag"], state["results"])
    must_ask = "" if may_answer else P.MUST_ASK
    if not state["planner_log"]:
        topic = P.TOPIC.format(entities=", ".join(state["topic_entities"])) if state.get("topic_entities") else ""
        return ("", ""), P.PLANNER_USER.format(question=state["question"], topic=topic, progress=plan, round=rnd,
                                               max_rounds=ctx.max_rounds, must_ask=must_ask, think=think)
    news = report(state["results"], state["planner_log"][-1].get("waves", 0))
    if final:
        return news, P.FINAL_USER.format(progress=plan, think=think)
    return news, P.NEXT_USER.format(progress=plan, round=rnd, max_rounds=ctx.max_rounds, must_ask=must_ask,
                                    think=think)


def _ask_the_question(state: State, dag: list[SubQuestion], rnd: int, cap: int) -> tuple[list[SubQuestion], str]:
    """The question itself as a sub-question, when the planner gave workers nothing before it may conclude."""
    if asks(dag) >= cap:
        return [], f"NoWorker: round {rnd} gave the workers nothing and the sub-question cap {cap} is reached"
    taken = {q["id"] for q in dag}
    sid = next(f"q{i}" for i in itertools.count(1) if f"q{i}" not in taken)
    return ([{"id": sid, "question": state["question"], "depends_on": [], "round": rnd, "attempt": 1}],
            f"NoWorker: round {rnd} gave the workers nothing; asked the question itself as {sid}")


def planner(state: State, runtime: Runtime[MujicaContext]) -> dict:
    """One planner round: conclude, or add sub-questions to the DAG (repaired, with notes)."""
    ctx, results, dag = context_as(MujicaContext, runtime), state["results"], state["dag"]
    failed = next((r["error"] for r in results.values() if (r["error"] or "").startswith("ModelError")), None)
    if failed:
        return {"answer": best_effort(results), "error": failed, "done": True}
    rnd = state["rounds"] + 1
    final = state["force_final"] or rnd >= ctx.max_rounds
    may_answer = final or state["waves"] >= ctx.min_worker_rounds
    notes = [] if state["force_final"] or not final else [f"RoundCap: round {rnd} of {ctx.max_rounds} must answer"]
    news, ask = _prompt(state, ctx, rnd, final, may_answer)
    messages, prompt = conversation(state["planner_log"], news, ask, ctx.planner_budget)
    brief = (news[1] or P.NO_NEW_ANSWERS) if state["planner_log"] else prompt
    pending = bool(ready(dag, results))
    update: dict[str, Any] = {"rounds": rnd, "force_final": False}
    log = {"round": rnd, "final": final, "waves": state["waves"], "prompt": prompt, "brief": brief, "raw": [],
           "thought": "", "action": "", "error": None}
    try:
        llm = get_llm(ctx, "planner")
        parsed = ask_json(llm, messages, lambda v: read_plan(v, final, pending, may_answer),
                          retries=ctx.parse_retries)
    except ModelError as exc:
        error = f"ModelError: {exc}"
        log.update(action="failed", error=error)
        return {**update, "answer": best_effort(results), "error": error, "done": True,
                "notes": notes, "planner_log": [log]}
    log.update(raw=parsed.raw, thought=_thought(parsed.raw[-1]))
    new: list[SubQuestion] = []
    if parsed.error:
        log.update(action="failed", error=parsed.error)
        notes.append(parsed.error)
        if final:
            return {**update, "answer": best_effort(results), "error": parsed.error, "done": True,
                    "notes": notes, "planner_log": [log]}
        update["force_final"] = True
    else:
        kind, value = parsed.value
        if kind == "answer":
            if is_no_answer(value):
                if own := _answer_to_the_question(state):
                    notes.append(f"NoAnswer: the planner concluded {value!r}; a worker answered the question itself")
                    value = own
            elif is_sentence(value) and _key(value) not in {_key(r["answer"]) for r in results.values()}:
                value, note, raw = _shorten(llm, state, value)
                notes.append(note)
                log["raw"] = parsed.raw + raw
            steps = _steps(state)
            if compared := compare_dates(state["question"], steps):
                notes.append(f"{DATE_NOTE}: settled in code ({compared[1]}); the planner concluded {value!r}")
                value = compared[0]
            elif mapped := as_option(state["question"], value, steps):
                notes.append(f"{OPTION_NOTE}: {mapped[1]}")
                value = mapped[0]
            log.update(action="answer", answer=value, reply=said(log["thought"], {"answer": value}, ctx.think))
            return {**update, "answer": value, "done": True, "notes": notes, "planner_log": [log]}
        items, read_notes = value
        entities = state.get("topic_entities") or []
        new, repair_notes = repair_plan(items, dag, ctx.max_subquestions, rnd, results,
                                        " ".join([state["question"], *entities]), entities)
        notes += read_notes + repair_notes
        log.update(action="plan", plan=new)
        if not ready(merge_dag(dag, new), results):
            notes.append(f"NoProgress: round {rnd} planned nothing that can run")
            update["force_final"] = True
    if update["force_final"] and not may_answer:  # the workers must be consulted first: ask the question
        asked, note = _ask_the_question(state, merge_dag(dag, new), rnd, ctx.max_subquestions)
        new, notes, update["force_final"] = new + asked, notes + [note], not asked
        log["plan"] = log.get("plan", []) + asked
    asked_now = [{"id": q["id"], "question": q["question"], "depends_on": q["depends_on"]} for q in new]
    log["reply"] = said(log["thought"], {"subquestions": asked_now}, ctx.think)
    return {**update, "dag": new, "notes": notes, "planner_log": [log]}


def _short(value: Any, question: str) -> str:
    """The answer of a reply asked to be short; ValueError if it is missing, a sentence, no answer, or yes or
    no to a question that is not a yes-no question."""
    answer = _stated(value.get("answer")) if isinstance(value, dict) else ""
    if not answer or is_sentence(answer) or is_no_answer(answer):
        raise ValueError("expected a short answer")
    if answer.lower().strip(" .!") in ("yes", "no") and not asks_yes_or_no(question):
        raise ValueError("the question is not a yes-no question")
    return answer


def _shorten(llm: Runnable, state: State, answer: str) -> tuple[str, str, list[str]]:
    """One more call when the planner concluded with a sentence that is no worker's answer: the question and
    the plan's answers, asked afresh for the short answer (in its conversation, a small model repeats its
    sentence), or the sentence if none comes. Returns the answer, a note and the raw reply."""
    prompt = P.SHORT_USER.format(question=state["question"], progress=progress(state["dag"], state["results"]))
    try:
        again = ask_json(llm, [SystemMessage(P.PLANNER_SYSTEM), HumanMessage(prompt)],
                         lambda v: _short(v, state["question"]), retries=0)
    except ModelError as exc:
        return answer, f"LongAnswer: the planner concluded {answer!r}; asking again failed: {exc}", []
    if again.error:
        return answer, f"LongAnswer: the planner concluded {answer!r} and gave no short answer when asked", again.raw
    return again.value, f"LongAnswer: the planner concluded {answer!r}; asked, it answered {again.value!r}", again.raw


def said(thought: str, action: dict, think: bool) -> str:
    """The planner's turn as its conversation keeps it: what was done (the sub-questions sent to workers
    after repairs, or the answer), after its reasoning cut to `THOUGHT_CHARS`. A reply that was refused
    or repaired ("No" before any worker answered, a copied progress line) is not shown back to the planner
    as its own words, and runaway reasoning does not fill the budget."""
    done = json.dumps(action, ensure_ascii=False)
    return f"<think>{cap_text(thought, THOUGHT_CHARS)}</think>\n{done}" if think and thought else done


def _answer_to_the_question(state: State) -> str:
    """A worker's answer to a sub-question that is the question itself, or ""."""
    asked = _key(state["question"])
    return next((r["answer"] for r in state["results"].values()
                 if r["status"] == ANSWERED and _key(r["query"]) == asked), "")


def _steps(state: State) -> list[Step]:
    """The answered sub-questions, as `compare_dates` reads them (text as asked, answer, sub-questions cited)."""
    asked = [(q, state["results"][q["id"]]) for q in state["dag"] if q["id"] in state["results"]]
    number = {q["id"]: i for i, (q, _) in enumerate(asked, start=1)}
    return [Step(r["query"], r["answer"] if r["status"] == ANSWERED else "",
                 [number[d] for d in q["depends_on"] if d in number]) for q, r in asked]


def _thought(raw: str) -> str:
    """The planner's reasoning: its <think> block, else the prose before its JSON."""
    return think_text(raw) or strip_think(raw).split("{")[0].split("```")[0].strip()


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


def after_wave(state: State) -> str | list[Send]:
    """Straight to the workers with the sub-questions the planner already wrote that are now ready, when every
    answer of the wave is usable; else back to the planner."""
    wave = [r for r in state["results"].values() if r["wave"] == state["waves"]]
    if any(r["status"] != ANSWERED for r in wave):
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
        return {"results": {sub["id"]: record}}
    selected, answer = parsed.value
    record["selected"] = selected
    record["evidence"] = [cap_text(contexts[i - 1].text, EVIDENCE_CHARS) for i in selected[:EVIDENCE_CONTEXTS]]
    if answer and not is_no_answer(answer):
        record.update(answer=answer, status=ANSWERED)
    elif answer:
        record["status"] = UNKNOWN
    return {"results": {sub["id"]: record}}


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
