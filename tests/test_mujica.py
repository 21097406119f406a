"""Mujica planner/worker agent: parallel fan-out, dependency order and straight dispatch of ready
dependents, the planner's conversation and its budget, sub-questions without an answer (unknown, failed) and
their re-asks, min_worker_rounds, plan repair, caps, parsing, deterministic merge, KG workers, checkpoints,
dict context, streaming, malformed plans."""

import asyncio
import json
import re
import time

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph.state import CompiledStateGraph
from mhqa_graph.graphs import make_context
from mhqa_graph.graphs.answers import is_sentence
from mhqa_graph.graphs.mujica import chat as mujica_chat
from mhqa_graph.graphs.mujica import graph as mujica
from mhqa_graph.graphs.mujica.plan import read_plan, repair_plan
from mhqa_graph.graphs.mujica.state import MujicaContext, merge_results

from mhqa_graph.errors import InvalidInput, InvalidQuestion
from mhqa_graph.eval.health import health
from mhqa_graph.messages import kind_of
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.traces import TraceRecorder, trace_from_state
from mhqa_graph.types import Passage

PASSAGES = [
    Passage("p1", "Inception", "Inception is a 2010 science fiction film directed by Christopher Nolan."),
    Passage("p2", "Christopher Nolan", "Christopher Nolan is a film director who was born in London."),
    Passage("p3", "Paris", "Paris is the capital and largest city of France."),
    Passage("p4", "Berlin", "Berlin is the capital of Germany."),
    Passage("p5", "Rome", "Rome is the capital of Italy."),
]
TRIPLES = [("Inception", "directed by", "Christopher Nolan"), ("Christopher Nolan", "born in", "London"),
           ("London", "capital of", "United Kingdom")]
ANSWERS = {"directed Inception": "Christopher Nolan", "Nolan born": "London", "capital of France": "Paris",
           "capital of Germany": "Berlin", "capital of Italy": "Rome"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('mujica')}/s?embedder=hash")
    s.add_passages("wiki", PASSAGES)
    s.add_triples("kg", TRIPLES)
    yield s
    s.close()


def turn(messages) -> int:
    """The planner round a prompt (or its repair) is for; 0 for a forced final answer."""
    for m in reversed(messages):
        if m.type == "human" and "could not be used" not in m.text:
            found = re.search(r"Turn (\d+) of", m.text)
            return int(found.group(1)) if found else 0
    return 0


def planner(plans: list, final: str = '{"answer": "forced"}', **kw) -> FakeChatModel:
    """Replies plans[round - 1] (a dict is dumped as JSON), or `final` when it must answer."""
    def respond(messages):
        t = turn(messages)
        reply = plans[t - 1] if t else final
        return reply if isinstance(reply, str) else json.dumps(reply)
    return FakeChatModel(respond=respond, **kw)


def subq(id, question, *deps):
    return {"id": id, "question": question, "depends_on": list(deps)}


def question_of(messages) -> str:
    """The sub-question of a worker call (its first user message, also under a repair)."""
    return re.search(r"Question: (.*)", messages[1].text).group(1)


def answering_worker(delays: dict[str, float] | None = None, **kw) -> FakeChatModel:
    """Answers from ANSWERS by a key phrase of the sub-question, citing context 1."""
    def respond(messages):
        q = question_of(messages)
        time.sleep(next((d for k, d in (delays or {}).items() if k in q), 0))
        answer = next((a for k, a in ANSWERS.items() if k in q), "unknown")
        return f'<think>context 1 says so</think>{{"relevant": [1], "answer": "{answer}"}}'
    return FakeChatModel(respond=respond, **kw)


def ctx(store, plan_llm, work_llm, **kw) -> MujicaContext:
    return MujicaContext(role_llms={"planner": plan_llm, "worker": work_llm}, store=store,
                         corpus=kw.pop("corpus", "wiki"), **kw)


CAPITALS = {"subquestions": [subq("q1", "What is the capital of France?"),
                             subq("q2", "What is the capital of Germany?"),
                             subq("q3", "What is the capital of Italy?")]}


# -- 1. parallel fan-out ------------------------------------------------------------------------
def test_independent_subquestions_run_concurrently_under_invoke_and_ainvoke(store):
    for entry in ("invoke", "ainvoke"):
        plan = planner([CAPITALS, {"answer": "Paris, Berlin and Rome"}])
        work = answering_worker(latency=0.3)
        c = ctx(store, plan, work)
        t = time.perf_counter()
        if entry == "invoke":
            out = mujica.graph.invoke({"question": "What are the capitals of France, Germany and Italy?"}, context=c)
        else:
            out = asyncio.run(mujica.graph.ainvoke({"question": "Capitals of France, Germany, Italy?"}, context=c))
        wall = time.perf_counter() - t
        assert wall < 2 * 0.3, f"{entry}: three 0.3 s workers took {wall:.2f} s"
        assert len(work.calls) == 3 and len(plan.calls) == 2
        assert out["answer"] == "Paris, Berlin and Rome" and out["error"] is None
        assert [r["answer"] for r in out["results"].values()] == ["Paris", "Berlin", "Rome"]
        assert out["rounds"] == 2


# -- 2. dependency order --------------------------------------------------------------------------
def test_ready_dependents_go_straight_to_workers_with_the_answer_filled_in(store):
    chain = {"subquestions": [subq("q1", "Who directed Inception?"), subq("q2", "Where was #q1 born?", "q1")]}
    plan = planner([chain, {"answer": "London"}])
    work = answering_worker()
    out = mujica.graph.invoke({"question": "Where was the director of Inception born?"}, context=ctx(store, plan, work))
    assert [question_of(m) for m in work.calls] == ["Who directed Inception?", "Where was Christopher Nolan born?"]
    assert out["results"]["q2"]["query"] == "Where was Christopher Nolan born?"
    assert out["results"]["q2"]["answer"] == "London" and out["answer"] == "London"
    assert len(plan.calls) == 2 and out["rounds"] == 2 and out["waves"] == 2  # no planner call between the waves
    report = plan.calls[1][-1].text
    assert "q1: Who directed Inception? -> Christopher Nolan" in report
    assert "q2: Where was Christopher Nolan born? -> London" in report
    assert "context: Inception: Inception is a 2010 science fiction film" in report
    assert [q["id"] for q in out["dag"]] == ["q1", "q2"] and out["dag"][1]["depends_on"] == ["q1"]
    assert out["notes"] == []


def test_without_straight_dispatch_the_planner_sees_every_wave(store):
    chain = {"subquestions": [subq("q1", "Who directed Inception?"), subq("q2", "Where was #q1 born?", "q1")]}
    plan = planner([chain, {"subquestions": []}, {"answer": "London"}], final='{"answer": "London"}')
    work = answering_worker()
    out = mujica.graph.invoke({"question": "Where was the director of Inception born?"},
                              context=ctx(store, plan, work, straight_dispatch=False))
    assert [question_of(m) for m in work.calls] == ["Who directed Inception?", "Where was Christopher Nolan born?"]
    assert out["answer"] == "London" and out["waves"] == 2 and len(plan.calls) == 3  # a planner call between


def test_the_planner_keeps_its_conversation_across_rounds(store):
    chain = {"subquestions": [subq("q1", "Who directed Inception?")]}
    more = {"subquestions": [subq("q2", "Where was #q1 born?", "q1")]}
    plan = planner([f"<think>First the director.</think>{json.dumps(chain)}", more, {"answer": "London"}])
    mujica.graph.invoke({"question": "Where was the director of Inception born?"},
                        context=ctx(store, plan, answering_worker()))
    third = plan.calls[2]
    assert [m.type for m in third] == ["system", "human", "ai", "human", "ai", "human"]
    assert third[1].text.startswith("Question: Where was the director of Inception born?")
    assert third[2].text.startswith("<think>First the director.</think>") and json.loads(third[4].text) == more
    assert "q1: Who directed Inception? -> Christopher Nolan" in third[3].text
    assert [m.text for m in third[:4]] == [m.text for m in plan.calls[1]]  # earlier rounds resent as they were
    assert "q2: Where was Christopher Nolan born? -> London" in third[5].text


def test_old_worker_contexts_are_summarised_within_the_budget(store):
    plans = [{"subquestions": [subq("q1", "What is the capital of France?")]},
             {"subquestions": [subq("q2", "What is the capital of Germany?")]},
             {"subquestions": [subq("q3", "What is the capital of Italy?")]}, {"answer": "Rome"}]
    roomy, tight = planner(plans), planner(plans)
    system = len(mujica.P.PLANNER_SYSTEM)  # the budgets below leave room beside the system prompt
    for model, budget in ((roomy, 100_000), (tight, system + 1165)):
        out = mujica.graph.invoke({"question": "Capitals?"}, context=ctx(store, model, answering_worker(),
                                                                         planner_budget=budget))
        assert out["answer"] == "Rome"
    full, cut = roomy.calls[3], tight.calls[3]
    assert [m.type for m in full] == [m.type for m in cut] == ["system", "human", "ai", "human", "ai", "human",
                                                               "ai", "human"]
    assert "context: Paris: Paris is the capital" in full[3].text
    assert cut[3].text.startswith("Worker answers:\nq1: What is the capital of France? -> Paris") and \
        "context:" not in cut[3].text  # round 2's report, summarised
    assert cut[1].text == full[1].text and cut[-1].text == full[-1].text  # the question and the latest report stay
    assert sum(len(m.text) for m in cut) <= system + 1165 < sum(len(m.text) for m in full)
    tiny = planner(plans)
    mujica.graph.invoke({"question": "Capitals?"},
                        context=ctx(store, tiny, answering_worker(), planner_budget=system + 365))
    assert [m.type for m in tiny.calls[3]] == ["system", "human", "ai", "human"]  # middle rounds left out
    assert tiny.calls[3][1].text.startswith("Question: Capitals?")


