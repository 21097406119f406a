"""Guards as a layer: named, switchable (`guards`), loggable (`guard_mode`), recorded in every design's
output and trace, summarised by eval health, and never able to stop a run."""

from __future__ import annotations

import json

import pytest
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs import guards as G
from mhqa_graph.graphs.mujica.plan import repair_plan
from mhqa_graph.graphs.opera import guard_rules as opera_guard_rules

from mhqa_graph.errors import InvalidInput
from mhqa_graph.eval.health import guard_health, health_summary
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.traces import TraceRecorder

Q = "Who is the father of the director of Inception?"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('guards')}/s?embedder=hash")
    s.add_triples("films", [("Inception", "directed by", "Christopher Nolan"),
                            ("Christopher Nolan", "father", "Brendan Nolan")])
    yield s
    s.close()


def call(name: str, **args) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def omne(store, **settings):
    """Omne answering one hop short, then (if sent back) the right answer."""
    model = FakeChatModel(responses=[call("node_info", entity="Inception"), "<answer>Christopher Nolan</answer>",
                                     call("node_info", entity="Christopher Nolan"), "<answer>Brendan Nolan</answer>"],
                          cycle=False)
    context = make_context("omne", llm=model, store=store, graph="films", **settings)
    recorder = TraceRecorder("omne", context)
    out = build_graph("omne").invoke({"question": Q}, context=context, config={"callbacks": [recorder]})
    return out, model, recorder.trace(out)


def test_every_guard_is_named_with_its_stage_and_agents():
    assert len(G.GUARDS) == 19
    # off by default where the ablation did not justify them; answer-replacing guards are on by default only
    # where it showed they paid (Mujica's option guards)
    off = set(G.GUARDS) - G.defaults("opera") - G.defaults("mujica") - G.defaults("omne")
    assert off == {"no_answer_fallback", "unknown_contexts", "plan_off_topic", "short_answer_reask", "plan_unanchored",
                   "conclusion_bridge", "conclusion_ungrounded"}
    assert {"date_comparison", "option_answer"} <= G.defaults("mujica") - G.defaults("opera")
    assert {g.stage for g in G.GUARDS.values()} == {"plan", "analysis", "worker answer", "conclusion", "tool answer"}
    assert [n for n, g in G.GUARDS.items() if "omne" in g.agents] == ["send_back_ungrounded", "send_back_one_hop"]
    assert {n for n, g in G.GUARDS.items() if g.replaces_answer} == {"no_answer_fallback", "date_comparison",
                                                                     "option_answer"}


@pytest.mark.parametrize("settings, message", [
    ({"guards": "unecho,send_back_oops"}, "unknown guard\\(s\\) 'send_back_oops'"),
    ({"guard_mode": "dry-run"}, "guard_mode must be one of enforce, log"),
    ({"guards": 3}, "guards must be 'auto', 'none' or a list"),
    ({"guards": "unecho,-option_answer"}, "not both"),
    ({"guards": "+unecho,option_answer"}, "not both"),
    ({"guards": "--unecho"}, "unknown guard"),
])
def test_guard_settings_are_checked(settings, message):
    with pytest.raises(InvalidInput, match=message):
        make_context("omne", llm="fake", **settings)


def test_a_guard_can_be_left_out_of_the_default_set():
    assert G.selected("-unecho,-options_line") == G.defaults() - {"unecho", "options_line"}
    assert G.selected("+date_comparison,-unecho", "opera") == G.defaults("opera") | {"date_comparison"}
    assert G.selected(["unecho"]) == {"unecho"} and G.selected("none") == set()
    assert G.selected("-unecho,-unecho") == G.defaults() - {"unecho"}


def test_an_enforced_send_back_is_recorded(store):
    out, model, trace = omne(store)
    assert out["answer"] == "Brendan Nolan" and len(model.calls) == 4
    assert out["guards"] == [{"guard": "send_back_one_hop", "stage": "tool answer", "before": "Christopher Nolan",
                              "after": "sent back with the facts of Christopher Nolan", "enforced": True,
                              "prompt_only": False, "replaces_answer": False}]
    assert trace.design["guards"] == out["guards"]


def test_a_logged_send_back_changes_nothing(store):
    out, model, _ = omne(store, guard_mode="log")
    assert out["answer"] == "Christopher Nolan" and len(model.calls) == 2
    assert [(f["guard"], f["enforced"]) for f in out["guards"]] == [("send_back_one_hop", False)]


