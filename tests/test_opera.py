"""OPERA graph: placeholders in every form (unresolved ones left as written, never another step's
answer), refusals, missing sufficiency and ungrounded answers, the rewrite loop with merged passages and its
top-k schedule, parallel sub-goals, per-step updates, malformed plans and models, streaming, checkpoint and
resume, context forms, and the knowledge-graph adapter."""

from __future__ import annotations

import json
import re
import threading

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph.state import CompiledStateGraph
from mhqa_graph.graphs.answers import grounded, is_no_answer
from mhqa_graph.graphs.opera import build
from mhqa_graph.graphs.opera import prompts as opera_prompts
from mhqa_graph.graphs.opera.analysis import check_analysis, parse_rewrite
from mhqa_graph.graphs.opera.graph import topk_for
from mhqa_graph.graphs.opera.guard_rules import cut_runaway
from mhqa_graph.graphs.opera.plan import check_plan, dependencies, fill_placeholders
from mhqa_graph.graphs.opera.state import RECURSION_LIMIT, OperaContext, merge_steps
from mhqa_graph.graphs.settings import AgentContext

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
                                  "Where was [the director found in step 1] born?", "Where was {Answer1} born?",
                                  "Where was <Answer1> born?", "Where was #1 born?", "Where was [#1] born?",
                                  "Where was [1] born?"])
def test_every_placeholder_form_is_filled(text):
    assert fill_placeholders(text, 2, {1: "Christopher Nolan"}) == ("Where was Christopher Nolan born?", 1, [])
    assert dependencies(["Who directed Inception?", text]) == [[], [1]]


@pytest.mark.parametrize("text", ["Who starred in [Season 2] of it?", "What happened in [1990]?",
                                  "Which song was #1 in 1990?", "Who wrote {the book}?", "Is 3 < 4 > 2?"])
def test_brackets_naming_no_step_stay_as_written(text):
    assert fill_placeholders(text, 1, {}) == (text, 0, [])
    assert dependencies([text]) == [[]]


def test_unresolved_placeholders_stay_as_written_never_another_answer():
    answers = {1: "Nolan", 2: "London"}
    filled, resolved, warnings = fill_placeholders("Where was [Answer3] born, see [1990]?", 3, answers)
    assert filled == "Where was [Answer3] born, see [1990]?" and resolved == 0
    assert warnings == ["placeholder [Answer3]: step 3 is not an earlier step; left as written"]
    filled, resolved, warnings = fill_placeholders("Who married [Answer2] in {Answer1}?", 3, {1: "Nolan", 2: ""})
    assert filled == "Who married [Answer2] in Nolan?" and resolved == 1
    assert warnings == ["placeholder [Answer2]: step 2 has no answer; left as written"]
    assert dependencies(["A [Answer2]?", "B [Answer2] #2?", "C [Answer1] <answer 2>?"]) == [[], [], [1, 2]]


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
        {"reasoning": "r", "sufficient": True, "answer": "Nolan", "flag": None}
    refusal_on = OperaContext(guards="+analysis_refusal")
    assert check_analysis({"sufficient": "true", "answer": "unknown"}, ctx=refusal_on)["sufficient"] is False
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


def test_placeholder_to_future_step_is_left_as_written_with_the_question(store):
    roles = models(plan=[json.dumps({"subgoals": ["Who directed Inception?", "Where was [Answer3] born?"]})])
    out = run(store, roles)
    assert out["answer"] == "London" and out["error"] is None
    assert out["steps"][1]["query"] == "Where was [Answer3] born?"  # never another step's answer
    assert out["steps"][1]["attempts"][0]["query"] == f"Where was [Answer3] born? (question: {QUESTION})"
    # no placeholder ties the two sub-goals, so they run side by side: their analysis calls come in either order
    assert any("Current sub-goal: Where was [Answer3] born?\n" in call[-1].text for call in roles["analysis"].calls)
    assert any("[Answer3]" in n and n.startswith("warning") for n in out["notes"])
    assert out["steps"][1]["warnings"] and out["placeholders"] == {"written": 1, "resolved": 0, "fill_rate": 0.0}


