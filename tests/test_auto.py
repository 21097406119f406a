"""`auto`: rag first, a design when rag's answer is not supported; its decisions, budget and failures."""

import dataclasses
import json

import pytest
from mhqa_graph.graphs import SPECS, build_graph, make_context
from mhqa_graph.graphs import auto as A

from mhqa_graph.errors import InvalidInput
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.traces import TraceRecorder
from mhqa_graph.types import Passage

QUESTION = "Where was the director of Inception born?"
PLAN = json.dumps({"subgoals": ["Who directed Inception?", "Where was [Answer1] born?"]})


def said(answer: str) -> str:
    return json.dumps({"reasoning": "the passage says so", "sufficient": True, "answer": answer})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('auto')}/s?embedder=hash")
    s.add_passages("wiki", [Passage("p1", "Inception", "Inception is a 2010 film directed by Christopher Nolan."),
                            Passage("p2", "Christopher Nolan", "Christopher Nolan was born in London.")])
    s.add_triples("kg", [("Inception", "directed by", "Christopher Nolan"),
                         ("Christopher Nolan", "born in", "London")])
    yield s
    s.close()


def roles(first: str, *, plan=(PLAN,), analysis=(said("Christopher Nolan"), said("London")), final="London") -> dict:
    return {"answer": FakeChatModel(responses=[f"<think>...</think><answer>{first}</answer>", final], cycle=False),
            "plan": FakeChatModel(responses=list(plan)), "analysis": FakeChatModel(responses=list(analysis)),
            "rewrite": FakeChatModel(responses=['{"query": "x"}'])}


def run(store, models, question=QUESTION, recorder=None, **settings):
    settings = {"corpus": "wiki", **settings}
    ctx = make_context("auto", llm=FakeChatModel(responses=["unused"]), role_llms=models, store=store, **settings)
    config = {"callbacks": [recorder]} if recorder else None
    return build_graph("auto").invoke({"question": question}, config, context=ctx)


def test_registered_like_the_other_agents():
    assert "auto" in SPECS and set(SPECS["auto"].roles) == {r for a in ("rag", *A.DESIGNS) for r in SPECS[a].roles}
    langgraph = json.load(open("langgraph.json"))
    assert langgraph["graphs"]["auto"]["path"] == "mhqa_graph.graphs.auto.graph:graph"


def test_a_supported_answer_stops_after_one_call(store):
    models = roles("London")
    out = run(store, models)
    assert out["answer"] == "London" and out["answered_by"] == "rag"
    assert out["decisions"] == [{"stage": "rag", "action": "stop", "code": "found_in_evidence",
                                 "reason": "found in its evidence", "answer": "London"}]
    assert len(models["answer"].calls) == 1 and not models["plan"].calls


@pytest.mark.parametrize("first, reason", [("Paris", "not in its evidence"), ("unknown", "a refusal")])
def test_an_unsupported_answer_escalates_to_opera_on_a_corpus(store, first, reason):
    models = roles(first)
    recorder = TraceRecorder("auto", None)
    out = run(store, models, recorder=recorder)
    assert out["answer"] == "London" and out["answered_by"] == "opera"
    assert [(d["stage"], d["action"], d["reason"]) for d in out["decisions"]] == [
        ("rag", "escalate", reason), ("opera", "answer", "differs from rag")]
    assert [s["stage"] for s in out["stages"]] == ["rag", "opera"]
    trace = recorder.trace(out)
    assert trace.design["answered_by"] == "opera"
    assert {c.role for c in trace.llm_calls} == {"answer", "plan", "analysis"}  # every stage's calls are traced
    assert [s.kind for s in trace.steps][:1] == ["retrieve"] and any(s.kind == "attempt" for s in trace.steps)


@pytest.mark.parametrize("question, answer, action", [
    (QUESTION, "Christopher Nolan", "escalate"),  # the bridge: shown, one fact from Inception
    (QUESTION, "London", "escalate"),  # shown too (London matches), but a graph answer is the walk's to confirm
    ("Was Inception directed by Christopher Nolan or by Hans Zimmer?", "Christopher Nolan", "stop"),  # an option
    ("Was Inception directed by Christopher Nolan?", "yes", "stop"),
    (QUESTION, "Paris", "escalate")])  # in no fact shown