def test_cited_id_becomes_a_dependency_and_bracket_citations_are_filled(store):
    chain = {"subquestions": [subq("q1", "Who directed Inception?"), subq("q2", "Where was [q1] born?")]}
    plan = planner([chain, {"answer": "London"}])
    work = answering_worker()
    out = mujica.graph.invoke({"question": "Where was the director of Inception born?"}, context=ctx(store, plan, work))
    assert out["dag"][1]["depends_on"] == ["q1"]
    assert [question_of(m) for m in work.calls] == ["Who directed Inception?", "Where was Christopher Nolan born?"]


# -- 2b. sub-questions without an answer -------------------------------------------------------------
def worker_saying(replies: dict[str, str]) -> FakeChatModel:
    """A worker that replies replies[key] when the key phrase is in the sub-question, else answers from ANSWERS."""
    fallback = answering_worker()

    def respond(messages):
        q = question_of(messages)
        return next((r for k, r in replies.items() if k in q), None) or fallback.respond(messages)
    return FakeChatModel(respond=respond)


CHAIN = {"subquestions": [subq("q1", "Who made Inception?"), subq("q2", "Where was #q1 born?", "q1")]}


@pytest.mark.parametrize("reply, shown", [
    ('<think>None of the contexts say.</think>{"relevant": [], "answer": "unknown"}', "unknown (not in the worker's"),
    ('{"relevant": [2], "answer": "The contexts do not mention who made it."}', "unknown (not in the worker's"),
    ('{"relevant": [1], "answer": ""}', "failed (the worker gave no usable answer)"),
    ("I could not find it in the contexts.", "failed (the worker gave no usable answer)"),
])
def test_a_subquestion_without_an_answer_blocks_its_dependents_and_is_reported(store, reply, shown):
    plan = planner([CHAIN, {"answer": "I do not know"}])
    work = worker_saying({"made Inception": reply})
    out = mujica.graph.invoke({"question": "Where was the maker of Inception born?"}, context=ctx(store, plan, work))
    assert [question_of(m) for m in work.calls] == ["Who made Inception?"] * len(work.calls)  # q2 never ran
    assert out["results"]["q1"]["status"] in ("unknown", "failed") and out["results"]["q1"]["answer"] == ""
    assert "q2" not in out["results"] and out["answer"] == "I do not know"
    report = plan.calls[1][-1].text
    assert f"q1: Who made Inception? -> {shown}" in report
    assert "q2: Where was #q1 born? (after q1) -> (blocked: q1 has no answer)" in report
    assert "unknown born" not in json.dumps(out)
    assert 'answer "unknown"' in work.calls[0][0].text and "best guess" not in work.calls[0][0].text


@pytest.mark.parametrize("guards, shown", [("+unknown_contexts", True), ("auto", False)])
def test_a_subquestion_without_an_answer_is_reported_with_the_contexts_its_worker_retrieved(store, guards, shown):
    plan = planner([CHAIN, {"answer": "I do not know"}])
    work = worker_saying({"made Inception": '{"relevant": [], "answer": "unknown"}'})
    out = mujica.graph.invoke({"question": "Where was the maker of Inception born?"},
                              context=ctx(store, plan, work, guards=guards))
    retrieved = [line for line in plan.calls[1][-1].text.splitlines() if line.startswith("  retrieved: ")]
    assert len(retrieved) == (mujica_chat.EVIDENCE_CONTEXTS if shown else 0)
    assert any("directed by Christopher Nolan" in line for line in retrieved) == shown
    assert [f["guard"] for f in out["guards"]] == (["unknown_contexts"] if shown else [])


def test_the_planner_re_asks_a_subquestion_without_an_answer(store):
    retry = {"subquestions": [subq("q1", "Who directed Inception?")]}
    plan = planner([CHAIN, retry, {"answer": "London"}])
    work = worker_saying({"made Inception": '{"relevant": [], "answer": "unknown"}'})
    out = mujica.graph.invoke({"question": "Where was the maker of Inception born?"}, context=ctx(store, plan, work))
    assert [question_of(m) for m in work.calls] == ["Who made Inception?", "Who directed Inception?",
                                                    "Where was Christopher Nolan born?"]
    q1 = out["results"]["q1"]
    assert (q1["attempt"], q1["status"], q1["answer"]) == (2, "answered", "Christopher Nolan")
    [earlier] = q1["earlier"]
    assert {k: earlier[k] for k in ("attempt", "query", "answer", "status", "error")} == \
        {"attempt": 1, "query": "Who made Inception?", "answer": "", "status": "unknown", "error": None}
    trace = trace_from_state(out, agent="mujica", question="Where was the maker of Inception born?")
    assert [(s.id, s.query, s.answer) for s in trace.steps] == [
        ("q1.1", "Who made Inception?", ""), ("q1", "Who directed Inception?", "Christopher Nolan"),
        ("q2", "Where was Christopher Nolan born?", "London")]
    assert trace.steps[0].retrieved and trace.steps[0].retrieved[0].id == earlier["retrieved"][0]["id"]
    assert out["dag"][0] == {"id": "q1", "question": "Who directed Inception?", "depends_on": [], "round": 2,
                             "attempt": 2}
    assert out["answer"] == "London" and out["rounds"] == 3 and len(plan.calls) == 3
    assert "q2: Where was Christopher Nolan born? -> London" in plan.calls[2][-1].text


def test_re_asks_count_against_the_cap_and_unchanged_ones_are_noted():
    dag = [{"id": "q1", "question": "A?", "depends_on": [], "round": 1, "attempt": 1},
           {"id": "q2", "question": "B #q1?", "depends_on": ["q1"], "round": 1, "attempt": 1}]
    unknown = {"q1": {"status": "unknown", "attempt": 1, "order": 0}}
    failed = {"q1": {"status": "failed", "attempt": 1, "order": 0}}
    same = [{"id": "q1", "question": "A?", "depends_on": []}]
    assert repair_plan(same, dag, 12, 2, unknown) == \
        ([], ["InvalidPlan: q1 was asked again unchanged after 'unknown'; rephrase it to re-ask"])
    new, notes = repair_plan(same, dag, 12, 2, failed)  # a failed reply may work the second time
    assert [(q["id"], q["attempt"]) for q in new] == [("q1", 2)] and notes == []
    assert repair_plan(same, dag, 2, 2, failed) == ([], ["InvalidPlan: sub-question cap 2 reached; dropped q1"])
    # a rephrasing of a sub-question that has not run replaces it: no ask spent
    new, _ = repair_plan([{"id": "q2", "question": "B of #q1, again?", "depends_on": ["q1"]}], dag, 2, 2, unknown)
    assert [(q["id"], q["attempt"], q["depends_on"]) for q in new] == [("q2", 1, ["q1"])]
    # a re-ask may not wait on its own dependents
    new, notes = repair_plan([{"id": "q1", "question": "A, again?", "depends_on": ["q2"]}], dag, 12, 2, unknown)
    assert new[0]["depends_on"] == [] and notes == ["InvalidPlan: cycle q1->q2->q1"]


def test_an_answered_sub_question_asked_again_under_a_new_id_is_dropped():
    """What qwen2.5-coder-1.5b did on PQ-2H: each round the same sub-questions under new ids, until the round cap."""
    dag = [{"id": "q1", "question": "Who is the spouse of A?", "depends_on": [], "round": 1, "attempt": 1}]
    answered = {"q1": {"status": "answered", "attempt": 1, "order": 0}}
    again = [{"id": "q3", "question": "who is the spouse of  A?", "depends_on": []}]
    assert repair_plan(again, dag, 12, 2, answered) == ([], ["InvalidPlan: q3 asks again what q1 answered; dropped"])


def test_min_worker_rounds_the_planner_must_consult_a_worker_before_it_concludes(store):
    early = '<think>I know this one.</think>{"answer": "Paris"}'
    plan = planner([early, {"answer": "Paris"}])
    work = answering_worker()
    out = mujica.graph.invoke({"question": "What is the capital of France?"}, context=ctx(store, plan, work))
    assert "Ask at least one sub-question before you answer." in plan.calls[0][-1].text
    assert "no worker has answered yet" in plan.calls[1][-1].text  # the repair
    assert "NoWorker: round 1 gave the workers nothing; asked the question itself as q1" in out["notes"]
    assert [question_of(m) for m in work.calls] == ["What is the capital of France?"]
    assert out["answer"] == "Paris" and out["rounds"] == 2 and out["waves"] == 1 and out["error"] is None
    assert "Ask at least one" not in plan.calls[2][-1].text
    plan = planner([early])
    out = mujica.graph.invoke({"question": "What is the capital of France?"},
                              context=ctx(store, plan, answering_worker(), min_worker_rounds=0))
    assert out["answer"] == "Paris" and out["waves"] == 0 and len(plan.calls) == 1


def test_the_conversation_keeps_what_the_planner_did_not_a_refused_reply(store):
    early = '<think>' + "We need the capital. " * 40 + '</think>{"answer": "No"}'
    plan = planner([early, {"answer": "Paris"}])
    mujica.graph.invoke({"question": "What is the capital of France?"}, context=ctx(store, plan, answering_worker()))
    second = plan.calls[2]  # round 2, after the refused answer and the question asked for the planner
    assert [m.type for m in second] == ["system", "human", "ai", "human"]
    thought, done = second[2].text.split("</think>\n")
    assert len(thought) <= mujica_chat.THOUGHT_CHARS + len("<think>") and '"No"' not in second[2].text
    assert json.loads(done) == {"subquestions": [subq("q1", "What is the capital of France?")]}