def test_refusal_is_insufficient_and_never_filled_into_the_next_subgoal(store):
    refusal = ('<think>The passages talk about films.</think>\n{"reasoning": "No passage names him.", '
               '"sufficient": true, "answer": "The passages do not mention who directed Inception."}')
    roles = models(analysis=[refusal, refusal, said("London")], rewrite=['{"query": "Inception director"}'])
    out = run(store, roles, max_rewrites=1, guards="+analysis_refusal")
    first, second = out["steps"]
    assert [a["analysis"]["answer"] for a in first["attempts"]] == ["", ""]
    assert [a["analysis"]["flag"] for a in first["attempts"]] == ["no answer", "no answer"]
    assert first["answer"] == "" and not first["sufficient"] and len(roles["rewrite"].calls) == 1
    assert second["attempts"][0]["query"] == f"Where was [Answer1] born? (question: {QUESTION})"
    assert "1. Who directed Inception? -> not found (unconfirmed)" in roles["analysis"].calls[2][-1].text
    assert out["placeholders"] == {"written": 1, "resolved": 0, "fill_rate": 0.0}
    assert "1. Who directed Inception? -> not found (unconfirmed)" in roles["answer"].calls[0][-1].text


def test_missing_sufficiency_and_ungrounded_answers_count_as_insufficient(store):
    roles = models(plan=['{"subgoals": ["Who directed Inception?"]}'],
                   analysis=['{"answer": "Christopher Nolan"}', said("Steven Spielberg"), said("Christopher Nolan")],
                   rewrite=['{"query": "Inception film director"}', '{"query": "Inception 2010 film"}'],
                   answer=["Christopher Nolan"])
    out = run(store, roles)
    attempts = out["steps"][0]["attempts"]
    assert [a["analysis"]["flag"] for a in attempts] == ["no sufficiency given", "not in any passage", None]
    assert [a["analysis"]["sufficient"] for a in attempts] == [False, False, True]
    assert "'Steven Spielberg' does not appear in any passage" in roles["rewrite"].calls[1][-1].text
    assert out["steps"][0]["answer"] == "Christopher Nolan" and out["steps"][0]["sufficient"]


def test_rewrites_add_their_passages_to_the_earlier_ones(store):
    roles = models(plan=['{"subgoals": ["Who composed the score of Inception?"]}'],
                   analysis=[said("", False), said("Hans Zimmer")], rewrite=['{"query": "Frankfurt"}'],
                   answer=["Hans Zimmer"])
    out = run(store, roles, topk_schedule=(2, 2))
    first, second = out["steps"][0]["attempts"]
    ids1, ids2 = [h["id"] for h in first["hits"]], [h["id"] for h in second["hits"]]
    assert first["shown"] == ids1 and set(second["shown"]) == set(ids1) | set(ids2)
    assert len(second["shown"]) == len(set(second["shown"]))  # one copy of a passage found twice
    assert set(ids1) & set(ids2) and set(ids2) - set(ids1)  # found again, and found new
    scores = {i: max(h["score"] for a in (first, second) for h in a["hits"] if h["id"] == i) for i in second["shown"]}
    assert [scores[i] for i in second["shown"]] == sorted(scores.values(), reverse=True)  # best first
    prompt = roles["analysis"].calls[1][-1].text
    assert all(f"] {t}: " in prompt for t in {h["title"] for a in (first, second) for h in a["hits"]})


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


def test_runaway_plan_cut_off_by_the_token_limit_keeps_its_first_links(store):
    """The real 1.5B model chains "the father of [AnswerN]" until it runs out of tokens: the plan keeps the
    links before the third repeat, without asking again; a cut-off plan that does not repeat is asked again."""
    runaway = '{"subgoals": ["Who directed Inception?"' + "".join(
        f', "Who is the father of [Answer{i}]?"' for i in range(1, 30)) + ', "Who is the fa'
    roles = models(plan=[runaway], analysis=[said("Christopher Nolan"), said("Rudolph"), said("Walter")],
                   answer=["Walter"])
    out = run(store, roles)
    assert out["plan"] == ["Who directed Inception?", "Who is the father of [Answer1]?",
                           "Who is the father of [Answer2]?"]
    assert len(roles["plan"].calls) == 1 and out["answer"] == "Walter" and out["error"] is None
    assert "warning: the plan repeats one sub-goal; cut 27 repeats" in out["notes"]


def test_a_complete_plan_keeps_its_like_worded_sub_goals(store):
    subgoals = ["Who directed Heat?", "Who directed Alien?", "Who directed Inception?", "When was [Answer1] born?",
                "When was [Answer2] born?", "When was [Answer3] born?"]
    roles = models(plan=[json.dumps({"subgoals": subgoals})], analysis=[said("x")], answer=["x"])
    out = run(store, roles)
    assert out["plan"] == subgoals and not any("repeats" in n for n in out["notes"])