def test_on_a_graph_only_an_answer_the_question_names_stops(store, question, answer, action):
    models = roles(answer)
    out = run(store, models, question=question, corpus=None, graph="kg", escalate_to="opera")
    assert out["decisions"][0]["action"] == action
    if action == "escalate" and answer != "Paris":
        assert out["decisions"][0]["reason"] == "a graph answer the question does not name"


@pytest.mark.parametrize("final, reason", [("London", "agrees with rag"), ("London, England", "agrees with rag"),
                                           ("Paris", "differs from rag")])
def test_the_design_agreeing_with_rag_is_marked_as_same_answer_judges(store, final, reason):
    out = run(store, roles("London", final=final), corpus=None, graph="kg", escalate_to="opera")
    assert out["answer"] == final and out["decisions"][-1]["reason"] == reason


@pytest.mark.parametrize("question, answer, form_check, action", [
    ("Who directed Inception, Christopher Nolan or London?", "Inception", False, "stop"),  # in its evidence
    ("Who directed Inception, Christopher Nolan or London?", "Inception", True, "escalate"),  # neither option
    ("Who directed Inception, Christopher Nolan or London?", "Nolan", True, "stop"),  # within one
    ("Was Inception directed by Christopher Nolan?", "Christopher Nolan", True, "escalate"),  # not yes or no
    ("Was Inception directed by Christopher Nolan?", "yes", True, "stop"),
    (QUESTION, "London", True, "stop")])  # any form
def test_with_form_check_an_answer_not_of_the_asked_form_escalates(store, question, answer, form_check, action):
    out = run(store, roles(answer), question=question, form_check=form_check)
    assert out["decisions"][0]["action"] == action
    if action == "escalate":
        assert out["decisions"][0]["reason"] == "not of the form the question asks"


@pytest.mark.parametrize("logprob, min_confidence, action, confidence", [
    (-0.1, 0.5, "stop", 0.9048),  # e^-0.1 = 0.90: sure enough
    (-1.0, 0.5, "escalate", 0.3679),  # e^-1 = 0.37: unsure
    (-1.0, 0.0, "stop", None),  # the rule is off, and rag is not asked for log-probabilities
    (None, 0.5, "stop", None),  # a backend without log-probabilities: the rule does not apply
    (-1.0, "default", "escalate", 0.3679)])  # on by default
def test_with_min_confidence_an_unsure_answer_escalates(store, logprob, min_confidence, action, confidence):
    models = roles("London")
    models["answer"].logprob = logprob
    out = run(store, models, **({} if min_confidence == "default" else {"min_confidence": min_confidence}))
    first = out["decisions"][0]
    assert first["action"] == action and first.get("confidence") == confidence
    assert first["reason"] == ("the model is unsure of it" if action == "escalate" else "found in its evidence")
    assert out["stages"][0].get("confidence") == confidence


@pytest.mark.parametrize("logprob, action, reason", [
    (-0.05, "stop", "a graph answer the model is sure of"),  # e^-0.05 = 0.95 >= 0.9
    (-0.5, "escalate", "a graph answer the question does not name")])  # 0.61: the walk's to find
def test_with_trust_confidence_a_graph_answer_the_model_is_sure_of_stops(store, logprob, reason, action):
    models = roles("London")  # in the facts shown, not named by the question
    models["answer"].logprob = logprob
    out = run(store, models, corpus=None, graph="kg", escalate_to="opera", trust_confidence=0.9)
    assert (out["decisions"][0]["action"], out["decisions"][0]["reason"]) == (action, reason)
    paris = roles("Paris")  # in no fact shown: sure or not, it escalates
    paris["answer"].logprob = -0.01
    out = run(store, paris, corpus=None, graph="kg", escalate_to="opera", trust_confidence=0.9)
    assert out["decisions"][0]["reason"] == "not in its evidence"


def test_min_confidence_is_a_probability():
    with pytest.raises(InvalidInput, match="min_confidence must be a number from 0 to 1, got 1.5"):
        make_context("auto", llm="fake", corpus="wiki", min_confidence=1.5)
    with pytest.raises(InvalidInput, match="trust_confidence must be a number from 0 to 1, got -0.1"):
        make_context("auto", llm="fake", graph="kg", trust_confidence=-0.1)
    with pytest.raises(InvalidInput, match="min_confidence is a probability"):  # a context made without make_context
        build_graph("auto").invoke({"question": QUESTION}, context={"llm": "fake", "corpus": "wiki",
                                                                    "min_confidence": 1.5})


