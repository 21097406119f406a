"""Traces recorded through callbacks: every LLM call with its role, parallel workers, tool calls,
tokens, the design-specific plan and steps, JSON round trips, and traces rebuilt from plain states."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time

import pytest
from mhqa_graph.graphs import build_graph
from mhqa_graph.graphs.baselines import BaselineContext
from mhqa_graph.graphs.mujica import MujicaContext
from mhqa_graph.graphs.omne import OmneContext
from mhqa_graph.graphs.opera import OperaContext

from mhqa_graph import Passage, open_store
from mhqa_graph.errors import InvalidQuestion
from mhqa_graph.eval.report import prefilled_per_question
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.traces import (
    SCHEMA_VERSION,
    Trace,
    TraceError,
    TraceRecorder,
    arun_with_trace,
    load_trace,
    run_with_trace,
)

QUESTION = "Where was the director of Inception born?"
PASSAGES = [
    Passage("inception", "Inception", "Inception is a 2010 science fiction film directed by Christopher Nolan."),
    Passage("nolan", "Christopher Nolan", "Christopher Nolan is a British-American filmmaker, born in London."),
    Passage("paris", "Paris", "Paris is the capital and largest city of France."),
    Passage("berlin", "Berlin", "Berlin is the capital of Germany."),
    Passage("rome", "Rome", "Rome is the capital of Italy."),
]
TRIPLES = [("Inception", "directed by", "Christopher Nolan"), ("Christopher Nolan", "born in", "London")]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('traces')}/s?embedder=hash")
    s.add_passages("wiki", PASSAGES)
    s.add_triples("films", TRIPLES)
    yield s
    s.close()


def analysis(answer: str, sufficient: bool = True) -> str:
    return json.dumps({"reasoning": "from the passages", "sufficient": sufficient, "answer": answer})


def opera_roles(final: str = "London") -> dict[str, FakeChatModel]:
    """Sub-goal 1 needs one rewrite; sub-goal 2 is answered at once."""
    return {"plan": FakeChatModel(responses=[json.dumps({"subgoals": ["Who directed Inception?",
                                                                      "Where was [Answer1] born?"]})]),
            "analysis": FakeChatModel(responses=[analysis("", False), analysis("Christopher Nolan"),
                                                 analysis("London")], cycle=False),
            "rewrite": FakeChatModel(responses=['{"query": "Inception film director"}']),
            "answer": FakeChatModel(responses=[final])}


def run_opera(store, final: str = "London", question: str = QUESTION):
    roles = opera_roles(final)
    ctx = OperaContext(llm=FakeChatModel(responses=["unused"]), role_llms=roles, store=store, corpus="wiki")
    return (*run_with_trace(build_graph("opera"), "opera", question, ctx), roles)


def mujica_models(latency: float = 0.0) -> tuple[FakeChatModel, FakeChatModel]:
    plans = iter([{"subquestions": [{"id": f"q{i}", "question": f"What is the capital of {c}?", "depends_on": []}
                                    for i, c in enumerate(["France", "Germany", "Italy"], start=1)]},
                  {"answer": "Paris, Berlin and Rome"}])
    capitals = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome"}

    def work(messages):
        asked = re.search(r"Question: (.*)", messages[-1].text).group(1)
        country = next(c for c in capitals if c in asked)
        return f'<think>context 1 names it</think>{{"relevant": [1], "answer": "{capitals[country]}"}}'

    return (FakeChatModel(respond=lambda m: json.dumps(next(plans))),
            FakeChatModel(respond=work, latency=latency))


def mujica_context(store, planner, worker) -> MujicaContext:
    return MujicaContext(role_llms={"planner": planner, "worker": worker}, store=store, corpus="wiki")


def run_mujica(store):
    planner, worker = mujica_models()
    return run_with_trace(build_graph("mujica"), "mujica", "Capitals of France, Germany and Italy?",
                          mujica_context(store, planner, worker))


def omne_call(name: str, think: str = "", **args) -> str:
    head = f"<think>{think}</think>\n" if think else ""
    return f'{head}<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


OMNE_SCRIPT = [omne_call("entity_matcher", think="Find the film.", query="Inception", graph_type="films"),
               omne_call("node_info", think="Who directed it?", entity="Inception", graph_type="films"),
               omne_call("node_info", entity="Christopher Nolan", graph_type="films"),
               "<think>Nolan was born in London.</think>\n<answer>London</answer>"]


def run_omne(store, script=OMNE_SCRIPT, question: str = QUESTION):
    model = FakeChatModel(responses=list(script), cycle=False)
    ctx = OmneContext(llm=model, store=store, graph="films")
    return (*run_with_trace(build_graph("omne"), "omne", question, ctx), model)


def fake_tokens(model: FakeChatModel, replies: list[str]) -> tuple[int, int]:
    """The token counts FakeChatModel reports for its recorded calls and replies."""
    return (sum(len(m.text.split()) for call in model.calls for m in call),
            sum(len(r.split()) for r in replies))


# -- OPERA ---------------------------------------------------------------------------------------
def test_opera_calls_carry_their_roles_nodes_and_messages(store):
    out, trace, roles = run_opera(store)
    assert out["answer"] == trace.answer == "London" and trace.agent == "opera" and trace.error is None
    assert [c.role for c in trace.llm_calls] == ["plan", "analysis", "rewrite", "analysis", "analysis", "answer"]
    assert [c.node for c in trace.llm_calls] == ["plan", "analyze", "rewrite", "analyze", "analyze", "synthesize"]
    plan_call = trace.llm_calls[0]
    assert [m.role for m in plan_call.messages] == ["system", "user"]
    assert plan_call.messages[1].content == roles["plan"].calls[0][1].text
    assert plan_call.output == roles["plan"].responses[0]
    assert trace.llm_calls[2].output == '{"query": "Inception film director"}'
    assert all(c.latency >= 0 and c.error is None for c in trace.llm_calls)
    assert [c.start for c in trace.llm_calls] == sorted(c.start for c in trace.llm_calls)


def test_opera_plan_steps_and_retrieved_items(store):
    _, trace, _ = run_opera(store)
    assert [(p.id, p.depends_on) for p in trace.plan] == [("1", []), ("2", ["1"])]
    assert [s.id for s in trace.steps] == ["1.1", "1.2", "2.1"]
    assert trace.steps[1].query == "Inception film director" and trace.steps[1].answer == "Christopher Nolan"
    assert trace.steps[2].query == "Where was Christopher Nolan born?"
    hits = trace.steps[2].retrieved
    assert hits and hits[0].id == "nolan" and hits[0].title == "Christopher Nolan" and hits[0].score > 0
    assert trace.corpus == "wiki" and trace.graph is None
    assert trace.design["steps"][0]["attempts"][0]["rewrite"] == "Inception film director"


def test_tokens_are_summed_over_calls(store):
    _, trace, roles = run_opera(store)
    n_in = n_out = 0
    for model in roles.values():
        replies = [c.output for c in trace.llm_calls if any(c.messages[-1].content == call[-1].text
                                                            for call in model.calls)]
        i, o = fake_tokens(model, replies)
        n_in, n_out = n_in + i, n_out + o
    assert trace.input_tokens == n_in > 0 and trace.output_tokens == n_out > 0
    cached = sum(c.cached_tokens for c in trace.llm_calls)
    assert trace.usage() == {"llm_calls": 6, "llm_calls_cached": 0, "tokens": {
        "input": n_in, "output": n_out, "total": n_in + n_out, "cached": cached}}
    assert all(c.input_tokens > 0 and c.output_tokens > 0 for c in trace.llm_calls)
    assert 0 < trace.cached_tokens == cached < n_in  # OPERA's calls of one role share their system prompt


def test_prompt_tokens_a_cache_held_reach_the_eval_summary():
    first = {"tokens": {"input": 100, "output": 5, "total": 105, "cached": 60}}
    second = {"tokens": {"input": 50, "output": 5, "total": 55, "cached": 0}}
    assert prefilled_per_question([first, second]) == (40 + 50) / 2
    assert prefilled_per_question([first, {"tokens": {"input": 50, "output": 5, "total": 55}}]) is None


def test_schema_round_trips_through_json(store):
    _, trace, _ = run_opera(store)
    text = trace.model_dump_json()
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION
    assert Trace.model_validate_json(text) == trace == load_trace(json.loads(text)) == load_trace(text)


# -- Mujica: parallel workers --------------------------------------------------------------------
@pytest.mark.parametrize("entry", ["invoke", "ainvoke"])
def test_mujica_parallel_worker_calls_are_all_recorded(store, entry):
    planner, worker = mujica_models(latency=1.0)
    ctx = mujica_context(store, planner, worker)
    graph = build_graph("mujica")
    t = time.perf_counter()
    if entry == "invoke":
        out, trace = run_with_trace(graph, "mujica", "Capitals of France, Germany and Italy?", ctx)
    else:
        out, trace = asyncio.run(arun_with_trace(graph, "mujica", "Capitals of France, Germany and Italy?", ctx))
    assert time.perf_counter() - t < 2 * 1.0  # in parallel: three workers one after another take 3 s
    assert out["answer"] == trace.answer == "Paris, Berlin and Rome"
    assert [c.role for c in trace.llm_calls].count("worker") == 3 == len(worker.calls)
    assert [c.role for c in trace.llm_calls].count("planner") == 2
    assert sorted(c.output.split('"answer": "')[1].rstrip('"}') for c in trace.llm_calls if c.role == "worker") \
        == ["Berlin", "Paris", "Rome"]
    assert {c.node for c in trace.llm_calls} == {"planner", "worker"}
    assert all(c.latency >= 0.3 for c in trace.llm_calls if c.role == "worker")
    assert [p.id for p in trace.plan] == ["q1", "q2", "q3"]
    assert [(s.id, s.answer) for s in trace.steps] == [("q1", "Paris"), ("q2", "Berlin"), ("q3", "Rome")]
    assert all(s.retrieved and s.retrieved[0].score is not None for s in trace.steps)


# -- Omne: tool calls --------------------------------------------------------------------------
def test_omne_tool_calls_and_results_are_recorded(store):
    out, trace, model = run_omne(store)
    assert out["answer"] == trace.answer == "London"
    assert [c.role for c in trace.llm_calls] == ["tool-agent"] * 4
    assert [t.name for t in trace.tool_calls] == ["entity_matcher", "node_info", "node_info"]
    assert trace.tool_calls[2].args == {"entity": "Christopher Nolan", "graph_type": "films"}
    assert "(Christopher Nolan) -[born in]-> (London)" in trace.tool_calls[2].output
    assert all(t.node == "tools" and t.error is None for t in trace.tool_calls)
    last = trace.llm_calls[-1]
    assert [m.role for m in last.messages] == ["system", "user", "assistant", "user", "assistant", "user",
                                               "assistant", "user"]
    assert last.messages[2].content == OMNE_SCRIPT[0] and "<tool_response>" in last.messages[3].content
    assert [s.query for s in trace.steps] == ["Inception", "Inception", "Christopher Nolan"]
    assert trace.graph == "films"


def test_rag_baseline_trace(store):
    model = FakeChatModel(responses=["<answer>London</answer>"])
    ctx = BaselineContext(llm=model, store=store, corpus="wiki", top_k=3)
    out, trace = run_with_trace(build_graph("rag"), "rag", QUESTION, ctx)
    assert [c.role for c in trace.llm_calls] == ["answer"] and trace.answer == "London"
    assert [s.kind for s in trace.steps] == ["retrieve"] and len(trace.steps[0].retrieved) == 3


# -- failures ----------------------------------------------------------------------------------
def test_a_failing_model_call_is_recorded_with_its_error(store):
    model = FakeChatModel(responses=[OMNE_SCRIPT[0]], cycle=False)  # the second call raises ModelError
    out, trace = run_with_trace(build_graph("omne"), "omne", QUESTION, OmneContext(llm=model, store=store,
                                                                                  graph="films"))
    assert out["error"].startswith("ModelError") and trace.error == out["error"]
    assert [c.error is None for c in trace.llm_calls] == [True, False]
    assert "exhausted" in trace.llm_calls[1].error and trace.llm_calls[1].output == ""


def test_a_raising_run_still_gives_a_trace_with_the_question(store):
    recorder = TraceRecorder("opera", {"corpus": "wiki"})
    ctx = OperaContext(llm=FakeChatModel(responses=["x"]), store=store, corpus="wiki")
    with pytest.raises(InvalidQuestion):
        build_graph("opera").invoke({"question": "   "}, context=ctx, config={"callbacks": [recorder]})
    trace = recorder.trace(error="InvalidQuestion: question is empty")
    assert trace.question == "   " and trace.error.startswith("InvalidQuestion") and trace.llm_calls == []
    assert trace.corpus == "wiki"


def test_trace_defaults_to_the_output_the_callbacks_saw(store):
    planner, worker = mujica_models()
    recorder = TraceRecorder("mujica")
    out = build_graph("mujica").invoke({"question": "Capitals?"}, context=mujica_context(store, planner, worker),
                                       config={"callbacks": [recorder]})
    assert recorder.trace().model_dump(exclude={"latency"}) == recorder.trace(out).model_dump(exclude={"latency"})


# -- plain states --------------------------------------------------------------------------------
def test_plain_state_rebuilds_what_it_can(store):
    out, trace, _ = run_opera(store)
    state = json.loads(json.dumps(out))
    rebuilt = load_trace(state, agent="opera", question=QUESTION)
    assert rebuilt.source == "state" and rebuilt.llm_calls == []
    assert rebuilt.plan == trace.plan and rebuilt.steps == trace.steps and rebuilt.answer == "London"
    omne_out, omne_trace, _ = run_omne(store)
    omne_state = {k: v for k, v in omne_out.items() if k != "messages"}
    rebuilt = load_trace(omne_state, agent="omne", question=QUESTION)
    assert [t.name for t in rebuilt.tool_calls] == [t.name for t in omne_trace.tool_calls]


@pytest.mark.parametrize("value, message", [({"schema_version": 99, "question": "q"}, "schema version 99"),
                                            ({"schema_version": SCHEMA_VERSION}, "malformed trace"),
                                            ({"answer": "x"}, "no string 'question'"),
                                            (["x"], "expected an object"),
                                            ("{not json", "unreadable trace")])
def test_unusable_traces_are_typed_errors(value, message):
    with pytest.raises(TraceError, match=message):
        load_trace(value)


def test_cli_ask_writes_a_trace(tmp_path, store):
    uri = f"embedded://{tmp_path}/cli?embedder=hash"
    s = open_store(uri)
    s.add_passages("wiki", PASSAGES)
    s.close()
    path = tmp_path / "trace.json"
    llm = 'fake:["<answer>London</answer>"]'
    done = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "ask", QUESTION, "--agent", "rag", "--llm", llm,
                           "--store", uri, "--corpus", "wiki", "--trace", str(path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    trace = load_trace(path.read_text(encoding="utf-8"))
    assert trace.source == "callbacks" and trace.answer == "London" and trace.agent == "rag"
    assert [c.role for c in trace.llm_calls] == ["answer"] and trace.steps[0].retrieved