@pytest.mark.parametrize("copied, clean", [
    ("Who directed Inception? -> Christopher Nolan", "Who directed Inception?"),
    ("q2: Where was #q1 born? (after q1) -> (blocked: q1 has no answer) -> unknown (not in the worker's contexts)",
     "Where was #q1 born?"),
    ("Where was #q1 born? (after q1) -> (not answered yet)", "Where was #q1 born?"),
    ("Who was   born in\nLondon?", "Who was born in London?"),
])
def test_progress_lines_copied_into_a_subquestion_are_cut(copied, clean):
    _, (plan, notes) = read_plan({"subquestions": [subq("q2", copied)]}, final=False, pending=False)
    assert [q["question"] for q in plan] == [clean] and notes == []


def test_a_copied_progress_line_of_an_answered_subquestion_is_no_new_ask(store):
    first = {"subquestions": [subq("q1", "Who directed Inception?")]}
    again = {"subquestions": [subq("q2", "Who directed Inception? -> Christopher Nolan")]}
    work = answering_worker()
    out = mujica.graph.invoke({"question": "Who directed Inception?"},
                              context=ctx(store, planner([first, again]), work))
    assert len(work.calls) == 1 and list(out["results"]) == ["q1"]
    assert "InvalidPlan: q2 asks again what q1 answered; dropped" in out["notes"]


def test_a_copy_of_the_prompts_example_is_dropped_unless_the_question_asks_it():
    copied = [subq("q2", "Where was #q1 born?", "q1")]
    dag = [{"id": "q1", "question": "Who is Mary's child?", "depends_on": [], "round": 1, "attempt": 1}]
    results = {"q1": {"status": "answered", "answer": "Philippa", "attempt": 1}}
    kept, notes = repair_plan(copied, dag, 12, 2, results, about="mary de bohun 's kid 's nationality ?")
    assert kept == [] and notes == ["InvalidPlan: q2 copies the prompt's example; dropped 'Where was #q1 born?'"]
    kept, notes = repair_plan(copied, dag, 12, 2, results, about="where was mary de bohun 's kid born ?")
    assert [q["id"] for q in kept] == ["q2"] and notes == []
    P = mujica.P
    assert all(text in P.PLANNER_SYSTEM and text in P.EXAMPLE_SUBQUESTIONS["question"]
               for _, plan in P.EXAMPLES for text, _ in plan)
    assert all(f'"entity": "{e}", "relation": "{r}"' in P.RELATION_PLANNER_SYSTEM
               and P.RELATION_QUESTION.format(entity=e, relation=r) in P.EXAMPLE_SUBQUESTIONS["relation"]
               for _, plan in P.RELATION_EXAMPLES for e, r in plan)


def test_a_subquestion_naming_an_entity_of_the_examples_is_dropped_unless_the_question_names_it():
    """The real planner (2Wiki KG) asked "Who directed Inception?" for "Which film has the director who was
    born first, Autumn Tale or Secrets Of The Reef?"; its stems ("directed") pass the topic check."""
    about = "Which film has the director who was born first, Autumn Tale or Secrets Of The Reef?"
    items = [subq("q1", "Who directed Inception?"), subq("q2", "Who directed Autumn Tale?"),
             subq("q3", "Who directed jaws?")]
    kept, notes = repair_plan(items, [], 12, 1, {}, about=about)
    assert [q["question"] for q in kept] == ["Who directed Autumn Tale?"]
    assert notes == ["InvalidPlan: q1 copies the prompt's example; dropped 'Who directed Inception?'",
                     "InvalidPlan: q3 copies the prompt's example; dropped 'Who directed jaws?'"]
    kept, _ = repair_plan(items[:1], [], 12, 1, {}, about="Where was the director of Inception born?")
    assert [q["question"] for q in kept] == ["Who directed Inception?"]
    assert all(name in mujica.P.PLANNER_SYSTEM and name in mujica.P.RELATION_PLANNER_SYSTEM
               for name in mujica.P.EXAMPLE_NAMES)


def test_a_subquestion_about_an_entity_the_planner_made_up_is_dropped_when_topic_entities_are_given():
    """The real planner (PQ-2H) asked "What is the nationality of King Hamlet?" for "claudius 's parents 's
    nationality ?" (topic entity claudius); its stem "nationality" passes the topic check."""
    about, entities = "claudius 's parents 's nationality ?", ["claudius"]
    items = [subq("q1", "What is the nationality of King Hamlet?"), subq("q2", "Who are Claudius's parents?"),
             subq("q3", "What is the nationality of #q2?"), subq("q4", "Where was Nero Claudius Drusus born?")]
    kept, notes = repair_plan(items, [], 12, 1, {}, about=about + " claudius", entities=entities)
    assert [q["id"] for q in kept] == ["q2", "q3", "q4"]  # q4 shares "claudius" with the topic entity
    assert notes == ["InvalidPlan: q1 names no topic entity and no answer so far; dropped "
                     "'What is the nationality of King Hamlet?'"]
    # an answer so far anchors a sub-question that names it without citing it
    dag = [{**subq("q1", "Who are Claudius's parents?"), "round": 1, "attempt": 1}]
    results = {"q1": {"status": "answered", "attempt": 1, "answer": "Drusus"}}
    kept, notes = repair_plan([subq("q2", "What is the nationality of Drusus?")], dag, 12, 2, results,
                              about=about, entities=entities)
    assert [q["id"] for q in kept] == ["q2"] and notes == []
    kept, _ = repair_plan(items[:1], [], 12, 1, {}, about=about)  # no topic entities: only the topic check
    assert [q["id"] for q in kept] == ["q1"]


def test_the_planner_node_drops_made_up_entities_by_the_runs_topic_entities(store):
    plan = planner([{"subquestions": [subq("q1", "Who directed Tenet?"), subq("q2", "Who directed Inception?")]},
                    {"answer": "Christopher Nolan"}])
    out = mujica.graph.invoke({"question": "Who directed it, Inception?", "topic_entities": ["Inception"]},
                              context=ctx(store, plan, answering_worker()))
    assert list(out["results"]) == ["q2"] and out["answer"] == "Christopher Nolan"
    assert out["notes"] == ["InvalidPlan: q1 names no topic entity and no answer so far; dropped 'Who directed Tenet?'"]


def test_an_unknown_subquestion_asked_again_unchanged_under_a_new_id_is_dropped(store):
    plans = [{"subquestions": [subq("q1", "What is the capital of Spain?")]},
             {"subquestions": [subq("q2", "What is the capital of  spain?")]}]
    work = answering_worker()
    out = mujica.graph.invoke({"question": "What is the capital of Spain?"},
                              context=ctx(store, planner(plans, final='{"answer": "Madrid"}'), work))
    assert len(work.calls) == 1 and out["results"]["q1"]["status"] == "unknown"
    assert "InvalidPlan: q2 asks again unchanged what q1 could not answer; dropped" in out["notes"]
    assert out["answer"] == "Madrid" and out["rounds"] == 3  # NoProgress, then the forced answer


def test_unknown_from_the_planner_gives_way_to_a_workers_answer_to_the_question_itself(store):
    question = "What is the capital of France?"
    plan = planner([{"subquestions": [subq("q1", question)]}, {"answer": "unknown"}])
    on = {"guards": "+no_answer_fallback"}  # off by default: it replaces the model's answer
    out = mujica.graph.invoke({"question": question}, context=ctx(store, plan, answering_worker(), **on))
    assert out["answer"] == "Paris" and out["error"] is None
    assert "NoAnswer: the planner concluded 'unknown'; a worker answered the question itself" in out["notes"]
    plan = planner([{"subquestions": [subq("q1", "What is the capital city of France?")]}, {"answer": "unknown"}])
    out = mujica.graph.invoke({"question": question}, context=ctx(store, plan, answering_worker(), **on))
    assert out["answer"] == "unknown"  # no worker answered the question itself


@pytest.mark.parametrize("again, answer, note", [
    ('{"answer": "London"}', "London", "; asked, it answered 'London'"),
    ('{"answer": "He was born in the city of London, England."}', "Nolan was born in London, the capital city.",
     " and gave no short answer when asked"),
    ("London", "Nolan was born in London, the capital city.", " and gave no short answer when asked"),
    ('{"answer": "yes"}', "Nolan was born in London, the capital city.", " and gave no short answer when asked"),
])
def test_a_sentence_conclusion_is_asked_once_for_its_short_answer(store, again, answer, note):
    """With the guard `short_answer_reask` (off by default: it did not pay on questions 100-139)."""
    sentence = "Nolan was born in London, the capital city."
    replies = iter([json.dumps({"subquestions": [subq("q1", "Who directed Inception?")]}),
                    json.dumps({"answer": sentence}), again])
    plan = FakeChatModel(respond=lambda messages: next(replies))
    out = mujica.graph.invoke({"question": "Where was the director of Inception born?"},
                              context=ctx(store, plan, answering_worker(), guards="+short_answer_reask"))
    assert out["answer"] == answer and out["error"] is None and len(plan.calls) == 3
    assert out["notes"] == [f"LongAnswer: the planner concluded {sentence!r}{note}"]
    system, ask = plan.calls[2]  # asked afresh: the question and the plan's answers, not its own sentence
    assert system.text == mujica.P.PLANNER_SYSTEM and sentence not in ask.text and kind_of(ask) is None
    assert ask.text.startswith("Question: Where was the director of Inception born?") and \
        "q1: Who directed Inception? -> Christopher Nolan" in ask.text


def test_a_sentence_saying_there_is_no_answer_is_not_asked_again(store):
    sentence = "The birthplace of the director of Inception is unknown."
    plan = planner([{"subquestions": [subq("q1", "Who directed Inception?")]}, {"answer": sentence}])
    out = mujica.graph.invoke({"question": "Where was the director of Inception born?"},
                              context=ctx(store, plan, answering_worker()))
    assert out["answer"] == sentence and len(plan.calls) == 2 and not out["notes"]