def looks(first: str, second: str) -> dict:
    """Models whose rag answers `first`, then `second` when asked again (the second look)."""
    models = roles(first)
    models["answer"] = FakeChatModel(responses=[f"<answer>{first}</answer>", f"<answer>{second}</answer>",
                                                "London"], cycle=False)
    return models


@pytest.mark.parametrize("second, action, reason, answered_by", [
    ("Christopher Nolan", "stop", "the two answers agree", "rag"),
    ("Nolan", "stop", "the two answers agree", "rag"),  # within the first
    ("London", "escalate", "the two answers differ", "opera")])
def test_the_second_look_stops_when_the_two_answers_agree(store, second, action, reason, answered_by):
    """A supported answer ("Christopher Nolan" is in p1) is looked at again: rag searches for the question with the
    answer added, and agreement stops where a difference escalates."""
    models = looks("Christopher Nolan", second)
    out = run(store, models, second_look=True)
    assert [(d["stage"], d["action"]) for d in out["decisions"]][:2] == [("rag", "look again"), ("second_look", action)]
    assert out["decisions"][1]["reason"] == reason and out["answered_by"] == answered_by
    assert out["stages"][1]["query"] == f"{QUESTION} Christopher Nolan"
    assert [s["stage"] for s in out["stages"]] == ["rag", "second_look", *(["opera"] if action == "escalate" else [])]
    assert out["answer"] == ("Christopher Nolan" if action == "stop" else "London")
    asked = models["answer"].calls
    assert "Question: " + QUESTION in asked[1][-1].text  # the model is asked the question itself


def test_the_demo_shows_what_each_look_retrieved(store):
    from mhqa_graph.demo import steps
    from mhqa_graph.ingest.datasets import QAItem

    out = run(store, looks("Christopher Nolan", "Nolan"), second_look=True)
    lines = steps("auto", out, QAItem(id="q", question=QUESTION, answers=("London",)))
    assert [line.split(":")[0] for line in lines] == ["retrieved", "rag", "retrieved", "second_look"]


def test_the_second_look_searches_with_the_answer_added(store):
    """The second look's passages are those of the question with the first answer added: the bridge's page."""
    from mhqa_graph.graphs.baselines import rag_graph

    ctx = make_context("rag", llm=FakeChatModel(responses=["<answer>London</answer>"]), store=store, corpus="wiki",
                       top_k=1)
    found = [rag_graph.invoke({"question": q, **extra}, context=ctx)["retrieved"][0]["title"]
             for q, extra in ((QUESTION, {}), (QUESTION, {"query": "Christopher Nolan born London"}))]
    assert found[1] == "Christopher Nolan"


def test_no_second_look_after_an_unsupported_answer_or_on_a_graph(store):
    out = run(store, looks("Paris", "Paris"), second_look=True)
    assert [d["action"] for d in out["decisions"]][0] == "escalate" and len(out["decisions"]) == 2
    out = run(store, looks("Christopher Nolan", "x"), question="Was Inception directed by Christopher Nolan or by "
              "Hans Zimmer?", corpus=None, graph="kg", escalate_to="opera", second_look=True)
    assert [d["action"] for d in out["decisions"]] == ["stop"]


def test_the_design_is_chosen_by_the_store():
    assert A.design_for(make_context("auto", llm="fake", corpus="wiki")) == "opera"
    assert A.design_for(make_context("auto", llm="fake", graph="kg")) == "omne"
    assert A.design_for(make_context("auto", llm="fake", corpus="wiki", graph="kg")) == "omne"
    assert A.design_for(make_context("auto", llm="fake", corpus="wiki", escalate_to="mujica")) == "mujica"


def test_settings_that_cannot_run_are_refused_in_one_line():
    with pytest.raises(InvalidInput, match=r"budget 3 is below the 4 calls auto needs \(rag 1, opera 3\)"):
        make_context("auto", llm="fake", corpus="wiki", budget=3)
    with pytest.raises(InvalidInput, match="escalate_to=omne needs a graph"):
        make_context("auto", llm="fake", corpus="wiki", escalate_to="omne")
    with pytest.raises(InvalidInput, match="escalate_to must be"):
        make_context("auto", llm="fake", corpus="wiki", escalate_to="react")
    with pytest.raises(InvalidInput, match=r"budget 4 is below the 5 calls auto needs \(rag 1 twice, opera 3\)"):
        make_context("auto", llm="fake", corpus="wiki", budget=4, second_look=True)
    make_context("auto", llm="fake", graph="kg", budget=3)  # rag 1 + omne 2
    make_context("auto", llm="fake", corpus="wiki", budget=0)  # no cap


