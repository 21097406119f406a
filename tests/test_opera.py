"""OPERA graph: planning with placeholders, the rewrite loop and its top-k schedule, malformed and failing
models, streaming, checkpoint and resume, context forms, and the knowledge-graph adapter."""

from __future__ import annotations

import json

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from mhqa_graph.graphs.common import AgentContext
from mhqa_graph.graphs.opera import (
    OperaContext,
    build,
    check_analysis,
    check_plan,
    fill_placeholders,
    parse_rewrite,
    topk_for,
)

from mhqa_graph import Passage, open_store
from mhqa_graph.errors import InvalidQuestion
from mhqa_graph.testing.fakes import FakeChatModel

PASSAGES = [
    Passage("inception", "Inception", "Inception is a 2010 science fiction film directed by Christopher Nolan."),
    Passage("nolan", "Christopher Nolan", "Christopher Nolan is a British-American filmmaker, born in London in 1970."),
    Passage("london", "London", "London is the capital city of England and of the United Kingdom."),
    Passage("zimmer", "Hans Zimmer", "Hans Zimmer, born in Frankfurt, composed the score of Inception."),
    Passage("interstellar", "Interstellar", "Interstellar is a 2014 film directed by Christopher Nolan."),
    Passage("frankfurt", "Frankfurt", "Frankfurt is a city on the Main river in Germany."),
]
QUESTION = "Where was the director of Inception born?"
TWO_HOPS = json.dumps({"subgoals": ["Who directed Inception?", "Where was [Answer1] born?"]})


def said(answer: str, sufficient: bool = True) -> str:
    return json.dumps({"reasoning": "from the passages", "sufficient": sufficient, "answer": answer})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('opera')}/s?embedder=hash")
    s.add_passages("wiki", PASSAGES)
    s.add_triples("kg", [("Inception", "directed by", "Christopher Nolan"),
                         ("Christopher Nolan", "born in", "London"),
                         ("Hans Zimmer", "born in", "Frankfurt")])
    yield s
    s.close()


def models(plan=(TWO_HOPS,), analysis=(said("Christopher Nolan"), said("London")), rewrite=('{"query": "x"}',),
           answer=("London",)) -> dict[str, FakeChatModel]:
    return {"plan": FakeChatModel(responses=list(plan)), "analysis": FakeChatModel(responses=list(analysis)),
            "rewrite": FakeChatModel(responses=list(rewrite)), "answer": FakeChatModel(responses=list(answer))}


def context(store, roles, **kw) -> OperaContext:
    return OperaContext(llm=FakeChatModel(responses=["unused"]), role_llms=roles, store=store,
                        corpus=kw.pop("corpus", "wiki"), **kw)


def run(store, roles=None, question=QUESTION, **kw) -> dict:
    roles = roles or models()
    return build().invoke({"question": question}, context=context(store, roles, **kw))


# -- pure helpers -------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["Where was [Answer1] born?", "Where was [answer 1] born?",
                                  "Where was [ANSWER_1] born?", "Where was [entity from step 1] born?",
                                  "Where was [the director found in step 1] born?"])
def test_fill_placeholders_both_styles(text):
    assert fill_placeholders(text, ["Christopher Nolan"]) == ("Where was Christopher Nolan born?", [])


def test_fill_placeholders_missing_steps_are_readable_and_warned():
    filled, warnings = fill_placeholders("Where was [Answer3] born, see [1990]?", ["Nolan", "London"])
    assert filled == "Where was London born, see [1990]?" and "step 3 is not an earlier step" in warnings[0]
    filled, warnings = fill_placeholders("Where was [Answer1] born?", [])
    assert filled == "Where was born?" and "removed" in warnings[0]
    assert fill_placeholders("Who directed [Answer2] ?", [])[0] == "Who directed?"
    filled, warnings = fill_placeholders("Who married [Answer2]?", ["Nolan", ""])
    assert filled == "Who married Nolan?" and "step 2 has no answer" in warnings[0]


def test_topk_schedule_explicit_or_derived():
    assert [topk_for(OperaContext(), i) for i in range(5)] == [5, 10, 15, 15, 15]
    assert [topk_for(OperaContext(top_k=3, max_rewrites=1), i) for i in range(3)] == [3, 6, 6]
    assert [topk_for(OperaContext(topk_schedule=(2, 4)), i) for i in range(3)] == [2, 4, 4]


