"""Mujica planner/worker agent: parallel fan-out, dependency order, plan repair, caps, parsing,
deterministic merge, KG workers, checkpoints, dict context, streaming."""

import asyncio
import json
import re
import time

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from mhqa_graph.graphs import mujica
from mhqa_graph.graphs.mujica import MujicaContext, merge_results, repair_plan

from mhqa_graph.errors import InvalidInput, InvalidQuestion
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel
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
    """The planner round a prompt is for; 0 for a forced final answer."""
    m = re.search(r"Turn (\d+) of", messages[1].text)
    return int(m.group(1)) if m else 0


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
    return re.search(r"Question: (.*)", messages[-1].text).group(1)


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
def test_dependent_subquestion_runs_next_round_with_the_answer_filled_in(store):
    chain = {"subquestions": [subq("q1", "Who directed Inception?"), subq("q2", "Where was #q1 born?", "q1")]}
    plan = planner([chain, chain, {"answer": "London"}])  # round 2 restates the plan: nothing new, q2 now runs
    work = answering_worker()
    out = mujica.graph.invoke({"question": "Where was the director of Inception born?"}, context=ctx(store, plan, work))
    assert [question_of(m) for m in work.calls] == ["Who directed Inception?", "Where was Christopher Nolan born?"]
    assert out["results"]["q2"]["query"] == "Where was Christopher Nolan born?"
    assert out["results"]["q2"]["answer"] == "London" and out["answer"] == "London"
    assert "q1: Who directed Inception? -> Christopher Nolan" in plan.calls[1][1].text
    assert "q2: Where was #q1 born? (after q1) -> (not answered yet)" in plan.calls[1][1].text
    assert [q["id"] for q in out["dag"]] == ["q1", "q2"] and out["dag"][1]["depends_on"] == ["q1"]
    assert out["notes"] == [] and out["rounds"] == 3


def test_cited_id_becomes_a_dependency_and_bracket_citations_are_filled(store):
    chain = {"subquestions": [subq("q1", "Who directed Inception?"), subq("q2", "Where was [q1] born?")]}
    plan = planner([chain, {"subquestions": []}, {"answer": "London"}])
    work = answering_worker()
    out = mujica.graph.invoke({"question": "Where was the director of Inception born?"}, context=ctx(store, plan, work))
    assert out["dag"][1]["depends_on"] == ["q1"]
    assert [question_of(m) for m in work.calls] == ["Who directed Inception?", "Where was Christopher Nolan born?"]


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
        return '{"subquestions": []}' if "not answered yet" in messages[1].text else '{"answer": "done"}'
    out = mujica.graph.invoke({"question": "Capitals?"}, context=ctx(store, FakeChatModel(respond=respond),
                                                                     answering_worker()))
    assert note in out["notes"]
    assert sorted(out["results"]) == answered
    assert out["answer"] == "done" and out["error"] is None


def test_longer_cycle_and_id_reused_in_a_later_round():
    dag = [{"id": "q1", "question": "A?", "depends_on": [], "round": 1}]
    items = [{"id": "q1", "question": "B about #q1?", "depends_on": []},  # reuses q1: renamed q2
             {"id": "a", "question": "C?", "depends_on": ["b"]}, {"id": "b", "question": "D?", "depends_on": ["c"]},
             {"id": "c", "question": "E?", "depends_on": ["a", "q1"]}]
    new, notes = repair_plan(items, dag, cap=12, rnd=2)
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
    endless = [{"subquestions": [subq(f"q{i}", "What is the capital of France?")]} for i in range(1, 10)]
    plan = planner(endless, final='{"answer": "Paris"}')
    out = mujica.graph.invoke({"question": "Capital of France?"}, context=ctx(store, plan, answering_worker(),
                                                                              max_rounds=3))
    assert out["rounds"] == 3 and len(plan.calls) == 3
    assert "No more sub-questions" in plan.calls[-1][1].text
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
    '{"subquestions": []}',
    '{"steps": ["find the capital"]}',
    '{"answer": ""}',
    '{"subquestions": [{"id": "q1"}, 3]}',
])
def test_malformed_planner_output_ends_with_a_forced_answer(store, reply):
    plan = planner([reply] * 7, final='{"answer": "Paris"}')
    out = mujica.graph.invoke({"question": "Capital of France?"}, context=ctx(store, plan, answering_worker()))
    assert out["answer"] == "Paris" and out["error"] is None
    assert any(n.startswith("MalformedOutput") for n in out["notes"])
    assert len(plan.calls) == 3 and out["rounds"] == 2 and out["results"] == {}


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
    assert "q2: What is the capital of Italy? -> (no answer found)" in plan.calls[2][1].text
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
    both = ctx(store, planner([{"subquestions": [subq("q1", "Who directed Inception?")]}, {"answer": "x"}]),
               answering_worker(), graph="kg", source="graph")
    assert mujica.graph.invoke({"question": "Q?"}, context=both)["results"]["q1"]["source"] == "graph"


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
    assert nodes == ["start", "planner", "worker", "worker", "worker", "planner"]
    assert sorted(next(iter(c["worker"]["results"])) for c in chunks if "worker" in c) == ["q1", "q2", "q3"]
    assert chunks[1]["planner"]["planner_log"][0]["action"] == "plan"