def test_a_model_error_when_asking_for_the_short_answer_keeps_the_sentence(store):
    sentence = "Nolan was born in London, the capital city."
    plan = FakeChatModel(responses=[json.dumps({"subquestions": [subq("q1", "Who directed Inception?")]}),
                                    json.dumps({"answer": sentence})], cycle=False)  # a third call raises
    out = mujica.graph.invoke({"question": "Where was the director of Inception born?"},
                              context=ctx(store, plan, answering_worker(), guards="+short_answer_reask"))
    assert out["answer"] == sentence and out["error"] is None
    assert out["notes"][0].startswith(f"LongAnswer: the planner concluded {sentence!r}; asking again failed: ")


def test_a_long_answer_a_worker_found_is_kept_without_asking_again(store):
    title = "Where Did You Get That Girl?"  # a title that reads as a sentence
    replies = iter([json.dumps({"subquestions": [subq("q1", "Which film did Nolan make in 1998?")]}),
                    json.dumps({"answer": title}), '{"answer": "unused"}'])
    plan = FakeChatModel(respond=lambda messages: next(replies))
    work = FakeChatModel(respond=lambda m: f'{{"relevant": [1], "answer": "{title}"}}')
    out = mujica.graph.invoke({"question": "Which film did Nolan make in 1998?"}, context=ctx(store, plan, work))
    assert out["answer"] == title and len(plan.calls) == 2 and not out["notes"]


@pytest.mark.parametrize("text, sentence", [
    ("Anna of Holstein-Gottorp's son is the parent of Anna.", True),
    ("The capital is Paris", False),  # too short to tell
    ("one two three four five six seven eight nine ten eleven twelve", True),
    ("Alessandro Ruspoli, 2nd Prince of Cerveteri", False),
    ("Life Is a Long Quiet River", True),  # a title: kept when a worker found it
])
def test_sentences_are_told_from_short_answers(text, sentence):
    assert is_sentence(text) is sentence


def test_a_date_comparison_is_settled_in_code_over_the_planners_answer(store):
    """Workers found both directors' birth dates, through #q1 and #q2; the planner named a director."""
    question = "Which film has the director born earlier, Inception or Casablanca?"
    plan = planner([{"subquestions": [subq("q1", "Who directed Inception?"), subq("q2", "Who directed Casablanca?"),
                                      subq("q3", "When was #q1 born?", "q1"), subq("q4", "When was #q2 born?", "q2")]},
                    {"answer": "Michael Curtiz"}])
    work = worker_saying({"Who directed Casablanca": '{"relevant": [1], "answer": "Michael Curtiz"}',
                          "When was Michael Curtiz": '{"relevant": [1], "answer": "December 24, 1886"}',
                          "When was Christopher Nolan": '{"relevant": [1], "answer": "30 July 1970"}'})
    out = mujica.graph.invoke({"question": question}, context=ctx(store, plan, work, guards="+date_comparison"))
    assert out["answer"] == "Casablanca" and out["error"] is None
    assert ("DateComparison: settled in code (Inception: 1970-7-30; Casablanca: 1886-12-24); "
            "the planner concluded 'Michael Curtiz'") in out["notes"]


def test_an_answer_a_worker_found_about_one_option_becomes_that_option(store):
    question = "Which film has the director born earlier, Inception or Casablanca?"
    plan = planner([{"subquestions": [subq("q1", "Who directed Inception?"), subq("q2", "Who directed Casablanca?")]},
                    {"answer": "Michael Curtiz"}])
    work = worker_saying({"Who directed Casablanca": '{"relevant": [1], "answer": "Michael Curtiz"}'})
    out = mujica.graph.invoke({"question": question}, context=ctx(store, plan, work, guards="+option_answer"))
    assert out["answer"] == "Casablanca" and out["error"] is None
    assert "OptionAnswer: 'Michael Curtiz' answers step 2, about 'Casablanca'" in out["notes"]


@pytest.mark.parametrize("reply", [
    '<think>Two hops.</think>\n{"answer": null, "subquestions": [{"id": "q1", "question": "Who directed Inception?", '
    '"depends_on": []}]}',
    '```json\n{"subquestions": [{"id": "q1", "question": "Who directed Inception?", "depends_on": []}], '
    '"answer": ""}\n```',
])
def test_a_plan_with_a_null_or_empty_answer_runs(store, reply):
    plan = planner([reply, {"answer": "Christopher Nolan"}])
    out = mujica.graph.invoke({"question": "Who directed Inception?"}, context=ctx(store, plan, answering_worker()))
    assert list(out["results"]) == ["q1"] and out["answer"] == "Christopher Nolan"
    assert out["notes"] == [] and len(plan.calls) == 2


@pytest.mark.parametrize("answer", [None, "", "unknown", "London"])
def test_an_empty_answer_beside_subquestions_is_a_plan(answer):
    value = {"answer": answer, "subquestions": [subq("q1", "Who directed Inception?")]}
    kind, _ = read_plan(value, final=False, pending=False, may_answer=answer != "London")
    assert kind == "plan"
    assert read_plan(value, final=False, pending=False)[0] == ("answer" if answer == "London" else "plan")


# -- 3. invalid plans ----------------------------------------------------------------------------
@pytest.mark.parametrize("plan, note, answered", [
    ([subq("q1", "What is the capital of France?", "q2"), subq("q2", "What is the capital of Germany?", "q1")],
     "InvalidPlan: cycle q1->q2->q1", ["q1", "q2"]),
    ([subq("q1", "What is the capital of France?", "q1")], "InvalidPlan: self-dependency q1->q1", ["q1"]),
    ([subq("q1", "What is the capital of France?", "q9")], "InvalidPlan: dangling dependency q1->q9", ["q1"]),
    ([subq("q1", "What is the capital of France?"), subq("q1", "What is the capital of Italy?")],
     "InvalidPlan: duplicate id q1; dropped 'What is the capital of Italy?'", ["q1"]),
])
def test_invalid_plans_are_repaired_with_a_note(store, plan, note, answered):
    def respond(messages):  # plan, then wait while anything is unanswered, then answer
        if turn(messages) == 1:
            return json.dumps({"subquestions": plan})
        return '{"subquestions": []}' if "not answered yet" in messages[-1].text else '{"answer": "done"}'
    out = mujica.graph.invoke({"question": "Capitals?"}, context=ctx(store, FakeChatModel(respond=respond),
                                                                     answering_worker()))
    assert note in out["notes"]
    assert sorted(out["results"]) == answered
    assert out["answer"] == "done" and out["error"] is None


def test_longer_cycle_and_id_reused_in_a_later_round():
    dag = [{"id": "q1", "question": "A?", "depends_on": [], "round": 1, "attempt": 1}]
    items = [{"id": "q1", "question": "B about #q1?", "depends_on": []},  # reuses answered q1: renamed q2
             {"id": "a", "question": "C?", "depends_on": ["b"]}, {"id": "b", "question": "D?", "depends_on": ["c"]},
             {"id": "c", "question": "E?", "depends_on": ["a", "q1"]}]
    new, notes = repair_plan(items, dag, cap=12, rnd=2, results={"q1": {"status": "answered", "attempt": 1}})
    assert "InvalidPlan: duplicate id q1 (asked in an earlier round); renamed q2" in notes
    assert "InvalidPlan: cycle a->b->c->a" in notes
    assert [(q["id"], q["question"], q["depends_on"]) for q in new] == [
        ("q2", "B about #q2?", []), ("a", "C?", ["b"]), ("b", "D?", ["c"]), ("c", "E?", ["q2"])]
    assert "InvalidPlan: self-dependency q2->q2" in notes  # the renamed reply cited its own id


def test_missing_ids_are_assigned_and_subquestion_cap_drops_extras():
    items = [{"id": "", "question": f"Q{i}?", "depends_on": []} for i in range(4)]
    new, notes = repair_plan(items, [], cap=3, rnd=1)
    assert [q["id"] for q in new] == ["q1", "q2", "q3"]
    assert notes == ["InvalidPlan: sub-question cap 3 reached; dropped q4"]


# -- 4. round cap --------------------------------------------------------------------------------
def test_round_cap_forces_a_final_answer(store):
    endless = [{"subquestions": [subq(f"q{i}", f"What is the capital of France, take {i}?")]} for i in range(1, 10)]
    plan = planner(endless, final='{"answer": "Paris"}')
    out = mujica.graph.invoke({"question": "Capital of France?"}, context=ctx(store, plan, answering_worker(),
                                                                              max_rounds=3))
    assert out["rounds"] == 3 and len(plan.calls) == 3
    assert "No more sub-questions" in plan.calls[-1][-1].text
    assert "RoundCap: round 3 of 3 must answer" in out["notes"]
    assert out["answer"] == "Paris" and out["error"] is None and sorted(out["results"]) == ["q1", "q2"]


def test_malformed_forced_answer_falls_back_to_the_last_worker_answer(store):
    plan = planner([CAPITALS], final="I cannot say.")
    out = mujica.graph.invoke({"question": "Capitals?"}, context=ctx(store, plan, answering_worker(), max_rounds=2))
    assert out["answer"] == "Rome" and out["error"].startswith("MalformedOutput")
    assert len(plan.calls) == 1 + 2  # round 1, then the forced answer and its one repair


# -- 5. malformed planner output -----------------------------------------------------------------
@pytest.mark.parametrize("reply", [
    "I think we should look up the capital.",
    '{"subquestions": [{"id": "q1", "question": "What is the capi',
    '{"steps": ["find the capital"]}',
    '{"answer": ""}',
    '{"subquestions": [{"id": "q1"}, 3]}',
])
def test_malformed_planner_output_ends_with_a_forced_answer(store, reply):
    plan = planner([reply] * 7, final='{"answer": "Paris"}')
    out = mujica.graph.invoke({"question": "Capital of France?"}, context=ctx(store, plan, answering_worker(),
                                                                              min_worker_rounds=0))
    assert out["answer"] == "Paris" and out["error"] is None
    assert any(n.startswith("MalformedOutput") for n in out["notes"])
    assert len(plan.calls) == 3 and out["rounds"] == 2 and out["results"] == {}
    # the planner must consult a worker first: the question itself goes to one, then the planner goes on
    plan = planner([reply] * 7, final='{"answer": "Paris"}')
    question = "What is the capital of France?"
    out = mujica.graph.invoke({"question": question}, context=ctx(store, plan, answering_worker()))
    assert out["answer"] == "Paris" and out["error"] is None and out["rounds"] == 3 and len(plan.calls) == 5
    assert [(r["query"], r["answer"]) for r in out["results"].values()] == [(question, "Paris")]
    assert [n.split(":")[0] for n in out["notes"]] == ["MalformedOutput", "NoWorker", "MalformedOutput"]