@pytest.mark.parametrize("hand_over", [True, False])
def test_omne_starts_from_the_entities_rag_matched(store, hand_over):
    """Handed over, Omne's first turn already holds the facts of the entity the question names: it answers in one
    turn. Without, it spends its first turn on the lookup."""
    walk = ['<tool_call>{"name": "node_info", "arguments": {"entity": "Inception"}}</tool_call>'] if not hand_over \
        else []
    walk += ['<tool_call>{"name": "node_info", "arguments": {"entity": "Christopher Nolan"}}</tool_call>',
             "<answer>London</answer>"]
    agent = FakeChatModel(responses=walk, cycle=False)
    models = roles("Christopher Nolan") | {"tool-agent": agent}
    out = run(store, models, corpus=None, graph="kg", hand_over=hand_over)
    omne = out["stages"][-1]
    assert out["answer"] == "London" and out["answered_by"] == "omne"
    assert omne["calls"] == len(walk) and len(agent.calls) == len(walk)
    assert [c["args"]["entity"] for c in omne["tool_calls"]] == ["Inception", "Christopher Nolan"]
    assert omne.get("start_from") == ([{"entity": "Inception", "graph": "kg"}] if hand_over else None)
    if hand_over:
        first_prompt = "\n".join(m.text for m in agent.calls[0])
        assert "(inception) -[directed by]-> (christopher nolan)" in first_prompt.lower()


def test_no_source_is_a_typed_error(store):
    with pytest.raises(InvalidInput, match="^auto searches the store: set corpus or graph"):
        make_context("auto", llm=FakeChatModel(responses=["<answer>x</answer>"]), store=store)
    ctx = A.AutoContext(llm=FakeChatModel(responses=["<answer>x</answer>"]), store=store)  # made without it
    with pytest.raises(InvalidInput, match="needs a corpus or a graph"):
        build_graph("auto").invoke({"question": QUESTION}, context=ctx)