@pytest.mark.parametrize("subgoals, kept", [
    (["Who is A's mother?", "Who is the father of [Answer1]?", "What is the religion of [Answer2]?"], 3),
    (["Who is A's mother?", "Who is the mother of [Answer1]?", "Who is the mother of [Answer2]?",
      "Who is the mother of [Answer3]?"], 3),
    (["q", "Who is the father of [Answer1]?", "Who is the mother of [Answer2]?", "Who is the father of [Answer3]?",
      "Who is the mother of [Answer4]?", "Who is the father of [Answer5]?"], 5),
    (["Who is [Answer1]?", "Who is [Answer2]?"], 2),
])
def test_cut_runaway(subgoals, kept):
    assert cut_runaway(subgoals) == subgoals[:kept]


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
    updates = list(build().stream({"question": QUESTION}, context=context(store, roles), stream_mode="updates"))
    nodes = [next(iter(u)) for u in updates]
    assert nodes == ["plan", "schedule", "retrieve", "analyze", "rewrite", "retrieve", "analyze", "schedule",
                     "retrieve", "analyze", "schedule", "synthesize"]
    # each update carries its own sub-goal's change only: hit ids and scores, never the passage text
    for update in updates[2:-1]:
        for change in (next(iter(update.values())) or {}).get("steps", []):
            assert set(change) <= {"n", "attempt"} or next(iter(update)) == "schedule" or "done" in change
            assert all(set(h) == {"id", "title", "score"} for h in change.get("attempt", {}).get("hits", []))
    shown = json.dumps([u for u in updates if "synthesize" not in u], default=str)
    assert "born in London in 1970" not in shown and "science fiction film" not in shown
    assert len({json.dumps(u["schedule"]["steps"]) for u in updates if u.get("schedule")}) == 2


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
    # no answers of the old run: the placeholder stays, the question joins the query
    assert [a["query"] for a in out["steps"][0]["attempts"]] == \
        ["Who directed [Answer2]? (question: Who directed Inception?)"]
    assert out["notes"] == ["warning: sub-goal 1: placeholder [Answer2]: step 2 is not an earlier step; "
                            "left as written"]


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
    assert "(Christopher Nolan) -[born in]-> (London)" in roles["analysis"].calls[1][-1].text


def test_the_analysis_answer_is_held_to_the_shown_facts_on_a_graph_by_default(store):
    def grammar_models():
        return {role: FakeChatModel(accepts_grammar=True, responses=list(replies)) for role, replies in
                [("plan", [TWO_HOPS]), ("analysis", [said("Christopher Nolan"), said("London")]),
                 ("rewrite", ['{"query": "x"}']), ("answer", ["London"])]}

    closed = grammar_models()
    assert run(store, closed, corpus=None, graph="kg")["answer"] == "London"  # answer_from_facts: on by default
    first, second = closed["analysis"].grammars
    assert "Christopher Nolan" in first and "Inception" in first
    assert "London" in second
    for kw in ({"corpus": None, "graph": "kg", "answer_from_facts": False}, {}):  # the setting off; a corpus
        free = grammar_models()
        run(store, free, **kw)
        assert not any("Christopher Nolan" in g for g in free["analysis"].grammars)


def test_topic_entities_reach_the_planner(store):
    roles = models()
    out = build().invoke({"question": QUESTION, "topic_entities": ["Inception"]}, context=context(store, roles))
    assert out["answer"] == "London" and "Entities the question is about: Inception" in roles["plan"].calls[0][-1].text


# -- date comparisons --------------------------------------------------------------------
def _released(messages) -> str:
    return said("2010" if "Current sub-goal: When was Inception" in messages[-1].text else "2014")