def test_repair_prompt_recovers_a_plan(store):
    def respond(messages):
        if turn(messages) == 1:
            return json.dumps(CAPITALS) if "could not be used" in messages[-1].text else "Let me think..."
        return '```json\n{"answer": "Paris"}\n```'
    plan = FakeChatModel(respond=respond)
    out = mujica.graph.invoke({"question": "Capitals?"}, context=ctx(store, plan, answering_worker()))
    assert out["answer"] == "Paris" and sorted(out["results"]) == ["q1", "q2", "q3"] and out["notes"] == []


def test_worker_reply_parsing_is_tolerant(store):
    replies = iter(['{"relevant": [0, "2", 99, "[3]", 2], "answer": "Answer: Paris"}', "no json here", "still none"])
    work = FakeChatModel(respond=lambda m: next(replies))
    plan = planner([{"subquestions": [subq("q1", "What is the capital of France?")]},
                    {"subquestions": [subq("q2", "What is the capital of Italy?")]}, {"answer": "Paris"}])
    out = mujica.graph.invoke({"question": "Capitals?"}, context=ctx(store, plan, work, top_k=3))
    assert out["results"]["q1"]["selected"] == [2, 3] and out["results"]["q1"]["answer"] == "Paris"
    assert out["results"]["q2"]["answer"] == "" and out["results"]["q2"]["error"].startswith("MalformedOutput")
    assert out["results"]["q2"]["raw"] == ["no json here", "still none"]
    assert out["results"]["q2"]["status"] == "failed"
    assert "q2: What is the capital of Italy? -> failed (the worker gave no usable answer)" in plan.calls[2][-1].text
    assert out["answer"] == "Paris"


def test_model_errors_end_the_run_cleanly(store):
    plan = planner([CAPITALS, {"answer": "x"}])
    broken = FakeChatModel(responses=[], cycle=False)  # every call raises ModelError
    out = mujica.graph.invoke({"question": "Capitals?"}, context=ctx(store, plan, broken))
    assert out["error"].startswith("ModelError") and out["answer"] == "" and len(plan.calls) == 1
    out = mujica.graph.invoke({"question": "Capitals?"}, context=ctx(store, broken, answering_worker()))
    assert out["error"].startswith("ModelError") and out["answer"] == "" and out["rounds"] == 1


def test_caller_errors_propagate(store):
    with pytest.raises(InvalidQuestion):
        mujica.graph.invoke({"question": "  "}, context=ctx(store, planner([]), answering_worker()))
    with pytest.raises(InvalidInput):
        mujica.graph.invoke({"question": "Q?"}, context=ctx(store, planner([]), answering_worker(), corpus=None))


# -- 6. deterministic merge ----------------------------------------------------------------------
def test_results_merge_in_plan_order_whatever_the_completion_order(store):
    slow = answering_worker(delays={"France": 0.2, "Germany": 0.1})  # q3 finishes first, q1 last
    finished = []

    def respond(messages):
        reply = slow.respond(messages)
        finished.append(question_of(messages))
        return reply

    work = FakeChatModel(respond=respond)
    plan = planner([CAPITALS, {"answer": "done"}])
    chunks = list(mujica.graph.stream({"question": "Capitals?"}, context=ctx(store, plan, work),
                                      stream_mode=["updates", "values"]))
    assert [q.split()[-1] for q in finished] == ["Italy?", "Germany?", "France?"]
    assert [next(iter(c["worker"]["results"])) for mode, c in chunks if mode == "updates" and "worker" in c] \
        == ["q3", "q2", "q1"]
    assert list(chunks[-1][1]["results"]) == ["q1", "q2", "q3"]
    a, b = {"q2": {"order": 1}}, {"q10": {"order": 2}, "q1": {"order": 0}}
    assert list(merge_results(merge_results({}, a), b)) == list(merge_results(merge_results({}, b), a)) \
        == ["q1", "q2", "q10"]
    assert merge_results(a, None) == {}


# -- 7. knowledge-graph workers ------------------------------------------------------------------
def test_graph_source_worker_answers_from_facts(store):
    plan = planner([{"subquestions": [subq("q1", "Who directed Inception?")]}, {"answer": "Christopher Nolan"}])
    work = answering_worker()
    out = mujica.graph.invoke({"question": "Who directed Inception?"},
                              context=ctx(store, plan, work, corpus=None, graph="kg", kg_entities=2))
    r = out["results"]["q1"]
    assert r["source"] == "graph" and r["answer"] == "Christopher Nolan" and r["selected"] == [1]
    assert "(Inception) -[directed by]-> (Christopher Nolan)" in [x["id"] for x in r["retrieved"]]
    assert "[1] (" in work.calls[0][-1].text and "directed by" in work.calls[0][-1].text
    assert work.calls[0][0].text == mujica.P.GRAPH_WORKER_SYSTEM  # how a fact reads, relation synonyms
    text = answering_worker()
    mujica.graph.invoke({"question": "Who directed Inception?"},
                        context=ctx(store, planner([{"subquestions": [subq("q1", "Who directed Inception?")]},
                                                    {"answer": "x"}]), text))
    assert text.calls[0][0].text == mujica.P.WORKER_SYSTEM and "-[relation]->" not in mujica.P.WORKER_SYSTEM
    both = ctx(store, planner([{"subquestions": [subq("q1", "Who directed Inception?")]}, {"answer": "x"}]),
               answering_worker(), graph="kg", source="graph")
    assert mujica.graph.invoke({"question": "Q?"}, context=both)["results"]["q1"]["source"] == "graph"


def test_with_answer_from_facts_a_graph_worker_answers_with_an_end_of_a_shown_fact(store):
    def asked(**kw) -> FakeChatModel:
        work = answering_worker(accepts_grammar=True)
        plan = planner([{"subquestions": [subq("q1", "Who directed Inception?")]}, {"answer": "x"}])
        mujica.graph.invoke({"question": "Who directed Inception?"}, context=ctx(store, plan, work, **kw))
        return work

    grammar = asked(corpus=None, graph="kg", kg_entities=2, answer_from_facts=True).grammars[0]
    assert "Christopher Nolan" in grammar and "unknown" in grammar
    assert "Christopher Nolan" not in asked(corpus=None, graph="kg", kg_entities=2).grammars[0]
    assert "Christopher Nolan" not in asked(answer_from_facts=True).grammars[0]  # passages: free text


def test_a_graph_worker_may_capitalise_a_name_the_facts_write_in_lower_case():
    """PathQuestion's graph writes "shah shuja"; the model starts a name with a capital, which a grammar of the facts'
    spelling alone forbade (its way out was "unknown"). Names the graph capitalises get no variant."""
    from mhqa_graph.graphs.mechanisms import fact_answer_schema

    facts = ["(shah jahan) -[children]-> (shah shuja)", "(Inception) -[director]-> (Christopher Nolan)",
             "(ernesto de la cruz) -[born]-> (1920)"]
    on = mujica.MujicaContext(answer_from_facts=True)
    assert fact_answer_schema(on, facts, mujica.P.FACT_NONE, capitalised=True)["enum"] == [
        "shah jahan", "Shah Jahan", "shah shuja", "Shah Shuja", "Inception", "Christopher Nolan",
        "ernesto de la cruz", "Ernesto De La Cruz", "1920", "unknown", "yes", "no"]
    assert "Shah Shuja" not in fact_answer_schema(on, facts, mujica.P.FACT_NONE)["enum"]


def test_with_rank_facts_a_graph_worker_sees_the_asked_relation_first(tmp_path):
    """Found on PQ-2H 0-99: the worker's facts come from each matched entity in turn, in stored order, so the asked
    relation's fact is not first for a third of the questions. `rank_facts` lists it first (husband is spouse)."""
    s = open_store(f"embedded://{tmp_path}/s?embedder=hash")
    s.add_triples("kg", [("Ada Lovelace", "occupation", "mathematician"), ("Ada Lovelace", "nationality", "England"),
                         ("Ada Lovelace", "spouse", "William King"), ("Lord Byron", "children", "Ada Lovelace")])
    query = "Who is the husband of Ada Lovelace?"
    plain = [c.id for c in mujica.retrieve(mujica.MujicaContext(store=s, graph="kg"), query)[1]]
    ranked = [c.id for c in mujica.retrieve(mujica.MujicaContext(store=s, graph="kg", rank_facts=True), query)[1]]
    assert sorted(plain) == sorted(ranked) and plain[0] != ranked[0]
    assert ranked[0] == "(Ada Lovelace) -[spouse]-> (William King)"
    capped = mujica.retrieve(mujica.MujicaContext(store=s, graph="kg", rank_facts=True, max_facts=1), query)[1]
    assert [c.id for c in capped] == ranked[:1]  # the cap keeps the asked relation
    s.close()


def test_corpus_worker_records_retrieved_ids_and_scores(store):
    plan = planner([{"subquestions": [subq("q1", "Who directed Inception?")]}, {"answer": "Christopher Nolan"}])
    out = mujica.graph.invoke({"question": "Who directed Inception?"}, context=ctx(store, plan, answering_worker()))
    r = out["results"]["q1"]
    assert r["source"] == "corpus" and r["retrieved"][0]["id"] == "p1"
    assert all(isinstance(x["score"], float) for x in r["retrieved"]) and len(r["retrieved"]) <= 5