def test_decisions_and_stages_start_afresh_with_each_run_on_a_thread(store):
    """A checkpointed thread (as every Studio run has) keeps auto's state: a second run on it shows its own
    decisions and stages, not the first run's too (issue 64, 4)."""
    from langgraph.checkpoint.memory import InMemorySaver

    graph = build_graph("auto", checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    for _ in range(2):
        ctx = make_context("auto", llm=FakeChatModel(responses=["unused"]), role_llms=roles("London"), store=store,
                           corpus="wiki")
        out = graph.invoke({"question": QUESTION}, config, context=ctx)
        assert [d["stage"] for d in out["decisions"]] == ["rag"] and len(out["stages"]) == 1


def test_a_design_that_raises_falls_back_to_the_first_answer(store, monkeypatch):
    class Broken:  # OPERA's graph, failing when run
        builder = build_graph("opera").builder

        def invoke(self, *args, **kwargs):
            raise RuntimeError("subgraph down")

    stages = A.state.STAGE_SPECS
    monkeypatch.setitem(stages, "opera", dataclasses.replace(stages["opera"], build=lambda checkpointer=None: Broken()))
    out = run(store, roles("Paris"))
    assert out["answer"] == "Paris" and out["answered_by"] == "rag"
    assert out["decisions"][-1] == {"stage": "opera", "action": "fallback", "code": "stage_failed",
                                    "reason": "RuntimeError: subgraph down", "answer": ""}


def test_the_budget_caps_the_design(store):
    """budget 4 leaves OPERA 3 calls; a plan of two sub-goals needs 4 (plan, two analyses, the answer)."""
    models = roles("Paris")
    out = run(store, models, budget=4)
    calls = sum(len(m.calls) for m in models.values())
    assert calls <= 4
    assert out["answered_by"] in ("rag", "opera")
    assert "budget" in json.dumps(out["decisions"] + out["stages"])


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
def test_a_spent_budget_prints_and_logs_nothing(store, how, capfd, caplog):
    """Raised from the CallCounter callback, BudgetExhausted was logged by LangChain ("Error in
    CallCounter.on_chat_model_start callback") for each question that ran out; it is checked before the call now."""
    import asyncio
    import logging

    caplog.set_level(logging.DEBUG)
    models = roles("Paris")
    ctx = make_context("auto", llm=FakeChatModel(responses=["unused"]), role_llms=models, store=store, corpus="wiki",
                       budget=4)
    graph, question = build_graph("auto"), {"question": QUESTION}
    out = graph.invoke(question, context=ctx) if how == "invoke" else asyncio.run(graph.ainvoke(question, context=ctx))
    assert out["decisions"][-1]["reason"].startswith("BudgetExhausted: auto's budget is spent")
    assert sum(len(m.calls) for m in models.values()) == 4
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert capfd.readouterr().err == ""


def test_a_dict_context_is_checked_at_the_first_node(store):
    with pytest.raises(InvalidInput, match="budget 2"):
        build_graph("auto").invoke({"question": QUESTION}, context={"llm": "fake", "corpus": "wiki", "budget": 2,
                                                                    "store": store})


def test_eval_records_and_report_count_the_decisions(tmp_path):
    """The eval record of each question carries auto's route; `mhqa report` counts stages and decisions."""
    from rich.console import Console

    from mhqa_graph.eval import compare, compare_table, run_eval

    rows = [("a1", "Which city did Alpha first perform in?", "Tulsa", "<answer>Tulsa</answer>"),
            ("a2", "Who founded Gamma Records?", "John Smith", "<answer>Paris</answer>")]
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps({
        "id": rid, "question": q, "answer": gold, "type": "bridge", "level": "easy",
        "supporting_facts": {"title": [f"Page {rid}"], "sent_id": [0]},
        "context": {"title": [f"Page {rid}"], "sentences": [[f"Page {rid} is about {gold}."]]}}) + "\n"
        for rid, q, gold, _ in rows), encoding="utf-8")

    def respond(messages):
        text = messages[-1].text
        return next((reply for _, q, _, reply in rows if q in text), '{"subgoals": ["x"]}')

    model = FakeChatModel(respond=respond)
    summary = run_eval("auto", "hotpotqa", data, None, f"embedded://{tmp_path}/s?embedder=hash", tmp_path / "run",
                       context_overrides={"llm": model}, progress=False)
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "run" / "results.jsonl").read_text().splitlines())}
    assert records["a1"]["route"]["answered_by"] == "rag" and records["a1"]["llm_calls"] == 1
    assert [d["action"] for d in records["a2"]["route"]["decisions"]][0] == "escalate"
    assert [s["stage"] for s in records["a2"]["route"]["stages"]] == ["rag", "opera"]
    assert summary.routes["decisions"]["rag stop: found in its evidence"] == 1
    assert summary.routes["decisions"]["rag escalate: not in its evidence"] == 1
    console = Console(width=200, record=True)
    console.print(compare_table(compare([tmp_path / "run", tmp_path / "run"])))
    shown = console.export_text()
    assert "rag stop: found in its evidence" in shown and "answered by rag" in shown
    assert "ΔF1 vs run [95% CI] (questions, clusters)" in shown


def test_the_cli_takes_a_budget_and_refuses_one_below_need(tmp_path):
    import subprocess
    import sys

    from mhqa_graph.types import Passage as P

    uri = f"embedded://{tmp_path}/s?embedder=hash"
    with open_store(uri) as s:
        s.add_passages("docs", [P("p1", "Inception", "Inception is a 2010 film directed by Christopher Nolan.")])

    def ask(*extra: str) -> subprocess.CompletedProcess:
        llm = 'fake:["<answer>Christopher Nolan</answer>"]'
        return subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "ask", "Who directed Inception?", "--agent",
                               "auto", "--corpus", "docs", "--store", uri, "--llm", llm, *extra],
                              capture_output=True, text=True, timeout=120)

    refused = ask("--budget", "2")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: InvalidInput: budget 2 is below the 4 calls auto needs (rag 1, opera 3); give at least 4, "
        "or 0 for no cap"]
    done = ask("--budget", "4")
    assert done.returncode == 0 and done.stdout.strip() == "Christopher Nolan"


