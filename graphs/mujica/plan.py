"""Mujica's DAG: the planner's replies read, the plan validated (ids, dependencies, cycles, caps, repeats;
always on) and filtered by the plan guards (`plan_off_topic`, `plan_made_up_entity`, `plan_example_copy`,
`unecho`; their rules in `guard_rules`), and the sub-questions that are ready to run."""

from __future__ import annotations

import itertools
import re
from typing import Any, NotRequired

from typing_extensions import TypedDict

from ..answers import is_no_answer
from ..calls import clean_answer
from ..mechanisms import RELATION_QUESTION, as_relation
from . import prompts as P
from .guard_rules import dropped, topic, unechoed
from .replies import Conclusion, Plan, RelationPlan

REF = re.compile(r"#([\w-]+)|\[([\w-]+)\]")  # how a sub-question cites an earlier answer: #q1 or [q1]

ANSWERED, UNKNOWN, FAILED = "answered", "unknown", "failed"

class SubQuestion(TypedDict):
    id: str
    question: str  # as the planner wrote it, possibly citing #ids
    depends_on: list[str]
    round: int  # planner round that asked it (last)
    attempt: int  # times asked: 1, then one more per re-ask after no answer
    entity: NotRequired[str]  # with ask_as="relation": the entity (a name, or #q1) and the relation asked of it
    relation: NotRequired[str]


def merge_dag(left: list[SubQuestion], right: list[SubQuestion] | None) -> list[SubQuestion]:
    """The plan: a sub-question with a known id replaces it in place (a re-ask), others are appended.
    None resets."""
    if right is None:
        return []
    merged = {q["id"]: q for q in left}
    merged.update({q["id"]: q for q in right})
    return list(merged.values())

# -- plans ---------------------------------------------------------------------------------
def clean_id(value: Any) -> str:
    return re.sub(r"[^\w-]", "", str(value)) if value is not None else ""


def stated(value: Any) -> str:
    """The planner's answer as text; "" when it gave none (missing, null, blank)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return ""
    if not isinstance(value, (str, int, float)):
        raise ValueError("the answer must be a string")
    answer = clean_answer(str(value))
    if not answer:
        raise ValueError("the answer is empty")
    return answer


def read_turn(reply: Plan | RelationPlan | Conclusion, pending: bool, may_answer: bool = True, ctx: Any = None,
              log: list[dict] | None = None) -> tuple[str, Any]:
    """A planner reply as ("answer", text) or ("plan", (items, notes)); ValueError if unusable. An empty list of
    sub-questions is a plan with nothing to run (the planner then gives its final answer). The `unecho` guard (of
    `ctx`, firings appended to `log`) cleans the sub-questions."""
    if isinstance(reply, Conclusion):
        return "answer", _concluded(reply.answer, may_answer)
    items = []
    for q in reply.subquestions:  # a SubQuestion, or a RelationSubQuestion (its question is asked of the relation)
        asked = as_relation(q.model_dump())
        items.append((q.id, RELATION_QUESTION.format(**asked) if asked else getattr(q, "question", None),
                      getattr(q, "depends_on", []), asked))
    return "plan", _asked(items, pending, ctx, [] if log is None else log)


def read_plan(value: Any, final: bool, pending: bool, may_answer: bool = True, ctx: Any = None,
              log: list[dict] | None = None) -> tuple[str, Any]:
    """A planner reply read tolerantly (`read_turn`): a bare list of sub-questions, "sub_questions", a sub-question
    as text, dependencies as one id. An answer beside sub-questions counts only when it says something and the
    planner may conclude."""
    if isinstance(value, list):
        value = {"subquestions": value}
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    items = value.get("subquestions", value.get("sub_questions"))
    asks = isinstance(items, list) and bool(items) and not final
    if "answer" in value and not (asks and value["answer"] in (None, "")):
        answer = stated(value["answer"])
        if not answer and not asks:
            raise ValueError("the answer is empty")
        if answer and not (asks and (not may_answer or is_no_answer(answer))):
            return "answer", _concluded(value["answer"], may_answer)
    if final:
        raise ValueError('expected {"answer": "..."}')
    if not isinstance(items, list):
        raise ValueError('expected a key "answer" or "subquestions"')
    read = []
    for item in items:
        item = {"question": item} if isinstance(item, str) else item if isinstance(item, dict) else {}
        asked = as_relation(item)
        deps = item.get("depends_on", [])
        read.append((item.get("id"), RELATION_QUESTION.format(**asked) if asked else item.get("question"),
                     [deps] if isinstance(deps, str) else deps, asked))
    return "plan", _asked(read, pending, ctx, [] if log is None else log)


def _concluded(value: Any, may_answer: bool) -> str:
    """The planner's conclusion; ValueError when it is empty or comes before the planner may conclude."""
    answer = stated(value)
    if not answer:
        raise ValueError("the answer is empty")
    if not may_answer:
        raise ValueError(P.TOO_EARLY)
    return answer