def test_store_errors_are_recorded_and_the_worker_answers_without_contexts(store):
    plan = planner([{"subquestions": [subq("q1", "What is the capital of France?")]}, {"answer": "Paris"}])
    work = answering_worker()
    out = mujica.graph.invoke({"question": "Capital of France?"}, context=ctx(store, plan, work, corpus="missing"))
    r = out["results"]["q1"]
    assert r["error"].startswith("UnknownCorpus") and r["retrieved"] == [] and r["answer"] == "Paris"
    assert "(no contexts found)" in work.calls[0][-1].text and out["answer"] == "Paris"

# -- 8. checkpoint and resume --------------------------------------------------------------------
class Crash(BaseException):
    """Stands in for an interrupt: not an Exception, so no layer turns it into a ModelError."""


def test_sqlite_checkpoint_resumes_without_redoing_steps(store, tmp_path):
    plan = planner([CAPITALS, {"answer": "Paris, Berlin and Rome"}])
    crashed = []

    def respond(messages):
        if "Germany" in question_of(messages) and not crashed:
            crashed.append(1)
            raise Crash("interrupted")
        return answering_worker().respond(messages)

    work = FakeChatModel(respond=respond)
    config = {"configurable": {"thread_id": "t1"}}
    with SqliteSaver.from_conn_string(str(tmp_path / "ckpt.sqlite")) as saver:
        g = mujica.build(checkpointer=saver)
        c = ctx(store, plan, work)
        with pytest.raises(Crash):
            g.invoke({"question": "Capitals?"}, config, context=c)
        assert len(plan.calls) == 1
        out = g.invoke(None, config, context=c)
        assert out["answer"] == "Paris, Berlin and Rome"
        assert len(plan.calls) == 2  # round 1 was not redone
        asked = sorted(question_of(m) for m in work.calls)
        assert asked == ["What is the capital of France?", "What is the capital of Germany?",
                         "What is the capital of Germany?", "What is the capital of Italy?"]
        assert list(g.get_state(config).values["results"]) == ["q1", "q2", "q3"]
        # a new question on the same thread starts from a clean state
        plan2 = planner([{"subquestions": [subq("q1", "Who directed Inception?")]}, {"answer": "Nolan"}])
        out = g.invoke({"question": "Director of Inception?"}, config, context=ctx(store, plan2, answering_worker()))
        assert list(out["results"]) == ["q1"] and out["answer"] == "Nolan" and out["notes"] == []
        assert len(g.get_state(config).values["planner_log"]) == 2


# -- 9. dict context -----------------------------------------------------------------------------
def test_plain_dict_context(store):
    plan = planner([CAPITALS, {"answer": "Paris"}])
    context = {"role_llms": {"planner": plan, "worker": answering_worker()}, "store": store, "corpus": "wiki",
               "max_subquestions": 2, "think": False}
    out = mujica.graph.invoke({"question": "Capitals?"}, context=context)
    assert sorted(out["results"]) == ["q1", "q2"]
    assert "InvalidPlan: sub-question cap 2 reached; dropped q3" in out["notes"]
    assert "Reply with the JSON only." in plan.calls[0][1].text


# -- 10. streaming -------------------------------------------------------------------------------
def test_stream_updates_show_each_planner_and_worker_step(store):
    plan = planner([CAPITALS, {"answer": "done"}])
    chunks = list(mujica.graph.stream({"question": "Capitals?"}, context=ctx(store, plan, answering_worker()),
                                      stream_mode="updates"))
    nodes = [next(iter(c)) for c in chunks]
    assert nodes == ["start", "planner", "worker", "worker", "worker", "collect", "planner"]
    for c in chunks:  # a worker's update is its own result: hit ids and scores, only the chosen contexts' text
        for r in c.get("worker", {}).get("results", {}).values():
            assert all(set(h) == {"id", "score"} for h in r["retrieved"]) and len(r["evidence"]) == 1
            assert all(len(e) <= mujica.EVIDENCE_CHARS for e in r["evidence"])
    assert sorted(next(iter(c["worker"]["results"])) for c in chunks if "worker" in c) == ["q1", "q2", "q3"]
    assert chunks[1]["planner"]["planner_log"][0]["action"] == "plan"


# -- 11. malformed plans end within the caps -----------------------------------------------------
def test_fifty_subquestions_are_capped(store):
    many = {"subquestions": [subq(f"q{i}", f"What is the capital of country {i}?") for i in range(1, 51)]}
    plan = planner([many, {"answer": "Paris"}])
    work = answering_worker()
    out = mujica.graph.invoke({"question": "Capitals?"}, context=ctx(store, plan, work))
    assert len(out["dag"]) == len(out["results"]) == len(work.calls) == 12
    assert [n for n in out["notes"] if "cap" in n] == [f"InvalidPlan: sub-question cap 12 reached; dropped q{i}"
                                                      for i in range(13, 51)]
    report = plan.calls[1][-1].text  # twelve answers (in the report and the progress), within the budget
    assert report.count(" -> unknown (not in the worker's contexts)") == 24
    assert sum(len(m.text) for m in plan.calls[1]) <= mujica.MujicaContext().planner_budget
    kept = json.loads(plan.calls[1][2].text.split("</think>")[-1])  # its turn as kept: the 12 that ran
    assert [q["id"] for q in kept["subquestions"]] == [f"q{i}" for i in range(1, 13)]
    assert report.endswith("Turn 2 of 7. First reason briefly inside <think>...</think>, then give the JSON.")
    assert out["answer"] == "Paris" and out["error"] is None and out["rounds"] == 2


def test_subquestions_with_empty_text_are_dropped_or_end_in_a_typed_error(store):
    some = {"subquestions": [subq("q1", ""), {"id": "q2", "question": None},
                             subq("q3", "What is the capital of Italy?")]}
    out = mujica.graph.invoke({"question": "Capital of Italy?"},
                              context=ctx(store, planner([some, {"answer": "Rome"}]), answering_worker()))
    assert list(out["results"]) == ["q3"] and out["answer"] == "Rome"
    assert [n for n in out["notes"]] == [
        "InvalidPlan: sub-question 1 has no question text or a malformed depends_on",
        "InvalidPlan: sub-question 2 has no question text or a malformed depends_on"]
    empty = {"subquestions": [subq("q1", "  "), subq("q2", "")]}
    plan = planner([empty] * 7, final='{"answer": "Rome"}')
    out = mujica.graph.invoke({"question": "What is the capital of Italy?"},
                              context=ctx(store, plan, answering_worker(), max_rounds=3))
    assert out["notes"][0] == "MalformedOutput: no usable sub-questions and no answer" and out["answer"] == "Rome"
    assert out["rounds"] <= 3 and len(plan.calls) <= 3 * 2


def test_an_empty_list_of_subquestions_asks_the_planner_for_its_final_answer(store):
    """The real planner (PQ-2H) wrote {"subquestions": []} once the workers had answered; a repair message
    then got {"answer": "unknown"}. It now gets the final-answer turn, with the answers in front of it."""
    plan = planner([{"subquestions": [subq("q1", "What is the capital of France?")]}, {"subquestions": []}],
                   final='{"answer": "Paris"}')
    out = mujica.graph.invoke({"question": "What is the capital of France?"},
                              context=ctx(store, plan, answering_worker()))
    assert out["answer"] == "Paris" and out["error"] is None and out["rounds"] == 3
    assert out["notes"] == ["NoProgress: round 2 planned nothing that can run"]
    assert plan.calls[2][-1].text.startswith("Sub-questions so far:\nq1: What is the capital of France? -> Paris")
    assert mujica.P.NO_MORE in plan.calls[2][-1].text
    first = planner([{"subquestions": []}, {"answer": "Paris"}])  # before any worker: the question goes to one
    out = mujica.graph.invoke({"question": "What is the capital of France?"},
                              context=ctx(store, first, answering_worker()))
    assert out["answer"] == "Paris" and list(out["results"]) == ["q1"]


def test_a_round_that_only_repeats_is_sent_back_with_why_before_the_planner_must_answer(store):
    asked = {"subquestions": [subq("q1", "What is the capital of France?")]}
    again = {"subquestions": [subq("q2", "What is the capital of France?")]}
    new = {"subquestions": [subq("q2", "What is the capital of Italy?")]}
    replies = iter([asked, again, new, {"answer": "Paris and Rome"}])
    plan = FakeChatModel(respond=lambda messages: json.dumps(next(replies)))
    out = mujica.graph.invoke({"question": "What is the capital of France and of Italy?"},
                              context=ctx(store, plan, answering_worker(), replan_retries=1))
    assert out["answer"] == "Paris and Rome" and list(out["results"]) == ["q1", "q2"]
    assert out["notes"] == ["Replan: round 2 planned nothing that can run (q2 asks again what q1 answered; dropped); "
                            "sent back"]
    repair = plan.calls[2][-1]
    assert kind_of(repair) == "send_back" and "nothing in it can run: q2 asks again what q1 answered" in repair.text
    replies = iter([asked, again, again])  # sent back once, then the old way: the final answer is asked for
    plan = FakeChatModel(respond=lambda messages: json.dumps(next(replies, {"answer": "Paris"})))
    out = mujica.graph.invoke({"question": "What is the capital of France?"},
                              context=ctx(store, plan, answering_worker(), replan_retries=1))
    assert out["answer"] == "Paris" and out["notes"][-1] == "NoProgress: round 2 planned nothing that can run"
    assert mujica.P.NO_MORE in plan.calls[-1][-1].text and len(plan.calls) == 4