def test_parsers_accept_common_shapes_and_reject_others():
    assert check_plan(["a", {"question": "b"}, " ", 3]) == ["a", "b"]
    assert check_plan({"Sub_Goals": ["a  b"]}) == ["a b"]
    for bad in ({"foo": ["a"]}, {"subgoals": []}, {"subgoals": "a"}):
        with pytest.raises(ValueError):
            check_plan(bad)
    assert check_analysis({"status": "yes", "answer": "Answer: Nolan", "analysis": "r"}) == \
        {"reasoning": "r", "sufficient": True, "answer": "Nolan"}
    assert check_analysis({"sufficient": "true", "answer": "unknown"})["sufficient"] is False
    assert check_analysis({"answer": "Nolan"})["sufficient"] is True
    with pytest.raises(ValueError):
        check_analysis({"verdict": "yes"})
    assert parse_rewrite('{"query": "Inception director"}') == "Inception director"
    assert parse_rewrite('<think>hmm</think>\nQuery: "film Inception director"\nmore') == "film Inception director"
    assert parse_rewrite('{"query": "cut off here') == "cut off here"


# -- the graph ----------------------------------------------------------------------------
@pytest.mark.parametrize("placeholder", ["[Answer1]", "[entity from step 1]"])
def test_two_hops_fill_placeholder_into_retrieval_query(store, placeholder):
    roles = models(plan=[json.dumps({"subgoals": ["Who directed Inception?", f"Where was {placeholder} born?"]})])
    out = run(store, roles)
    assert out["answer"] == "London" and out["error"] is None
    assert '"reasoning"' in roles["analysis"].calls[0][-1].text
    assert out["plan"] == ["Who directed Inception?", f"Where was {placeholder} born?"]
    first, second = out["steps"]
    assert first["answer"] == "Christopher Nolan" and first["sufficient"]
    assert second["query"] == second["attempts"][0]["query"] == "Where was Christopher Nolan born?"
    assert second["attempts"][0]["hits"][0]["id"] == "nolan"
    assert {"id", "title", "score"} <= set(second["attempts"][0]["hits"][0])
    assert second["attempts"][0]["analysis_raw"] == [said("London")]
    assert roles["rewrite"].calls == []  # sufficient at once: no rewrite
    analysis_prompt = roles["analysis"].calls[1][-1].text
    assert "1. Who directed Inception? -> Christopher Nolan" in analysis_prompt and "born in London" in analysis_prompt
    assert "1. Who directed Inception? -> Christopher Nolan" in roles["answer"].calls[0][-1].text


def test_placeholder_to_future_step_is_warned_not_fatal(store):
    roles = models(plan=[json.dumps({"subgoals": ["Who directed Inception?", "Where was [Answer3] born?"]})])
    out = run(store, roles)
    assert out["answer"] == "London"
    assert out["steps"][1]["query"] == "Where was Christopher Nolan born?"
    assert any("[Answer3]" in n and n.startswith("warning") for n in out["notes"])
    assert out["steps"][1]["warnings"] and out["error"] is None


def test_rewrite_cap_and_topk_schedule(store):
    roles = models(analysis=[said("maybe Nolan", sufficient=False)],
                   rewrite=['{"query": "Inception film director"}', "Query: Nolan birthplace"], answer=["London"])
    out = run(store, roles, max_rewrites=2, topk_schedule=(2, 4, 6))
    assert len(roles["rewrite"].calls) == 4  # exactly max_rewrites per sub-goal, then on to the next one
    assert len(roles["analysis"].calls) == 6
    for step in out["steps"]:
        assert [a["k"] for a in step["attempts"]] == [2, 4, 6]
        assert [len(a["hits"]) for a in step["attempts"]] == [2, 4, 6]
        assert [a["rewrite"] for a in step["attempts"]][:2] and step["attempts"][-1]["rewrite"] is None
        assert step["answer"] == "maybe Nolan" and not step["sufficient"]  # best available, kept
    first = out["steps"][0]["attempts"]
    assert [a["query"] for a in first] == ["Who directed Inception?", "Inception film director", "Nolan birthplace"]
    assert out["steps"][1]["query"] == "Where was maybe Nolan born?"
    assert out["answer"] == "London"


def test_rewrite_cap_zero_and_empty_rewrite(store):
    roles = models(plan=['{"subgoals": ["Who directed Inception?"]}'], analysis=[said("", sufficient=False)],
                   rewrite=["   "], answer=["Christopher Nolan"])
    out = run(store, roles, max_rewrites=0)
    assert roles["rewrite"].calls == [] and len(out["steps"][0]["attempts"]) == 1
    assert out["steps"][0]["attempts"][0]["k"] == 5
    out = run(store, models(plan=['{"subgoals": ["Who directed Inception?"]}'], analysis=[said("", False)],
                            rewrite=["   "], answer=["Christopher Nolan"]), max_rewrites=1)
    attempts = out["steps"][0]["attempts"]
    assert [a["query"] for a in attempts] == ["Who directed Inception?"] * 2 and [a["k"] for a in attempts] == [5, 10]
    assert any("empty rewrite" in n for n in out["notes"])