@pytest.mark.parametrize("guards", ["none", "send_back_ungrounded"])
def test_a_guard_switched_off_neither_acts_nor_records(store, guards):
    out, model, _ = omne(store, guards=guards)
    assert out["answer"] == "Christopher Nolan" and len(model.calls) == 2 and out["guards"] == []


def test_a_guard_that_raises_is_recorded_and_skipped(monkeypatch, tmp_path):
    """OPERA's grounding check broken: the run goes on as if the guard had not fired, and says why."""
    def broken(answer, passages):
        raise RuntimeError("boom")

    monkeypatch.setattr(opera_guard_rules, "grounded", broken)
    s = open_store(f"embedded://{tmp_path}/s?embedder=hash")
    s.add_triples("films", [("Inception", "directed by", "Christopher Nolan")])
    roles = {"plan": FakeChatModel(responses=['{"subgoals": ["Who directed Inception?"]}']),
             "analysis": FakeChatModel(responses=['{"sufficient": true, "answer": "Christopher Nolan"}']),
             "rewrite": FakeChatModel(responses=['{"query": "x"}']),
             "answer": FakeChatModel(responses=["Christopher Nolan"])}
    out = build_graph("opera").invoke({"question": "Who directed Inception?"},
                                      context=make_context("opera", role_llms=roles, store=s, graph="films"))
    assert out["answer"] == "Christopher Nolan" and out["steps"][0]["sufficient"]
    assert out["guards"] == [{"guard": "analysis_grounded", "stage": "analysis",
                              "before": "Christopher Nolan (sufficient: True)", "after": None,
                              "enforced": False, "prompt_only": False, "replaces_answer": False,
                              "error": "RuntimeError: boom", "at": "sub-goal 1, attempt 1"}]
    s.close()


def test_plan_guards_switch_off_one_at_a_time():
    question = 'The band who released the debut album "Tinted Windows" had their first performance in what city?'
    items = [{"id": "q1", "question": "Who directed Inception?", "depends_on": []},
             {"id": "q2", "question": "Which band released the album Tinted Windows?", "depends_on": []}]
    log: list[dict] = []
    on = make_context("mujica", llm="fake", corpus="docs", guards="+plan_off_topic")  # off by default: it did not pay
    kept, _ = repair_plan(items, [], 12, 1, about=question, ctx=on, log=log)
    assert [q["id"] for q in kept] == ["q2"] and [f["guard"] for f in log] == ["plan_off_topic"]
    off = make_context("mujica", llm="fake", corpus="docs", guards="plan_made_up_entity,plan_example_copy")
    log = []
    kept, _ = repair_plan(items, [], 12, 1, about=question, ctx=off, log=log)
    # with the topic guard off, the example guard catches the copy: the layers are independent
    assert [q["id"] for q in kept] == ["q2"] and [f["guard"] for f in log] == ["plan_example_copy"]
    log = []
    kept, _ = repair_plan(items, [], 12, 1, about=question,
                          ctx=make_context("mujica", llm="fake", corpus="docs", guards="none"), log=log)
    assert [q["id"] for q in kept] == ["q1", "q2"] and log == []


def test_health_counts_guards_and_answer_replacements():
    firings = [G.firing(G.DATE_COMPARISON, "Heat", "Spione", True), G.firing(G.UNECHO, "q1: x", "x", False)]
    assert guard_health(firings) == {"guards": {"date_comparison": 1, "unecho": 1}, "guard_changed": True,
                                     "answer_guard": True}
    assert guard_health([G.firing(G.UNECHO, "a", "b", False)])["guard_changed"] is False
    rows = [{**guard_health(firings), "constrained": 3}, {**guard_health([]), "constrained": 2}]
    summary = health_summary(rows)
    assert (summary["guard_changed"], summary["answer_guard"], summary["constrained"]) == (1, 1, 5)
    assert summary["guards"] == {"date_comparison": 1, "unecho": 1}