def test_a_round_that_plans_nothing_new_is_answered_with_a_new_turn_before_the_planner_must_answer(store):
    """`send_back_rounds`: the planner sees what it asked again beside the answers, and may conclude or ask."""
    asked = {"subquestions": [subq("q1", "What is the capital of France?")]}
    again = {"subquestions": [subq("q2", "What is the capital of France?")]}
    replies = iter([asked, again, {"answer": "Paris"}])
    plan = FakeChatModel(respond=lambda messages: json.dumps(next(replies)))
    context = ctx(store, plan, answering_worker(), send_back_rounds=1)
    recorder = TraceRecorder("mujica", context)
    out = mujica.graph.invoke({"question": "What is the capital of France?"}, context=context,
                              config={"callbacks": [recorder]})
    assert out["answer"] == "Paris" and out["rounds"] == 3 and len(plan.calls) == 3
    assert out["notes"] == ["InvalidPlan: q2 asks again what q1 answered; dropped",
                            "SentBack: round 2 planned nothing that can run; answered with a new turn"]
    turn3 = plan.calls[2][-1]
    assert kind_of(turn3) is None and mujica.P.NO_MORE not in turn3.text  # a turn of its own, not an order to answer
    assert "q1: What is the capital of France? -> Paris" in turn3.text
    assert "Your last turn asked nothing that can run: q2 asks again what q1 answered. If the answers" in turn3.text
    assert health({}, recorder.trace(out))["forced"] == 0
    # an empty plan is told so; a second round without progress is forced to answer, as without the setting
    replies = iter([asked, {"subquestions": []}, {"subquestions": []}])
    plan = FakeChatModel(respond=lambda messages: json.dumps(next(replies, {"answer": "Paris"})))
    out = mujica.graph.invoke({"question": "What is the capital of France?"},
                              context=ctx(store, plan, answering_worker(), send_back_rounds=1))
    assert f"asked nothing that can run: {mujica.P.NOTHING_NEW}." in plan.calls[2][-1].text
    assert out["notes"][-1] == "NoProgress: round 3 planned nothing that can run"
    assert mujica.P.NO_MORE in plan.calls[3][-1].text and out["answer"] == "Paris"
    # off (the default): the round after no progress must answer
    replies = iter([asked, again])
    plan = FakeChatModel(respond=lambda messages: json.dumps(next(replies, {"answer": "Paris"})))
    mujica.graph.invoke({"question": "What is the capital of France?"}, context=ctx(store, plan, answering_worker()))
    assert len(plan.calls) == 3 and mujica.P.NO_MORE in plan.calls[2][-1].text


TINTED = 'The band who released the debut album "Tinted Windows" had their first performance in what city?'


def test_question_names_are_its_topic_entities_else_its_quoted_titles_and_capitalised_words():
    from mhqa_graph.graphs.mujica.guard_rules import question_names
    assert question_names(TINTED) == ["Tinted Windows"]
    assert question_names("Which film came out first, Vertigo or Jaws?") == ["Vertigo", "Jaws"]
    assert question_names("what sex is svante nilsson 's child ?", ["svante nilsson"]) == ["svante nilsson"]
    assert question_names("what sex is svante nilsson 's child ?") == []


def test_a_first_subquestion_that_names_nothing_the_question_names_is_sent_back_once_a_round(store):
    """`plan_unanchored`: the demo's planner asked about a band it made up (real qwen2.5-coder-1.5b output)."""
    beatles = {"subquestions": [subq("q1", "What is the name of The Beatles?"),
                                subq("q2", "In what city did #q1 first perform?", "q1")]}
    anchored = {"subquestions": [subq("q1", 'Which band released the album "Tinted Windows"?')]}
    replies = iter([beatles, anchored, {"answer": "Tulsa"}])
    plan = FakeChatModel(respond=lambda messages: json.dumps(next(replies)))
    out = mujica.graph.invoke({"question": TINTED},
                              context=ctx(store, plan, answering_worker(), guards="+plan_unanchored"))
    back = plan.calls[1][-1]
    assert kind_of(back) == "send_back"
    assert ('q1 uses no earlier answer and names nothing the question names. Start from what the question names: '
            'write a first sub-question that contains "Tinted Windows", word for word') in back.text
    assert [q["question"] for q in out["dag"]] == ['Which band released the album "Tinted Windows"?']
    assert [(f["guard"], f["before"], f["after"]) for f in out["guards"]] == [
        ("plan_unanchored", "q1: What is the name of The Beatles?", "sent back")]
    assert out["answer"] == "Tulsa"
    # a reply that is still unanchored is kept: the guard sends back, it never rewrites the plan
    replies = iter([beatles, beatles, {"answer": "Liverpool"}])
    plan = FakeChatModel(respond=lambda messages: json.dumps(next(replies)))
    out = mujica.graph.invoke({"question": TINTED},
                              context=ctx(store, plan, answering_worker(), guards="+plan_unanchored"))
    assert out["dag"][0]["question"] == "What is the name of The Beatles?" and len(plan.calls) == 3
    # a later hop that writes an earlier answer out instead of citing it is anchored by that answer
    later = {"subquestions": [subq("q2", "Where was Christopher Nolan born?")]}
    replies = iter([{"subquestions": [subq("q1", 'Who directed the album "Tinted Windows"?')]}, later,
                    {"answer": "London"}])
    plan = FakeChatModel(respond=lambda messages: json.dumps(next(replies)))
    work = worker_saying({"Tinted Windows": '{"relevant": [1], "answer": "Christopher Nolan"}'})
    out = mujica.graph.invoke({"question": TINTED}, context=ctx(store, plan, work, guards="+plan_unanchored"))
    assert out["guards"] == [] and out["answer"] == "London" and len(plan.calls) == 3
    # off by default
    replies = iter([beatles, {"answer": "Liverpool"}])
    plan = FakeChatModel(respond=lambda messages: json.dumps(next(replies)))
    out = mujica.graph.invoke({"question": TINTED}, context=ctx(store, plan, answering_worker()))
    assert len(plan.calls) == 2 and out["guards"] == []


DIRECTED = {"subquestions": [subq("q1", "Who directed Inception?"), subq("q2", "Where was #q1 born?", "q1")]}


def test_with_cite_answers_the_planner_sees_a_table_and_concludes_by_citing_a_subquestion(store):
    replies = iter([DIRECTED, {"answer": "#q3"}, {"answer": "#q2"}])
    plan = FakeChatModel(respond=lambda messages: json.dumps(next(replies)))
    chunks = list(mujica.graph.stream({"question": "Where was the director of Inception born?"}, stream_mode="values",
                                      context=ctx(store, plan, answering_worker(), cite_answers=True)))
    out = chunks[-1]
    assert out["answer"] == "London" and out["planner_log"][-1]["cited"] == "q2"
    system, prompt = plan.calls[1][0].text, plan.calls[1][-1].text
    assert system == mujica.P.planner_system("question", cite=True) and '{"answer": "#q2"}' in system
    assert mujica.P.TABLE_HEAD in prompt and "Worker answers:" not in prompt
    assert "| q2 | Where was Christopher Nolan born? | London | Christopher Nolan: Christopher Nolan is" in prompt
    repair = plan.calls[2][-1]
    assert "q3 has no answer to cite" in repair.text and kind_of(repair) == "repair"
    # off (the default): "#q2" is an answer like any other
    replies = iter([DIRECTED, {"answer": "#q2"}])
    plan = FakeChatModel(respond=lambda messages: json.dumps(next(replies)))
    out = mujica.graph.invoke({"question": "Where was the director of Inception born?"},
                              context=ctx(store, plan, answering_worker()))
    assert out["answer"] == "#q2" and mujica.P.TABLE_HEAD not in plan.calls[1][-1].text


def test_a_conclusion_that_repeats_the_answer_a_later_subquestion_builds_on_is_sent_back_once(store):
    """`conclusion_bridge`: "Christopher Nolan" is q1's answer, which q2 builds on."""
    for replies, answer in (([DIRECTED, {"answer": "Christopher Nolan"}, {"answer": "London"}], "London"),
                            ([DIRECTED, {"answer": "Christopher Nolan"}, {"answer": "christopher nolan"}],
                             "christopher nolan")):
        it = iter(replies)
        plan = FakeChatModel(respond=lambda messages, it=it: json.dumps(next(it)))
        out = mujica.graph.invoke({"question": "Where was the director of Inception born?"},
                                  context=ctx(store, plan, answering_worker(), guards="+conclusion_bridge"))
        assert out["answer"] == answer and len(plan.calls) == 3
        back = plan.calls[2][-1]
        assert kind_of(back) == "send_back"
        assert "'Christopher Nolan' is the answer of q1, which q2 builds on" in back.text
        assert back.text.count(mujica.P.ANSWER_OR_ASK) == 1
        assert [(f["guard"], f["before"]) for f in out["guards"]] == [("conclusion_bridge", "Christopher Nolan")]


def test_the_new_send_backs_ask_only_for_the_answer_in_the_final_round_and_use_no_retry(store):
    """In the round that must answer, a send-back does not invite a plan the round would refuse; a send-back is not
    a failed attempt, so a reply that cannot be read after it still gets the repair it would have had."""
    replies = iter([DIRECTED, {"answer": "Christopher Nolan"}, "garbage", {"answer": "London"}])
    plan = FakeChatModel(respond=lambda messages: (r if isinstance(r := next(replies), str) else json.dumps(r)))
    out = mujica.graph.invoke({"question": "Where was the director of Inception born?"},
                              context=ctx(store, plan, answering_worker(), max_rounds=2, parse_retries=1,
                                          guards="+conclusion_bridge"))
    assert out["answer"] == "London" and out["error"] is None and len(plan.calls) == 4
    back = plan.calls[2][-1]
    assert back.text.endswith(f"{mujica.P.ANSWER_NOW}). Reply again with valid JSON only, in the format asked for.")
    assert kind_of(plan.calls[3][-1]) == "repair"
    # log mode records the firing and changes nothing: the same calls as with the guard off
    for guards, fired in (("+conclusion_bridge", True), ("auto", False)):
        replies = iter([DIRECTED, {"answer": "Christopher Nolan"}])
        plan = FakeChatModel(respond=lambda messages, replies=replies: json.dumps(next(replies)))
        out = mujica.graph.invoke({"question": "Where was the director of Inception born?"},
                                  context=ctx(store, plan, answering_worker(), guards=guards, guard_mode="log"))
        assert out["answer"] == "Christopher Nolan" and len(plan.calls) == 2
        assert [f["enforced"] for f in out["guards"]] == ([False] if fired else [])