@pytest.mark.parametrize("word, winner", [("first", "Inception"), ("later", "Interstellar")])
def test_a_date_comparison_is_settled_in_code(store, word, winner):
    """The real model found both dates and then named the wrong film: with one date per option, the
    date_comparison guard picks, and the synthesis it replaced stays in the firing."""
    roles = models(plan=[json.dumps({"subgoals": ["When was Inception released?", "When was Interstellar released?",
                                                  "Which film came out first?"]})],
                   answer=["Interstellar is newer"])
    roles["analysis"] = FakeChatModel(respond=_released)
    out = run(store, roles, question=f"Which film came out {word}, Inception or Interstellar?",
              guards="+date_comparison")
    assert out["answer"] == winner and out["error"] is None and len(roles["answer"].calls) == 1
    assert ("DateComparison: settled in code (Inception: 2010-0-0; Interstellar: 2014-0-0); the synthesis said "
            "'Interstellar is newer'") in out["notes"]
    fired = next(f for f in out["guards"] if f["guard"] == "date_comparison")
    assert fired == {"guard": "date_comparison", "stage": "conclusion", "before": "Interstellar is newer",
                     "after": winner, "enforced": True, "prompt_only": False, "replaces_answer": True}


@pytest.mark.parametrize("settings", [{"guards": "none"}, {"guards": "options_line,option_answer"},
                                      {"guards": "+date_comparison", "guard_mode": "log"}])
def test_the_date_comparison_guard_can_be_switched_off_or_logged(store, settings):
    roles = models(plan=[json.dumps({"subgoals": ["When was Inception released?", "When was Interstellar released?",
                                                  "Which film came out first?"]})],
                   answer=["Interstellar"])
    roles["analysis"] = FakeChatModel(respond=_released)
    out = run(store, roles, question="Which film came out first, Inception or Interstellar?", **settings)
    assert out["answer"] == "Interstellar" and not any(n.startswith("DateComparison") for n in out["notes"])
    logged = [f for f in out["guards"] if f["guard"] == "date_comparison"]
    if settings.get("guard_mode") == "log":
        assert logged == [{"guard": "date_comparison", "stage": "conclusion", "before": "Interstellar",
                           "after": "Inception", "enforced": False, "prompt_only": False, "replaces_answer": True}]
    else:
        assert not logged


def test_an_unconfirmed_date_is_not_compared(store):
    roles = models(plan=[json.dumps({"subgoals": ["When was Inception released?", "When was Interstellar released?"]})],
                   answer=["Inception"])
    roles["analysis"] = FakeChatModel(respond=lambda m: said("2010") if "When was Inception" in m[-1].text
                                      else said("1999", False))
    out = run(store, roles, question="Which film came out first, Inception or Interstellar?", max_rewrites=0)
    assert out["answer"] == "Inception" and len(roles["answer"].calls) == 1
    assert [s["answer"] for s in out["steps"]] == ["2010", "1999"] and not out["steps"][1]["sufficient"]


def test_an_undecided_date_comparison_is_left_to_the_synthesis(store):
    roles = models(plan=[json.dumps({"subgoals": ["When was Inception released?", "Who directed Interstellar?"]})],
                   analysis=[said("2010"), said("Christopher Nolan")], answer=["Inception"])
    out = run(store, roles, question="Which film came out first, Inception or Interstellar?")
    assert out["answer"] == "Inception" and len(roles["answer"].calls) == 1
    assert not any(n.startswith("DateComparison") for n in out["notes"])
    asked = roles["answer"].calls[0][-1].text  # the synthesis is told to name an option, not a director or date
    assert asked.startswith("Question: Which film came out first, Inception or Interstellar?\n"
                            "Answer with one of the two it names: Inception or Interstellar.\nFindings:")
    roles = models()
    run(store, roles)
    assert "Answer with one of" not in roles["answer"].calls[0][-1].text


def test_a_synthesis_naming_what_a_step_found_about_one_option_gives_that_option(store):
    roles = models(plan=[json.dumps({"subgoals": ["Who composed the score of Inception?",
                                                  "Who composed the score of Interstellar?"]})],
                   answer=["Hans Zimmer"])
    roles["analysis"] = FakeChatModel(respond=lambda m: said("Hans Zimmer") if "of Inception?" in m[-1].text
                                      else said("", False))
    out = run(store, roles, question="Which film has the composer born earlier, Inception or Interstellar?",
              max_rewrites=0, guards="+option_answer")
    assert out["answer"] == "Inception" and out["error"] is None
    assert "OptionAnswer: 'Hans Zimmer' answers step 1, about 'Inception'" in out["notes"]