def test_log_mode_follows_the_path_of_a_guard_that_is_off():
    """In log mode a chain of guards stops at the first that fires, as in enforce mode, and changes nothing."""
    from mhqa_graph.graphs.opera.analysis import check_analysis

    reply = {"sufficient": True, "answer": "unknown"}
    for mode, firings, answer in (("enforce", ["analysis_refusal"], ""), ("log", ["analysis_refusal"], "unknown")):
        log: list[dict] = []
        on = make_context("opera", llm="fake", corpus="docs", guards="+analysis_refusal", guard_mode=mode)
        out = check_analysis(reply, ["a passage about films"], on, log)
        assert [f["guard"] for f in log] == firings and out["answer"] == answer
    off = check_analysis(reply, ["a passage about films"],
                         make_context("opera", llm="fake", corpus="docs", guards="none"), [])
    logged = make_context("opera", llm="fake", corpus="docs", guards="+analysis_refusal", guard_mode="log")
    assert off == check_analysis(reply, ["a passage about films"], logged, [])


def test_a_plan_at_the_grammar_cap_that_repeats_itself_is_cut(store):
    """Under a grammar a runaway plan is not cut off by the token limit: it stops at max_rounds items."""
    chain = ["Who directed Inception?"] + [f"Who is the father of [Answer{i}]?" for i in range(1, 4)]
    roles = {"plan": FakeChatModel(responses=[json.dumps({"subgoals": chain})]),
             "analysis": FakeChatModel(responses=['{"sufficient": true, "answer": "Christopher Nolan"}']),
             "rewrite": FakeChatModel(responses=['{"query": "x"}']), "answer": FakeChatModel(responses=["x"])}
    out = build_graph("opera").invoke({"question": Q}, context=make_context(
        "opera", role_llms=roles, store=store, graph="films", max_rounds=4))
    assert out["plan"] == chain[:3]
    assert [(f["guard"], f["enforced"]) for f in out["guards"]] == [("plan_runaway_cut", True)]


def test_eval_summaries_show_the_guards():
    from mhqa_graph.eval.report import summarize, summary_table

    records = [{"id": str(i), "em": 1.0, "f1": 1.0, "latency": 1.0, "llm_calls": 2, "tokens": {"total": 10},
                "health": {**guard_health(f), "constrained": 2}} for i, f in
               enumerate([[G.firing(G.DATE_COMPARISON, "Heat", "Spione", True)], []])]
    caption = summary_table(summarize(records, agent="opera")).caption
    assert "guards fired: date_comparison 1 (changed 1 runs, replaced 1 answers); 4 constrained model calls" in caption


def test_the_designs_hold_guards_as_objects_not_names():
    """A guard is named by string only in the guard layer: elsewhere a misspelt name would be a guard silently off;
    as an object (the constants of graphs/guards/) it fails at import."""
    import re
    from pathlib import Path

    names = "|".join(G.GUARDS)
    quoted = re.compile(rf"[\"']({names})[\"']")
    layer = Path("graphs/guards/__init__.py")
    found = [f"{p}: {m.group(0)}" for p in sorted(Path("graphs").rglob("*.py")) if p != layer
             for m in quoted.finditer(p.read_text())]
    assert found == []
    with pytest.raises(AttributeError):
        G.is_on(None, "unecho")  # a name where a guard belongs fails at once


@pytest.mark.parametrize("mode", ["enforce", "log"])
def test_the_first_rule_that_fires_ends_the_chain_in_either_mode(mode):
    """A chain of rules: the first that fires is logged and ends it (in log mode too, so both modes take one path);
    a rule that raises is logged with its error and ends it; the guard returned is the one that acts."""
    ctx = make_context("mujica", llm="fake", corpus="docs", guard_mode=mode)
    tested: list[str] = []

    def rule(guard, fires):
        def test():
            tested.append(guard.name)
            if fires == "raise":
                raise RuntimeError("broken")
            return fires
        return G.Rule(guard, test, "before", "after")

    log: list[dict] = []
    acted = G.first_that_fires(ctx, [rule(G.UNECHO, False), rule(G.PLAN_MADE_UP_ENTITY, True),
                                     rule(G.PLAN_EXAMPLE_COPY, True)], log)
    assert tested == ["unecho", "plan_made_up_entity"] and [f["guard"] for f in log] == ["plan_made_up_entity"]
    assert acted is (G.PLAN_MADE_UP_ENTITY if mode == "enforce" else None)
    log, tested[:] = [], []
    assert G.first_that_fires(ctx, [rule(G.UNECHO, "raise"), rule(G.PLAN_EXAMPLE_COPY, True)], log) is None
    assert tested == ["unecho"] and log[0]["error"] == "RuntimeError: broken"
    assert G.first_that_fires(ctx, [rule(G.PLAN_OFF_TOPIC, True)], []) is None  # off by default: never tested