def test_streaming_messages_needs_subgraphs(store):
    """auto's model calls are its subgraphs': `stream_mode="messages"` yields them with `subgraphs=True` only, as
    docs/guide.md says (issue 64, 4)."""
    graph = build_graph("auto")
    counts = []
    for subgraphs in (False, True):
        ctx = make_context("auto", llm=FakeChatModel(responses=["unused"]), role_llms=roles("London"), store=store,
                           corpus="wiki")
        counts.append(len(list(graph.stream({"question": QUESTION}, context=ctx, stream_mode="messages",
                                            subgraphs=subgraphs))))
    assert counts[0] == 0 and counts[1] >= 1


def test_the_stages_are_subgraphs_that_xray_and_streaming_show(store):
    """Each stage is a node running its agent's compiled graph: xray draws the designs' own nodes, and
    `stream(subgraphs=True)` yields the updates of rag's and OPERA's inner nodes under their stage's namespace."""
    graph = build_graph("auto")
    nodes = set(graph.get_graph(xray=True).nodes)
    assert {"start", "judge", "reconcile", "rag:retrieve", "rag:answer", "second_look:answer", "opera:plan",
            "opera:analyze", "mujica:planner", "mujica:worker", "omne:agent", "omne:tools"} <= nodes
    ctx = make_context("auto", llm=FakeChatModel(responses=["unused"]), role_llms=roles("Paris"), store=store,
                       corpus="wiki")
    seen = {(ns[0].split(":")[0] if ns else "", node) for ns, update in graph.stream(
        {"question": QUESTION}, context=ctx, subgraphs=True) for node in update}
    assert {("rag", "retrieve"), ("rag", "answer"), ("opera", "plan"), ("", "judge"), ("", "opera"),
            ("", "reconcile")} <= seen


def test_every_decision_carries_a_reason_code_beside_its_sentence(store):
    import typing

    codes = set(typing.get_args(A.Reason))
    assert set(A.REASONS) == codes - {"stage_failed"}  # a failed stage's sentence is its error
    out = run(store, roles("Paris"))
    assert [(d["code"], d["reason"]) for d in out["decisions"]] == [
        ("not_in_evidence", "not in its evidence"), ("differs_from_rag", "differs from rag")]
    assert A.reason_code({"reason": "agrees with rag"}) == "agrees_with_rag"  # a record written before codes
    assert A.reason_code({"code": "refusal", "reason": "a refusal"}) == "refusal"
    assert A.reason_code({"reason": "RoundCap: no answer within 7 rounds"}) is None


def test_stage_settings_reach_their_stage_only(store):
    """`stage_settings` gives one stage its own settings over auto's common ones: rag retrieves one passage here,
    while OPERA keeps the common top_k."""
    models = roles("Paris")
    out = run(store, models, top_k=2, stage_settings={"rag": {"top_k": 1}, "opera": {"max_rewrites": 0}})
    assert len(out["stages"][0]["retrieved"]) == 1
    assert out["answered_by"] == "opera" and not models["rewrite"].calls


@pytest.mark.parametrize("stage_settings, match", [
    ({"react": {}}, "stage_settings has no stage 'react'; auto's stages: rag, opera, mujica, omne"),
    ({"omne": {"max_round": 5}}, "unknown setting.*max_round.*did you mean 'max_rounds'"),
    ({"omne": {"max_rounds": 0}}, "max_rounds must be an integer from 1 to 100, got 0"),
    ({"rag": {"role_llms": {}}}, "give a stage's models in auto's role_llms"),
    ({"rag": 5}, r"stage_settings\['rag'\] must be a mapping")])
def test_stage_settings_are_checked_with_the_context(stage_settings, match):
    with pytest.raises(InvalidInput, match=match):
        make_context("auto", llm="fake", graph="kg", stage_settings=stage_settings)


def test_the_budget_is_one_limit_over_the_stages():
    """Each stage may make what the budget leaves after the calls made and the fewest the stages after it need;
    the same sum refuses a budget below need."""
    from mhqa_graph.graphs.auto.state import calls_left

    ctx = make_context("auto", llm="fake", corpus="wiki", budget=12, second_look=True)
    assert [calls_left(ctx, made, stage) for made, stage in ((0, "rag"), (1, "second_look"), (2, "opera"))] == [
        8, 8, 10]  # 12 - (1 + 3), 12 - 1 - 3, 12 - 2
    assert calls_left(make_context("auto", llm="fake", corpus="wiki", budget=0), 5, "opera") == 0  # no cap
    assert calls_left(make_context("auto", llm="fake", corpus="wiki", budget=4), 4, "opera") == 1  # at least one