@pytest.mark.parametrize("replies", [["no plan here", "still none"], ['{"subgoals": ["a", "b"', '{"subgoals": ['],
                                     ['{"foo": ["a"]}', '{"bar": 1}'], ['{"subgoals": []}', "[]"]])
def test_unusable_plan_falls_back_to_the_question(store, replies):
    roles = models(plan=replies, analysis=[said("London")], answer=["London"])
    out = run(store, roles)
    assert out["plan"] == [QUESTION] and out["answer"] == "London"
    assert out["error"].startswith("MalformedOutput") and "one sub-goal" in out["error"]
    assert len(roles["plan"].calls) == 2  # one repair, then the fallback
    assert out["steps"][0]["attempts"][0]["query"] == QUESTION


def test_truncated_plan_is_repaired(store):
    roles = models(plan=['{"subgoals": ["Who directed Inception?", "Where was [Answer1]', TWO_HOPS])
    out = run(store, roles)
    assert out["plan"] == json.loads(TWO_HOPS)["subgoals"] and out["error"] is None and out["answer"] == "London"
    assert "could not be used" in roles["plan"].calls[1][-1].text


def test_long_plan_is_capped(store):
    roles = models(plan=[json.dumps({"subgoals": [f"q{i}" for i in range(5)]})], analysis=[said("x")], answer=["x"])
    out = run(store, roles, max_rounds=2)
    assert out["plan"] == ["q0", "q1"] and len(out["steps"]) == 2 and any("kept the first 2" in n for n in out["notes"])


@pytest.mark.parametrize("bad", ["Christopher Nolan directed it.", '{"sufficient": true, "answer": "Chris',
                                 '{"verdict": "Nolan"}'])
def test_malformed_analysis_is_recorded_and_run_finishes(store, bad):
    roles = models(plan=['{"subgoals": ["Who directed Inception?"]}'], analysis=[bad], answer=["Christopher Nolan"])
    out = run(store, roles, max_rewrites=1, parse_retries=1)
    attempts = out["steps"][0]["attempts"]
    assert len(attempts) == 2 and all(a["analysis"] is None and a["analysis_raw"] == [bad, bad] for a in attempts)
    assert attempts[0]["error"].startswith("MalformedOutput")
    assert out["error"].startswith("MalformedOutput") and out["answer"] == "Christopher Nolan"


def test_analysis_repaired_on_second_try(store):
    roles = models(plan=['{"subgoals": ["Who directed Inception?"]}'],
                   analysis=["Nolan, I think", '{"status": "yes", "answer": "Christopher Nolan"}'],
                   answer=["Christopher Nolan"])
    out = run(store, roles)
    assert out["error"] is None and out["steps"][0]["sufficient"] and roles["rewrite"].calls == []


def test_empty_final_answer_falls_back_to_last_subgoal_answer(store):
    out = run(store, models(answer=["   "]))
    assert out["answer"] == "London" and out["error"] == "MalformedOutput: empty final answer"
    out = run(store, models(answer=['{"answer": "London, England"}']))
    assert out["answer"] == "London, England" and out["error"] is None


def test_model_error_in_analysis_ends_run_with_what_it_has(store):
    roles = models()
    roles["analysis"] = FakeChatModel(responses=[said("Christopher Nolan")], cycle=False)
    out = run(store, roles)
    assert out["error"].startswith("ModelError: analysis") and out["answer"] == "Christopher Nolan"
    assert len(out["steps"]) == 2 and out["steps"][1]["attempts"][0]["error"].startswith("ModelError")
    assert roles["rewrite"].calls == [] and roles["answer"].calls == []


def test_model_error_in_plan_rewrite_and_answer(store):
    def boom(messages):
        raise RuntimeError("CUDA out of memory")

    roles = models()
    roles["plan"] = FakeChatModel(respond=boom)
    out = run(store, roles)
    assert out["answer"] == "" and out["error"].startswith("ModelError: plan") and "CUDA" in out["error"]
    assert roles["analysis"].calls == []

    roles = models(analysis=[said("Nolan?", sufficient=False)])
    roles["rewrite"] = FakeChatModel(respond=boom)
    out = run(store, roles)
    assert out["error"].startswith("ModelError: rewrite") and out["answer"] == "Nolan?" and len(out["steps"]) == 1

    roles = models()
    roles["answer"] = FakeChatModel(respond=boom)
    out = run(store, roles)
    assert out["error"].startswith("ModelError: answer") and out["answer"] == "London"


def test_missing_corpus_is_a_store_error_recorded(store):
    out = run(store, models(), corpus="no-such-corpus")
    assert out["error"].startswith("UnknownCorpus") and out["answer"] == ""


