"""Malformed model output, fuzzed: every agent, every role, replies that are garbage forever.

Each case scripts the roles of one agent with FakeChatModels that keep replying the same bad
output (cycle=True). Whatever they say, the run must return, stay within the model-call budget its
context caps allow, give a str answer of at most MAX_ANSWER_CHARS, and record a typed error
("SomeType: ...") whenever it could not use the output.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.settings import MAX_ANSWER_CHARS

from mhqa_graph.parsing import extract_json
from mhqa_graph.store import open_store
from mhqa_graph.testing.conformance import PASSAGES, TRIPLES
from mhqa_graph.testing.fakes import FakeChatModel

AGENTS = ("opera", "mujica", "omne", "rag", "direct")
ROLES = {"opera": ("plan", "analysis", "rewrite", "answer"), "mujica": ("planner", "worker"),
         "omne": ("tool-agent",), "rag": ("answer",), "direct": ("answer",)}
CAPS = {"max_rounds": 3, "max_rewrites": 1, "parse_retries": 1, "top_k": 3}
AGENT_CAPS = {"mujica": {"max_subquestions": 4}, "omne": {"max_calls_per_round": 5}}
QUESTION = "Where was the father of the director of Polish-Russian War born?"
TYPED = re.compile(r"^[A-Z][A-Za-z]+: \S")
TIMEOUT_S = 30
HUGE = 50_000

# Usable replies, one per role: what the other roles say while one role is fuzzed.
VALID = {
    "plan": ['{"subgoals": ["Who directed Polish-Russian War?", "Who is the father of [Answer1]?"]}'],
    "analysis": ['{"reasoning": "p1 says so.", "sufficient": true, "answer": "Xawery Żuławski"}'],
    "rewrite": ['{"query": "Polish-Russian War director"}'],
    "answer": ["<answer>Lviv</answer>"],
    "planner": ['{"subquestions": [{"id": "q1", "question": "Who directed Polish-Russian War?", "depends_on": []}]}',
                '{"answer": "Lviv"}'],
    "worker": ['{"relevant": [1], "answer": "Xawery Żuławski"}'],
    "tool-agent": ['<tool_call>{"name": "entity_matcher", "arguments": {"query": "Polish-Russian War"}}</tool_call>',
                   "<answer>Lviv</answer>"],
}


def js(value: object) -> str:
    return json.dumps(value)


# -- the corpus ------------------------------------------------------------------------------
# Garbage any role may reply: (family, reply, unusable by the JSON/tool agents, unusable by all agents)
GENERIC: list[tuple[str, str, bool, bool]] = [
    ("empty", "", True, True),
    ("whitespace", " \n\t  \n", True, True),
    ("control-only", "\x00\x01\x02\x7f\x1b", True, True),
    ("unclosed-think", "<think>I will now reason at length", True, True),
    ("only-think", "<think>nothing to say</think>", True, True),
    ("empty-answer-tag", "<answer></answer>", True, True),
    ("prose", "I am not sure, sorry.", True, False),
    ("truncated-object", '{"subgoals": ["Who dire', True, False),
    ("truncated-fence", '```json\n{"answer": "Lv', True, False),
    ("wrong-keys", '{"foo": 1, "bar": [2, 3]}', True, False),
    ("empty-object", "{}", True, False),
    ("empty-list", "[]", True, False),
    ("null", "null", True, False),
    ("number", "42", True, False),
    ("bool", "true", True, False),
    ("nan", '{"answer": NaN, "sufficient": Infinity}', False, False),
    ("deep-nesting", "[" * 2000 + "]" * 2000, True, False),
    ("unbalanced", "}}}]]]{{{[[[", True, False),
    ("huge-text", "x" * HUGE, True, False),
    ("huge-json-string", js({"x": "y" * HUGE}), True, False),
    ("control-chars", "\x00\x01\x1b[31mred\x1b[0m\x7f\x08", True, False),
    ("surrogate-escape", '{"foo": "\\ud800\\udfff"}', True, False),
    ("mixed-scripts", "مرحبا 東京 \u202eevil\u202c 👍🏽", True, False),
]


def truncations(text: str) -> list[str]:
    return [text[:n] for n in sorted({1, 5, len(text) // 2, len(text) - 1}) if 0 < n < len(text)]


# Structured garbage for one role: (family, role, replies)
many = [f"Sub-question number {i}?" for i in range(5000)]
STRUCTURED: list[tuple[str, str, list[str]]] = [
    # OPERA
    ("empty-plan", "plan", [js({"subgoals": []})]),
    ("plan-not-list", "plan", [js({"subgoals": "first this, then that"})]),
    ("plan-item-types", "plan", [js({"subgoals": [1, None, {"x": 2}, ["a"], 3.5]})]),
    ("missing-placeholders", "plan", [js({"subgoals": ["Who is [Answer7]?", "Where is [entity from step 99]?",
                                                       "[#0] and [Answer 0]"]})]),
    ("self-placeholder", "plan", [js({"subgoals": ["What is [Answer1]?"]})]),
    ("placeholder-cycle", "plan", [js({"subgoals": ["Who is [Answer2]?", "Who is [Answer1]?"]})]),
    ("huge-plan", "plan", [js({"subgoals": many})]),
    ("huge-subgoal", "plan", [js({"subgoals": ["w " * HUGE]})]),
    ("analysis-types", "analysis", [js({"sufficient": "maybe", "answer": ["a", "b"]})]),
    ("analysis-huge", "analysis", [js({"sufficient": True, "answer": "A" * HUGE})]),
    ("analysis-no-answer", "analysis", [js({"status": "no"})]),
    ("analysis-never-sufficient", "analysis", [js({"sufficient": False, "answer": ""})]),
    ("analysis-nested", "analysis", [js({"sufficient": 1e308, "answer": {"nested": [1, {"x": None}]}})]),
    ("rewrite-number", "rewrite", [js({"query": 5})]),
    ("rewrite-empty", "rewrite", [js({"query": ""})]),
    ("rewrite-surrogate", "rewrite", ['{"query": "\\ud800 Lviv \\udfff"}']),
    ("rewrite-huge", "rewrite", [js({"query": "q " * HUGE})]),
    ("rewrite-operators", "rewrite", [js({"query": 'NEAR(a b) AND title: "x* ^y OR NOT'})]),
    ("answer-huge", "answer", ["A" * HUGE]),
    ("answer-null", "answer", [js({"answer": None})]),
    # Mujica
    ("dag-cycle", "planner", [js({"subquestions": [
        {"id": "q1", "question": "Who is #q2?", "depends_on": ["q2"]},
        {"id": "q2", "question": "Who is #q1?", "depends_on": ["q1"]}]})]),
    ("dag-long-cycle", "planner", [js({"subquestions": [
        {"id": f"q{i}", "question": f"Step {i}?", "depends_on": [f"q{i % 4 + 1}"]} for i in range(1, 5)]})]),
    ("dag-self-dependency", "planner", [js({"subquestions": [{"id": "q1", "question": "Who is #q1?",
                                                              "depends_on": ["q1"]}]})]),
    ("dag-dangling", "planner", [js({"subquestions": [{"id": "q1", "question": "Who?", "depends_on": ["q9"]}]})]),
    ("dag-missing-citation", "planner", [js({"subquestions": [{"id": "q1", "question": "Where was #q7 born?",
                                                               "depends_on": []}]})]),
    ("dag-duplicate-ids", "planner", [js({"subquestions": [{"id": "q1", "question": "A?"},
                                                           {"id": "q1", "question": "B?"}]})]),
    ("dag-huge", "planner", [js({"subquestions": [{"id": f"q{i}", "question": q} for i, q in enumerate(many)]})]),
    ("dag-field-types", "planner", [js({"subquestions": [{"id": ["x"], "question": 5, "depends_on": 7},
                                                         {"id": {"a": 1}, "question": "Ok?", "depends_on": {"q": 1}},
                                                         None, 3]})]),
    ("dag-empty", "planner", [js({"subquestions": []})]),
    ("planner-answer-object", "planner", [js({"answer": {"x": 1}})]),
    ("planner-answer-empty", "planner", [js({"answer": "  "})]),
    ("planner-answer-huge", "planner", [js({"answer": "P" * HUGE})]),
    ("worker-types", "worker", [js({"relevant": "all", "answer": 5})]),
    ("worker-bad-numbers", "worker", [js({"relevant": [1e308, -1, "x", None, [2]], "answer": "y"})]),
    ("worker-null-answer", "worker", [js({"answer": None})]),
    ("worker-huge", "worker", [js({"relevant": [1], "answer": "W" * HUGE})]),
    # Omne
    ("unknown-tool", "tool-agent", ['<tool_call>{"name": "drop_database", "arguments": {"query": "x"}}</tool_call>']),
    ("arg-number", "tool-agent", ['<tool_call>{"name": "entity_matcher", "arguments": {"query": 5}}</tool_call>']),
    ("arg-list", "tool-agent", ['<tool_call>{"name": "node_info", "arguments": {"entity": ["a", "b"]}}</tool_call>']),
    ("arg-graph-type", "tool-agent", ['<tool_call>{"name": "node_info", "arguments": '
                                      '{"entity": "Poland", "graph_type": 7}}</tool_call>']),
    ("arg-unknown-graph", "tool-agent", ['<tool_call>{"name": "node_info", "arguments": '
                                         '{"entity": "Poland", "graph_type": "nope"}}</tool_call>']),
    ("args-string", "tool-agent", ['<tool_call>{"name": "node_info", "arguments": "not json"}</tool_call>']),
    ("args-list", "tool-agent", ['<tool_call>{"name": "node_info", "arguments": [1, 2]}</tool_call>']),
    ("name-list", "tool-agent", ['<tool_call>{"name": ["node_info"], "arguments": {}}</tool_call>']),
    ("repeated-call", "tool-agent", ['<tool_call>{"name": "node_info", "arguments": {"entity": "Poland"}}'
                                     '</tool_call>']),
    ("call-flood", "tool-agent", ["".join(f'<tool_call>{{"name": "entity_matcher", "arguments": {{"query": "w{i}"}}}}'
                                          "</tool_call>" for i in range(100))]),
    ("unclosed-call", "tool-agent", ['<tool_call>{"name": "entity_matcher", "arguments": {"query": "Pol']),
    ("call-garbage", "tool-agent", ["<tool_call>}}{{ not json ]]</tool_call>"]),
    ("call-surrogate", "tool-agent", ['<tool_call>{"name": "node_info", "arguments": {"entity": "\\ud800"}}'
                                      '</tool_call>']),
    ("call-nul", "tool-agent", ['<tool_call>{"name": "entity_matcher", "arguments": {"query": "\\u0000a\\u0000"}}'
                                "</tool_call>"]),
    ("call-huge-arg", "tool-agent", [js({"name": "entity_matcher", "arguments": {"query": "z " * HUGE}})]),
    ("answer-tag-huge", "tool-agent", ["<answer>" + "A" * HUGE + "</answer>"]),
    # rag / direct
    ("answer-tag-control", "answer", ["<answer>\x00\x01</answer>"]),
    ("answer-tag-unclosed", "answer", ["<answer>" + "B" * HUGE]),
]


@dataclass
class Case:
    id: str
    agent: str
    scripts: dict[str, list[str]]
    unusable: bool = False  # the run cannot use any reply: it must record a typed error
    overrides: dict = field(default_factory=dict)


def generate() -> list[Case]:
    cases = []
    for agent in AGENTS:
        roles = ROLES[agent]
        structured_agent = agent in ("opera", "mujica", "omne")
        for family, reply, unusable_structured, unusable_all in GENERIC:
            cases.append(Case(f"{agent}-all-{family}", agent, {r: [reply] for r in roles},
                              unusable_all or (structured_agent and unusable_structured)))
        for family, role, replies in STRUCTURED:
            if role in roles:
                cases.append(Case(f"{agent}-{role}-{family}", agent, {role: replies}))
        for role in roles:  # every valid reply of the role, cut short
            for reply in VALID[role]:
                for i, cut in enumerate(truncations(reply)):
                    cases.append(Case(f"{agent}-{role}-truncated-{len(cases)}-{i}", agent, {role: [cut]}))
    cases += [Case("opera-graph-source-huge-plan", "opera", {"plan": [js({"subgoals": many})]},
                   overrides={"corpus": None}),
              Case("mujica-graph-source-cycle", "mujica", {"planner": [js({"subquestions": [
                  {"id": "a", "question": "#b?", "depends_on": ["b"]}, {"id": "b", "question": "#a?"}]})]},
                   overrides={"corpus": None}),
              Case("rag-graph-source-garbage", "rag", {"answer": ["}}}{{{"]}, overrides={"corpus": None})]
    return cases


CASES = generate()


def test_the_corpus_is_large_and_covers_every_agent():
    assert len(CASES) >= 200
    assert {c.agent for c in CASES} == set(AGENTS)
    assert len({c.id for c in CASES}) == len(CASES)


def call_budget(agent: str, ctx) -> int:
    """The most model calls a run may make under the context's caps."""
    tries = ctx.parse_retries + 1
    if agent == "opera":  # plan, then per sub-goal: analyses with rewrites in between, then synthesis
        return tries + ctx.max_rounds * ((ctx.max_rewrites + 1) * tries + ctx.max_rewrites) + 1
    if agent == "mujica":  # planner rounds (and one short-answer re-ask) + one worker per sub-question
        return (ctx.max_rounds + ctx.max_subquestions) * tries + 1
    if agent == "omne":  # agent turns + the forced final answer
        return ctx.max_rounds + 1
    return tries  # rag, direct: one answer, repaired at most parse_retries times


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(f"embedded://{tmp_path_factory.mktemp('fuzz')}/s?embedder=hash")
    s.add_triples("kg", TRIPLES)
    s.add_passages("docs", PASSAGES)
    stats = s.stats()
    yield s
    assert s.stats() == stats  # no garbage wrote to the store
    s.close()