# -- parallel sub-goals -------------------------------------------------------------------
def test_independent_subgoals_run_in_parallel_and_dependents_wait_for_them(store):
    """Sub-goals 1 and 2 name no earlier step: their analyses meet at a barrier, which only two concurrent
    calls pass. Sub-goal 3 names both and starts once both are done, with both answers filled in."""
    plan = {"subgoals": ["Who directed Inception?", "Who composed the score of Inception?",
                         "Did [Answer1] and {Answer 2} work together?"]}
    barrier = threading.Barrier(2, timeout=10)

    def analysis(messages):
        sub = re.search(r"Current sub-goal: (.*)", messages[-1].text).group(1)
        if "directed" in sub or "composed" in sub:
            barrier.wait()  # raises BrokenBarrierError unless the other sub-goal is analysed at the same time
            return said("Christopher Nolan" if "directed" in sub else "Hans Zimmer")
        return '```json\n{"reasoning": "Both worked on Inception.", "sufficient": "yes", "answer": "yes"}\n```'

    roles = models(plan=[json.dumps(plan)], answer=["yes"])
    roles["analysis"] = FakeChatModel(respond=analysis)
    out = run(store, roles)
    assert out["answer"] == "yes" and out["error"] is None
    third = out["steps"][2]
    assert third["query"] == "Did Christopher Nolan and Hans Zimmer work together?" and third["depends_on"] == [1, 2]
    assert "1. Who directed Inception? -> Christopher Nolan" in roles["analysis"].calls[2][-1].text
    assert out["placeholders"] == {"written": 2, "resolved": 2, "fill_rate": 1.0}


def test_a_failing_subgoal_halts_new_ones_but_lets_running_ones_finish(store):
    plan = {"subgoals": ["Who directed Inception?", "Who composed the score of Inception?",
                         "Where was [Answer1] born?"]}

    def analysis(messages):
        if "composed" in messages[-1].text.split("Current sub-goal:")[1].splitlines()[0]:
            raise RuntimeError("CUDA out of memory")
        return said("Christopher Nolan")

    roles = models(plan=[json.dumps(plan)])
    roles["analysis"] = FakeChatModel(respond=analysis)
    out = run(store, roles)
    assert [s["n"] for s in out["steps"]] == [1, 2] and out["steps"][0]["answer"] == "Christopher Nolan"
    assert out["steps"][1]["halted"] and out["error"].startswith("ModelError: analysis")
    assert out["answer"] == "Christopher Nolan" and roles["answer"].calls == []


def test_merge_steps_creates_and_updates_attempts_by_number():
    steps = merge_steps([], [{"n": 2, "subgoal": "b"}, {"n": 1, "subgoal": "a", "attempt": {"i": 0, "query": "a"}}])
    steps = merge_steps(steps, [{"n": 1, "attempt": {"i": 0, "k": 5}}, {"n": 1, "attempt": {"i": 1, "query": "a2"}}])
    assert [s["n"] for s in steps] == [1, 2] and steps[1]["attempts"] == []
    assert [(a["query"], a["k"]) for a in steps[0]["attempts"]] == [("a", 5), ("a2", 0)]
    assert merge_steps(steps, None) == []


# -- the compiled graph and bad plans -------------------------------------------------------
def test_build_returns_a_compiled_graph_with_its_recursion_limit(store):
    graph = build()
    assert isinstance(graph, CompiledStateGraph) and graph.config["recursion_limit"] == RECURSION_LIMIT
    chain = {"subgoals": ["Who directed Inception?"] + [f"Where did [Answer{i}] live in {1900 + i}?"
                                                        for i in range(1, 12)]}
    roles = models(plan=[json.dumps(chain)], analysis=[said("", False)], answer=["London"])
    out = graph.invoke({"question": QUESTION}, {"configurable": {"thread_id": "x"}},
                       context=context(store, roles, max_rounds=12, max_rewrites=2))
    assert len(out["steps"]) == 12 and all(len(s["attempts"]) == 3 for s in out["steps"])  # > 100 graph steps