def test_no_source_recorded_without_model_calls(store):
    roles = models()
    out = run(store, roles, corpus=None)
    assert out["error"].startswith("InvalidInput") and roles["plan"].calls == []


@pytest.mark.parametrize("question", ["", "   \n", None, 3])
def test_invalid_question_raises(store, question):
    with pytest.raises(InvalidQuestion):
        run(store, question=question)


def test_stream_updates_show_every_step(store):
    roles = models(analysis=[said("", False), said("Christopher Nolan"), said("London")],
                   rewrite=['{"query": "Inception director"}'])
    nodes = [next(iter(u)) for u in build().stream({"question": QUESTION}, context=context(store, roles),
                                                    stream_mode="updates")]
    assert nodes == ["plan", "retrieve", "analyze", "rewrite", "retrieve", "analyze",
                     "retrieve", "analyze", "synthesize"]


class Interrupted(BaseException):
    """Stands for a kill or Ctrl-C in the middle of a model call."""


def test_sqlite_checkpoint_and_resume(store, tmp_path):
    calls = {"n": 0}

    def flaky(messages):
        calls["n"] += 1
        if calls["n"] == 2:
            raise Interrupted()
        return said("Christopher Nolan") if calls["n"] == 1 else said("London")

    roles = models()
    roles["analysis"] = FakeChatModel(respond=flaky)
    ctx = context(store, roles)
    config = {"configurable": {"thread_id": "t1"}}
    with SqliteSaver.from_conn_string(str(tmp_path / "ckpt.sqlite")) as saver:
        graph = build(checkpointer=saver)
        with pytest.raises(Interrupted):
            graph.invoke({"question": QUESTION}, config, context=ctx)
        saved = graph.get_state(config)
        assert saved.next == ("analyze",) and len(saved.values["steps"]) == 2
        out = graph.invoke(None, config, context=ctx)
    assert out["answer"] == "London" and out["error"] is None
    assert len(roles["plan"].calls) == 1 and calls["n"] == 3  # plan and the first analysis not redone
    with SqliteSaver.from_conn_string(str(tmp_path / "ckpt.sqlite")) as saver:  # the thread, reused
        graph = build(checkpointer=saver)
        assert graph.get_state(config).values["answer"] == "London"
        roles = models(plan=['{"subgoals": ["Who directed [Answer2]?"]}'], analysis=[said("Christopher Nolan")],
                       answer=["Christopher Nolan"])
        out = graph.invoke({"question": "Who directed Inception?"}, config, context=context(store, roles))
    assert out["answer"] == "Christopher Nolan" and out["plan"] == ["Who directed [Answer2]?"]
    assert len(out["steps"]) == 1 and out["steps"][0]["query"] == "Who directed?"  # no answers of the old run
    assert len(out["notes"]) == 1 and "removed" in out["notes"][0]


def test_dict_and_plain_agent_context(store):
    roles = models()
    ctx = {"llm": FakeChatModel(responses=["unused"]), "role_llms": roles, "store": store, "corpus": "wiki",
           "topk_schedule": [3, 4], "max_rewrites": 1, "think": False}
    out = build().invoke({"question": QUESTION}, context=ctx)
    assert out["answer"] == "London" and out["steps"][0]["attempts"][0]["k"] == 3
    assert '"reasoning"' not in roles["analysis"].calls[0][-1].text
    plain = AgentContext(llm=FakeChatModel(responses=["unused"]), role_llms=models(), store=store, corpus="wiki",
                         top_k=2)
    out = build().invoke({"question": QUESTION}, context=plain)
    assert out["answer"] == "London" and out["steps"][0]["attempts"][0]["k"] == 2


def test_single_model_plays_every_role(store):
    def respond(messages):
        system = messages[0].text
        if "Plan agent" in system:
            return TWO_HOPS
        if "Analysis-Answer" in system:
            return said("London") if "Christopher Nolan born" in messages[-1].text else said("Christopher Nolan")
        return "London"

    llm = FakeChatModel(respond=respond)
    out = build().invoke({"question": QUESTION}, context=OperaContext(llm=llm, store=store, corpus="wiki"))
    assert out["answer"] == "London" and len(llm.calls) == 4


def test_knowledge_graph_adapter(store):
    roles = models()
    out = run(store, roles, corpus=None, graph="kg")
    assert out["answer"] == "London"
    second = out["steps"][1]["attempts"][0]
    assert "Christopher Nolan" in [h["id"] for h in second["hits"]]
    assert "(Christopher Nolan) -[born in]-> (London)" in second["context"]


def test_topic_entities_reach_the_planner(store):
    roles = models()
    out = build().invoke({"question": QUESTION, "topic_entities": ["Inception"]}, context=context(store, roles))
    assert out["answer"] == "London" and "Entities the question is about: Inception" in roles["plan"].calls[0][-1].text