def test_a_send_back_that_hides_the_reply_uses_no_retry_and_is_capped():
    from langchain_core.messages import HumanMessage
    from mhqa_graph.graphs.calls import MAX_HIDDEN, SentBack, ask_repaired

    def read(text):
        if text.startswith("again"):
            raise SentBack("no", hide_reply=True)
        return text

    model = FakeChatModel(responses=["again"] * 2 + ["fine"])
    parsed = ask_repaired(model, [HumanMessage("q")], read, retries=0)
    assert parsed.value == "fine" and len(model.calls) == 3
    assert all(m.type == "human" for m in model.calls[2])  # the rejected replies are not shown
    model = FakeChatModel(responses=["again"] * 10)
    parsed = ask_repaired(model, [HumanMessage("q")], read, retries=1)
    assert parsed.error == "MalformedOutput: no" and len(model.calls) == MAX_HIDDEN + 2


def test_a_citation_is_read_whatever_its_marks_and_one_of_no_subquestion_is_repaired():
    ids = ["q1", "q2", "a"]
    assert [mujica.cited(a, ids) for a in ("#q2", "[q2]", "q2", "#Q2.", "# q2", "[ q1 ]", "a")] == \
        ["q2", "q2", "q2", "q2", "q2", "q1", "a"]
    assert [mujica.cited(a, ids) for a in ("#q9", "London", "q9", "Q2 Arena")] == ["q9", None, None, None]


def test_a_conclusion_that_is_no_workers_answer_is_sent_back_once(store):
    """`conclusion_ungrounded`: the demo's planner concluded a city its worker never answered (real
    qwen2.5-coder-1.5b output); yes or no, an option of the question and a worker's answer in other words pass."""
    first = {"subquestions": [subq("q1", "Who directed Inception?")]}
    for replies, answer, calls in (([first, {"answer": "New York City"}, {"answer": "Nolan"}], "Nolan", 3),
                                   ([first, {"answer": "New York City"}, {"answer": "Paris"}], "Paris", 3),
                                   ([first, {"answer": "Nolan"}], "Nolan", 2)):
        it = iter(replies)
        plan = FakeChatModel(respond=lambda messages, it=it: json.dumps(next(it)))
        out = mujica.graph.invoke({"question": "Where was the director of Inception born?"},
                                  context=ctx(store, plan, answering_worker(), guards="+conclusion_ungrounded"))
        assert out["answer"] == answer and len(plan.calls) == calls
        if calls == 3:  # sent back once; the reply after it stands, found or not
            back = plan.calls[2][-1]
            assert kind_of(back) == "send_back"
            assert "'New York City' is none of the workers' answers (q1: Christopher Nolan)" in back.text
            assert [(f["guard"], f["before"]) for f in out["guards"]] == [("conclusion_ungrounded", "New York City")]
    from mhqa_graph.graphs.mujica.guard_rules import ungrounded
    on = make_context("mujica", llm="fake", corpus="docs", guards="+conclusion_ungrounded")
    assert not ungrounded(on, "Is Paris in France?", "yes", ["Paris"], [])
    assert not ungrounded(on, "Which came first, Vertigo or Jaws?", "Vertigo", ["1958", "1975"], [])
    assert ungrounded(on, "Where was he born?", "Tulsa", ["Tinted Windows"], [])
    assert not ungrounded(on, "Where was he born?", "Tulsa", [], [])  # nothing found yet: nothing to hold it to
    assert not ungrounded(on, "Where was he born?", "unknown (not in the worker's contexts)", ["Tinted Windows"], [])


def test_without_recall_thoughts_the_planner_sees_what_its_turns_did_but_not_their_reasoning(store):
    chain = {"subquestions": [subq("q1", "Who directed Inception?"), subq("q2", "Where was #q1 born?", "q1")]}
    for recall in (True, False):
        replies = iter(["<think>Nolan, surely.</think>" + json.dumps(chain), json.dumps({"answer": "London"})])
        plan = FakeChatModel(respond=lambda messages, replies=replies: next(replies))
        out = mujica.graph.invoke({"question": "Where was the director of Inception born?"},
                                  context=ctx(store, plan, answering_worker(), recall_thoughts=recall))
        turn = plan.calls[1][2]
        assert turn.type == "ai" and ("Nolan, surely." in turn.text) is recall and '"subquestions"' in turn.text
        assert out["answer"] == "London"


def test_endless_re_asks_end_within_the_round_and_subquestion_caps(store):
    phrasings = iter(f"Who made Inception, version {i}?" for i in range(100))

    def respond(messages):
        return json.dumps({"subquestions": [subq("q1", next(phrasings)), subq("q2", "Where was #q1 born?", "q1")]}) \
            if turn(messages) else '{"answer": "unknown"}'
    work = FakeChatModel(responses=['{"relevant": [], "answer": ""}'])
    out = mujica.graph.invoke({"question": "Where was the maker of Inception born?"},
                              context=ctx(store, FakeChatModel(respond=respond), work, max_rounds=5,
                                          max_subquestions=4))
    assert out["rounds"] == 5 and len(work.calls) == 3  # q1 asked 3 times, q2 written once: 4 asks
    assert out["results"]["q1"]["attempt"] == 3 and len(out["results"]["q1"]["earlier"]) == 2
    assert "InvalidPlan: sub-question cap 4 reached; dropped q1" in out["notes"]
    assert out["notes"][-1] == "NoProgress: round 4 planned nothing that can run" and out["answer"] == "unknown"


def test_build_returns_a_compiled_graph_with_its_recursion_limit():
    graph = mujica.build()
    assert isinstance(graph, CompiledStateGraph) and graph.config["recursion_limit"] == mujica.RECURSION_LIMIT


def test_sub_questions_off_the_topic_are_dropped():
    """The prompt's example copied into a plan (real qwen2.5-coder-1.5b output on HotpotQA dev_a row 0)."""
    question = 'The band who released the debut album "Tinted Windows" had their first performance in what city?'
    items = [{"id": "q1", "question": "Who directed Inception?", "depends_on": []},
             {"id": "q2", "question": "Where was #q1 born?", "depends_on": ["q1"]},
             {"id": "q3", "question": "Which band released the album Tinted Windows?", "depends_on": []},
             {"id": "q4", "question": "In what city did #q3 first perform?", "depends_on": ["q3"]}]
    on = make_context("mujica", llm="fake", corpus="docs", guards="+plan_off_topic")  # off by default: it did not pay
    new, notes = repair_plan(items, [], cap=12, rnd=1, about=question, ctx=on)
    assert [q["id"] for q in new] == ["q3", "q4"]
    assert notes == ["InvalidPlan: q1 is off the question's topic; dropped 'Who directed Inception?'",
                     "InvalidPlan: q2 is off the question's topic; dropped 'Where was #q1 born?'"]
    # an earlier answer is on the topic; without `about` nothing is checked
    later = [{"id": "q5", "question": "Where was Chris Taylor born?", "depends_on": []}]
    done = {"q3": {"status": "answered", "answer": "Chris Taylor", "attempt": 1}}
    assert [q["id"] for q in repair_plan(later, new, 12, 2, done, about=question, ctx=on)[0]] == ["q5"]
    assert [q["id"] for q in repair_plan(items, [], cap=12, rnd=1)[0]] == ["q1", "q2", "q3", "q4"]


# -- ask_as="relation" ----------------------------------------------------------------------------
def test_a_relation_subquestion_asks_the_worker_its_relation_of_its_entity_with_earlier_answers_filled_in(store):
    plan = {"subquestions": [{"id": "q1", "entity": "Inception", "relation": "director who directed Inception"},
                             {"id": "q2", "entity": "#q1", "relation": "place where Nolan born"}]}
    work, plan_llm = answering_worker(), planner([plan, {"answer": "London"}])
    out = mujica.graph.invoke({"question": "Where was the director of Inception born?",
                               "topic_entities": ["Inception"]},
                              context=ctx(store, plan_llm, work, ask_as="relation"))
    asked = [question_of(c) for c in work.calls]
    assert asked == ["What is the director who directed Inception of Inception?",
                     "What is the place where Nolan born of Christopher Nolan?"]
    assert out["answer"] == "London" and [q["depends_on"] for q in out["dag"]] == [[], ["q1"]]
    assert [(q["entity"], q["relation"]) for q in out["dag"]] == [("Inception", "director who directed Inception"),
                                                                  ("#q1", "place where Nolan born")]
    first, second = plan_llm.calls
    assert first[0].text == mujica.P.RELATION_PLANNER_SYSTEM
    assert json.loads(second[2].text) == plan  # its own turn, in the form it wrote it


def test_a_relation_subquestions_entity_is_a_topic_entity_or_an_earlier_answer_in_the_reply_format():
    fmt = mujica.P.planner_format(False, True, False, 3, ["Inception", "Inception"], ask_as="relation")
    item = fmt.schema["anyOf"][0]["properties"]["subquestions"]["items"]
    assert item["properties"]["entity"]["enum"] == ["Inception", "#q1", "#q2", "#q3"]
    assert item["required"] == ["id", "entity", "relation"]
    free = mujica.P.planner_format(False, True, False, 3, None, ask_as="relation")
    assert "enum" not in free.schema["anyOf"][0]["properties"]["subquestions"]["items"]["properties"]["entity"]
    assert 'relation' in fmt.gbnf() and "Vertigo" in mujica.P.RELATION_PLANNER_SYSTEM