def _asked(items: list[tuple[Any, Any, Any, dict]], pending: bool, ctx: Any, log: list[dict]) -> tuple[list, list]:
    """(sub-questions, notes) of a plan's items, each (id, question, depends_on, entity and relation); ValueError
    when none is usable and nothing else is pending."""
    if not items:  # nothing more to ask: the round plans nothing, and the planner is asked for its answer
        return [], []
    plan, notes = [], []
    for n, (sid, question, deps, asked) in enumerate(items, start=1):
        if isinstance(question, str):
            question = unechoed(ctx, question, log)
        if not isinstance(question, str) or not question.strip() or not isinstance(deps, list):
            notes.append(f"InvalidPlan: sub-question {n} has no question text or a malformed depends_on")
            continue
        plan.append({"id": clean_id(sid), "question": question, "depends_on": [d for d in map(clean_id, deps) if d],
                     **asked})
    if not plan and not pending:
        raise ValueError("no usable sub-questions and no answer")
    return plan, notes


def status(q: SubQuestion, results: dict[str, dict]) -> str | None:
    """answered | unknown | failed for the sub-question's latest ask, or None while it has not run."""
    r = results.get(q["id"])
    return r["status"] if r is not None and r.get("attempt", 1) == q.get("attempt", 1) else None


def asks(dag: list[SubQuestion]) -> int:
    """Sub-questions asked so far, re-asks included (what `max_subquestions` caps)."""
    return sum(q.get("attempt", 1) for q in dag)


def repair_plan(items: list[dict], dag: list[SubQuestion], cap: int, rnd: int,
                results: dict[str, dict] | None = None, about: str = "",
                entities: list[str] | None = None, ctx: Any = None,
                log: list[dict] | None = None) -> tuple[list[SubQuestion], list[str]]:
    """The new and re-asked sub-questions of a plan, made valid, and notes on every repair. The first three
    rules are guards (`plan_off_topic`, `plan_made_up_entity`, `plan_example_copy`, of `ctx`; their firings are
    appended to `log`); the others are structural.

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
    results, log = results or {}, [] if log is None else log
    notes: list[str] = []
    known = {q["id"]: q for q in dag}
    taken, kept, seen, rename = set(known), [], set(), {}
    answered = {text_key(q["question"]): q["id"] for q in dag if status(q, results) == ANSWERED}
    unknown = {text_key(q["question"]): q["id"] for q in dag if status(q, results) == UNKNOWN}
    examples = {text_key(x) for x in P.EXAMPLE_SUBQUESTIONS[getattr(ctx, "ask_as", "question")]}
    budget = cap - asks(dag)
    checked = topic(about, entities, [str(r.get("answer") or "") for r in results.values()], examples)
    off: set[str] = set()
    for item in items:
        sid, text = item["id"], item["question"]
        cites = {m.group(1) or m.group(2) for m in REF.finditer(text)} | set(item["depends_on"])
        if drop := dropped(ctx, checked, sid, text, REF.sub(" ", text), text_key(text), cites, off, log):
            notes.append(drop)
            off.add(sid)
            continue
        old = known.get(sid)
        state = status(old, results) if old else None
        if old and (state is None or state == ANSWERED) and old["question"] == text:
            continue  # an earlier sub-question restated
        same = answered.get(text_key(text))
        if same and same != sid:
            notes.append(f"InvalidPlan: {sid or 'a new id'} asks again what {same} answered; dropped")
            continue
        same = unknown.get(text_key(text))
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
        kept.append({"id": new, "question": text, "depends_on": item["depends_on"], "round": rnd, "attempt": attempt,
                     **as_relation(item)})

    ids = set(known) | {q["id"] for q in kept}

    def recite(m: re.Match) -> str:  # a citation of a renamed id follows the rename
        new = rename.get(m.group(1) or m.group(2), m.group(1) or m.group(2))
        return m.group(0) if new not in ids else f"#{new}" if m.group(1) else f"[{new}]"

    by_id = {**known, **{q["id"]: q for q in kept}}
    for q in kept:
        q["question"] = REF.sub(recite, q["question"])
        if "entity" in q:
            q["entity"] = REF.sub(recite, q["entity"])
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


def text_key(text: str) -> str:
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