@pytest.mark.parametrize("subgoals, kept, notes", [
    ([f"Who is person {i}?" for i in range(50)], 3, ["warning: plan has 50 sub-goals; kept the first 3"]),
    (["", "   ", "Who directed Inception?", {"question": ""}], 1, []),
    (["Who directed [Answer1]?", "Where was [Answer2] born?"], 2,
     ["warning: sub-goal 1: placeholder [Answer1]: step 1 is not an earlier step; left as written",
      "warning: sub-goal 2: placeholder [Answer2]: step 2 is not an earlier step; left as written"]),
    (["Who directed [Answer2]?", "Who composed the score of [Answer1]?"], 2,
     ["warning: sub-goal 1: placeholder [Answer2]: step 2 is not an earlier step; left as written"]),
])
def test_malformed_plans_are_repaired_within_the_caps(store, subgoals, kept, notes):
    roles = models(plan=[json.dumps({"subgoals": subgoals})], analysis=[said("Christopher Nolan")],
                   answer=["Christopher Nolan"])
    out = run(store, roles, max_rounds=3)
    assert len(out["plan"]) == len(out["steps"]) == kept and out["answer"] == "Christopher Nolan"
    assert out["notes"] == notes and out["error"] is None


@pytest.mark.parametrize("reply", ['{"subgoals": ["", "  "]}', '{"subgoals": [{"question": null}]}'])
def test_a_plan_with_only_empty_subgoals_is_a_typed_error(store, reply):
    roles = models(plan=[reply], analysis=[said("Christopher Nolan")], answer=["Christopher Nolan"])
    out = run(store, roles)
    assert out["plan"] == [QUESTION] and out["error"].startswith("MalformedOutput: the plan has no sub-goals")
    assert len(roles["plan"].calls) == 2


# -- answers that are not answers ------------------------------------------------------------
@pytest.mark.parametrize("text", ["unknown", "Unknown.", "N/A", "None", "not found", "Not mentioned",
                                  "insufficient information", "I don't know", "?", "",
                                  "The passages do not mention who directed the film.",
                                  "The provided passages don't explicitly state his birthplace.",
                                  "There is no information about the director.", "It cannot be determined.",
                                  "The birthplace is unknown.", "None of the passages name the composer.",
                                  "The context lacks details about the director."])
def test_refusals_are_recognised(text):
    assert is_no_answer(text)


@pytest.mark.parametrize("text", ["Christopher Nolan", "Never Say Never", "No Country for Old Men",
                                  "Not Fade Away", "no", "yes", "Nothing Compares 2 U", "1970",
                                  "The Unknown Soldier"])
def test_answers_are_not_taken_for_refusals(text):
    assert not is_no_answer(text)


def test_short_answers_must_appear_in_a_passage():
    passages = ["Christopher Nolan: born in London on 30 July 1970.", "Inception: a 2010 film."]
    assert grounded("Christopher Nolan", passages) and grounded("July 30, 1970", passages)
    assert grounded("yes", passages) and grounded("the city where a long answer was composed by the model", [])
    assert not grounded("Steven Spielberg", passages) and not grounded("Nolan, 2010", passages)


def test_an_empty_analysis_answer_is_insufficient_without_a_flag():
    from mhqa_graph.graphs.opera.analysis import check_analysis

    assert check_analysis({"answer": ""}) == {"reasoning": "", "sufficient": False, "answer": "", "flag": None}
    assert check_analysis({"answer": "London"})["flag"] == "no sufficiency given"


def test_a_relation_plan_asks_each_subgoal_as_its_relation_of_its_entity_with_placeholders_kept():
    P = opera_prompts
    plan = check_plan({"subgoals": [{"entity": "Inception", "relation": "director"},
                                    {"entity": "[Answer1]", "relation": "place of birth"}]})
    assert plan == ["What is the director of Inception?", "What is the place of birth of [Answer1]?"]
    assert dependencies(plan) == [[], [1]]
    fmt = P.plan_format(3, ["Inception"], ask_as="relation")
    entity = fmt.schema["properties"]["subgoals"]["items"]["properties"]["entity"]
    assert entity["enum"] == ["Inception", "[Answer1]", "[Answer2]"]
    assert P.plan_system("relation") == P.RELATION_PLAN_SYSTEM and P.plan_system("question") == P.PLAN_SYSTEM


def test_with_ask_as_relation_the_plan_agent_writes_relations_and_the_second_hop_searches_the_first_answer(store):
    plan = json.dumps({"subgoals": [{"entity": "Inception", "relation": "director"},
                                    {"entity": "[Answer1]", "relation": "place of birth"}]})
    roles = models(plan=[plan])
    out = run(store, roles, ask_as="relation")
    assert out["answer"] == "London"
    assert roles["plan"].calls[0][0].text == opera_prompts.RELATION_PLAN_SYSTEM
    assert out["steps"][1]["query"] == "What is the place of birth of Christopher Nolan?"
