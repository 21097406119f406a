"""Worked plans (`mhqa ingest plans`, the `plan_examples` setting) and settings from the command line (`--set`)."""

import json
import subprocess
import sys

import pytest
from mhqa_graph.graphs import build_graph, make_context, parse_settings
from mhqa_graph.graphs.calls import check_sources

from mhqa_graph.errors import IngestError, InvalidInput, UnknownCorpus
from mhqa_graph.ingest.plans import plan_passage, read_plans_file, subgoals_of
from mhqa_graph.ingest.runner import ingest
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.types import Passage

ROW = {"_id": "t1", "question": "When was the director of film King Of The Sierras born?",
       "qa_pairs": [{"question": "Who is the director of the film King of the Sierras?",
                     "answer": "The director of the film King of the Sierras is Arthur Rosson"},
                    {"question": "When was Arthur Rosson born?", "answer": "Arthur Rosson was born on 24 August 1886"}]}


def test_a_chain_becomes_sub_goals_that_cite_earlier_answers():
    assert subgoals_of(ROW["question"], ROW["qa_pairs"]) == [
        "Who is the director of the film King of the Sierras?", "When was [Answer1] born?"]
    # a name the question itself holds is not an earlier answer: left as written
    compare = [{"question": "When was Jaws released?", "answer": "Jaws was released in 1975."},
               {"question": "When was Vertigo released?", "answer": "Vertigo was released in 1958."}]
    assert subgoals_of("Which came out first, Jaws or Vertigo?", compare) == [q["question"] for q in compare]


def test_rows_of_either_shape_and_bad_rows(tmp_path):
    assert plan_passage(ROW) == Passage("t1", ROW["question"], "Who is the director of the film King of the Sierras?"
                                        "\nWhen was [Answer1] born?")
    assert plan_passage({"question": "Q?", "subgoals": ["a", " b "]}).text == "a\nb"
    path = tmp_path / "plans.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (ROW, {"question": "no plan"}, {"subgoals": ["x"]})) + "\n")
    items = list(read_plans_file(path, yield_errors=True))
    assert isinstance(items[0], Passage) and all(isinstance(i, IngestError) for i in items[1:])
    assert "plans.jsonl:2" in str(items[1]) and "qa_pairs" in str(items[1])
    with pytest.raises(IngestError, match="plans.jsonl:2: malformed row: expected"):  # the first bad row, by default
        list(read_plans_file(path))


@pytest.fixture()
def store(tmp_path):
    s = open_store(f"embedded://{tmp_path}/s?embedder=hash")
    s.add_passages("wiki", [Passage("p1", "Inception", "Inception is a 2010 film directed by Christopher Nolan.")])
    ingest(s, corpus="plans", passages=[plan_passage(ROW), plan_passage(
        {"question": "Who is older, Jaws or Vertigo?", "subgoals": ["When was Jaws released?"]})])
    yield s
    s.close()


def test_the_plan_agent_sees_the_plans_of_questions_like_its_own(store):
    plan = FakeChatModel(responses=[json.dumps({"subgoals": ["Who directed Inception?", "When was [Answer1] born?"]})])
    models = {"plan": plan, "analysis": FakeChatModel(responses=[json.dumps({"sufficient": False, "answer": ""})]),
              "rewrite": FakeChatModel(responses=['{"query": "x"}']), "answer": FakeChatModel(responses=["x"])}
    question = "When was the director of Inception born?"
    for examples, shown in ((None, False), ("plans", True)):
        ctx = make_context("opera", llm="fake", role_llms=models, store=store, corpus="wiki", plan_examples=examples,
                           plan_example_k=1)
        build_graph("opera").invoke({"question": question}, context=ctx)
        prompt = plan.calls[-1][-1].text
        assert ("When was [Answer1] born?" in prompt and "King Of The Sierras" in prompt) is shown
        assert prompt.rstrip().endswith(f"Question: {question}\nJSON:")


def test_a_plans_corpus_the_store_lacks_is_refused(store):
    with pytest.raises(UnknownCorpus, match="nope"):
        check_sources(make_context("opera", llm="fake", store=store, corpus="wiki", plan_examples="nope"))


def test_settings_from_the_command_line_are_typed():
    assert parse_settings("auto", ["hand_over=false", "budget=5"]) == {"hand_over": False, "budget": 5}
    assert parse_settings("opera", ["plan_examples=plans", "think=on"]) == {"plan_examples": "plans", "think": True}
    assert parse_settings("mujica", ["ask_as=relation", "source=graph"]) == {"ask_as": "relation", "source": "graph"}
    with pytest.raises(InvalidInput, match="expected one of question, relation"):
        parse_settings("mujica", ["ask_as=relations"])
    with pytest.raises(InvalidInput, match="a tuple"):
        parse_settings("opera", ["topk_schedule=10,20"])
    for bad, message in ((["x"], "NAME=VALUE"), (["nope=1"], "no setting 'nope'"), (["budget=ab"], "expected int"),
                         (["hand_over=maybe"], "expected bool"), (["store=x"], "give --store"),
                         (["role_llms={}"], "a dict")):
        with pytest.raises(InvalidInput, match=message):
            parse_settings("auto", bad)


def test_the_cli_ingests_plans_and_refuses_a_bad_set(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps([ROW]))
    store = f"embedded://{tmp_path}/s?embedder=hash"
    mhqa = [sys.executable, "-m", "mhqa_graph.cli"]
    done = subprocess.run([*mhqa, "ingest", "plans", str(path), "--store", store], capture_output=True, text=True)
    assert done.returncode == 0 and "passages added: 1" in done.stdout, done.stderr
    bad = subprocess.run([*mhqa, "ask", "Who?", "--agent", "rag", "--llm", "fake:[\"x\"]", "--store", store,
                          "--corpus", "plans", "--set", "budgett=3"], capture_output=True, text=True)
    assert bad.returncode != 0 and "rag has no setting 'budgett'" in bad.stderr and "Traceback" not in bad.stderr


def test_mujicas_planner_sees_them_in_its_own_format(store):
    planner = FakeChatModel(responses=[json.dumps({"subquestions": [
        {"id": "q1", "question": "Who directed Inception?", "depends_on": []}]}), json.dumps({"answer": "x"})])
    worker = FakeChatModel(responses=[json.dumps({"relevant": [1], "answer": "Christopher Nolan"})])
    ctx = make_context("mujica", llm="fake", role_llms={"planner": planner, "worker": worker}, store=store,
                       corpus="wiki", plan_examples="plans", plan_example_k=1)
    build_graph("mujica").invoke({"question": "When was the director of Inception born?"}, context=ctx)
    first = planner.calls[0][-1].text
    assert '{"id": "q2", "question": "When was #q1 born?", "depends_on": ["q1"]}' in first
    assert "Question: When was the director of Inception born?" in first.split("Now plan this one.")[1]