GRAPHS = {agent: build_graph(agent) for agent in AGENTS}


def run_case(case: Case, store) -> tuple[dict, int, object]:
    fakes = {role: FakeChatModel(responses=case.scripts.get(role, VALID[role]), cycle=True)
             for role in ROLES[case.agent]}
    settings = {**CAPS, **AGENT_CAPS.get(case.agent, {}), "corpus": "docs", "graph": "kg", **case.overrides}
    ctx = make_context(case.agent, role_llms=fakes, llm=FakeChatModel(responses=["<answer>unused</answer>"]),
                       store=store, **settings)
    with ThreadPoolExecutor(1) as pool:  # a hang fails the test instead of stalling the suite
        out = pool.submit(GRAPHS[case.agent].invoke, {"question": QUESTION}, context=ctx).result(timeout=TIMEOUT_S)
    return out, sum(len(f.calls) for f in fakes.values()), ctx


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_garbage_output_ends_cleanly(case: Case, store):
    out, calls, ctx = run_case(case, store)
    answer, error = out["answer"], out.get("error")
    assert isinstance(answer, str) and len(answer) <= MAX_ANSWER_CHARS
    assert calls <= call_budget(case.agent, ctx), f"{calls} model calls"
    assert error is None or (isinstance(error, str) and TYPED.match(error)), error
    if case.unusable or not answer:
        assert isinstance(error, str) and TYPED.match(error), f"unusable output but error={error!r}"
    if case.agent == "opera":
        assert len(out["steps"]) <= ctx.max_rounds
        assert all(len(s["attempts"]) <= ctx.max_rewrites + 1 for s in out["steps"])
    elif case.agent == "mujica":
        assert out["rounds"] <= ctx.max_rounds and len(out["dag"]) <= ctx.max_subquestions
        assert all(TYPED.match(n) for n in out["notes"])
    elif case.agent == "omne":
        assert out["rounds"] <= ctx.max_rounds
        assert len(out["tool_calls"]) <= ctx.max_rounds * 100


@pytest.mark.parametrize("soup", ["{" * 20_000, "[" * 10_000 + "]" * 10_000, '{"a": 1' * 3000])
def test_bracket_soup_parses_quickly(soup: str):
    """A reply of unclosed or deeply nested brackets costs bounded parse time, not quadratic."""
    start = time.perf_counter()
    assert extract_json(soup) is None
    assert time.perf_counter() - start < 2.0
