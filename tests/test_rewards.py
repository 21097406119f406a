"""Reward functions on hand-made completions: Omne's format gate and repetition penalty, the OPERA role
rewards against gold chains (one-step plans, hop-1 gold, NDCG), MyGO's threshold."""

from __future__ import annotations

import json
import math

import pytest
from mhqa_graph.training.rewards import (
    AnalysisGold,
    AnalysisRewardConfig,
    MyGORewardConfig,
    OmneRewardConfig,
    PlanRewardConfig,
    RewriteRewardConfig,
    analysis_gold,
    analysis_reward,
    chain_links,
    evidence_ndcg,
    final_answer,
    format_reward,
    keep,
    ndcg,
    next_tau,
    omne_reward,
    plan_logic,
    plan_reward,
    plan_structure,
    repetition_penalty,
    result_reward,
    rewrite_reward,
    tool_calls,
)

from mhqa_graph.ingest.datasets import Hop

CALL = '<tool_call>{"name": "node_info", "arguments": {"entity": "Inception", "graph_type": "kg"}}</tool_call>'
MATCH = '<tool_call>{"name": "entity_matcher", "arguments": {"query": "Inception", "graph_type": "kg"}}</tool_call>'
GOOD = [f"<think>Find the film.</think>{MATCH}", f"<think>Now its director.</think>\n{CALL}",
        "<think>Nolan directed it.</think><answer>Christopher Nolan</answer>"]


@pytest.mark.parametrize("completion", [
    GOOD,
    "<think>I know this.</think><answer>Christopher Nolan</answer>",
    [f"<think>two calls</think>{MATCH}\n{CALL}", "<think>so</think>\n<answer>x</answer>\n"],
])
def test_well_formed_completions(completion):
    assert format_reward(completion) == 1


@pytest.mark.parametrize("completion", [
    [MATCH, "<think>a</think><answer>Christopher Nolan</answer>"],  # a tool call without reasoning before it
    [f"<think>a</think>{MATCH}", "<answer>x</answer>"],  # an answer turn without reasoning
    "<answer>Christopher Nolan</answer>",
    [f"<think> </think>{MATCH}", "<think>a</think><answer>x</answer>"],  # empty reasoning
    [f"{MATCH}<think>late</think>", "<think>a</think><answer>x</answer>"],  # reasoning after the call
    ['<think>a</think><tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', "<answer>x</answer>"],
    ['<think>a</think><tool_call>{"name": "node_info", "arguments": {"entity": "x"</tool_call>', "<answer>x</answer>"],
    ['<think>a</think><tool_call>{"name": "node_info", "arguments": "x"}</tool_call>', "<answer>x</answer>"],
    ["<think>a</think><tool_call>not json</tool_call>", "<answer>x</answer>"],
    [f"<think>a</think>{CALL}"],  # never answers
    [f"<think>a</think>{CALL}<answer>x</answer>"],  # a call in the answer turn
    ["<think>a</think><answer>x</answer><answer>y</answer>"],  # two answers
    [f"<think>a</think>{CALL}<answer>x</answer>", "<think>a</think><answer>x</answer>"],  # an answer too early
    ["<think>a</think><answer></answer>"],  # empty answer
    ["<think>a<answer>x</answer></think>"],  # nested
    ["<think>a</think><answer>x"],  # unclosed
    ["<think>a</think></think><answer>x</answer>"],  # stray closing tag
    ["<think>a</think><think>b</think><answer>x</answer>"],  # two reasoning blocks
    ["thinking aloud", "<think>a</think><answer>x</answer>"],  # a turn with neither call nor answer
    [],
])
def test_malformed_completions(completion):
    assert format_reward(completion) == 0


def test_an_invented_tool_response_voids_the_format():
    invented = f"<think>a</think>{CALL}\n<tool_response>\n- (Inception) -[director]-> (Nolan)\n</tool_response>"
    assert format_reward([invented, GOOD[2]]) == 0
    assert format_reward([f"<think>a <tool_response> soon</think>{CALL}", GOOD[2]]) == 0  # inside a block too
    assert format_reward([f"<think>a</think>{CALL}", GOOD[2]]) == 1


def test_an_answer_the_graph_sent_back_voids_the_format():
    """An answer Omne sent back (one hop short, or in no fact) is a turn before the last with an answer:
    R_format 0, so RL does not learn to answer early and lean on the send-back."""
    early = "<think>Found the director.</think><answer>Christopher Nolan</answer>"
    assert format_reward([GOOD[0], early, f"<think>Now his father.</think>{CALL}", GOOD[2]]) == 0
    assert format_reward([GOOD[0], f"<think>Now his father.</think>{CALL}", GOOD[2]]) == 1


def test_text_outside_the_blocks_voids_the_format():
    assert format_reward([f"<think>a</think>{CALL} Let me wait for the result.", GOOD[2]]) == 0
    assert format_reward([f"Sure! <think>a</think>{CALL}", GOOD[2]]) == 0
    assert format_reward([GOOD[0], "<think>x</think>The answer is <answer>Nolan</answer>."]) == 0
    assert format_reward([f"\n<think>a</think>\n\n{CALL}\n", GOOD[2]]) == 1  # white space is fine


def test_answering_without_a_successful_tool_call_voids_the_format():
    direct = "<think>I know this.</think><answer>Christopher Nolan</answer>"
    assert format_reward(direct, successful_calls=0) == 0
    assert omne_reward(direct, ["Christopher Nolan"], successful_calls=0) == 0.0
    assert format_reward(GOOD, successful_calls=0) == 0  # every call failed or repeated
    assert format_reward(GOOD, successful_calls=2) == 1
    assert format_reward(direct, OmneRewardConfig(require_tool=False), successful_calls=0) == 1


def test_think_off_needs_no_reasoning():
    completion = [MATCH, "<answer>Christopher Nolan</answer>"]
    assert format_reward(completion, OmneRewardConfig(think=False)) == 1
    assert format_reward([MATCH, GOOD[2]], OmneRewardConfig(think=False)) == 1


def test_omne_reward_is_gated_by_format():
    golds = ["Christopher Nolan"]
    assert result_reward("Christopher Nolan", golds) == 1.0
    assert final_answer(GOOD) == "Christopher Nolan"
    assert omne_reward(GOOD, golds) == pytest.approx(1.0)
    half = [*GOOD[:2], "<think>x</think><answer>Nolan</answer>"]
    assert result_reward("Nolan", golds) == pytest.approx(2 / 3)
    assert omne_reward(half, golds) == pytest.approx(0.1 + 0.9 * 2 / 3)
    assert omne_reward([*GOOD[:2], "<think>x</think><answer>Spielberg</answer>"], golds) == pytest.approx(0.1)
    assert omne_reward([MATCH, GOOD[2]], golds) == 0.0  # right answer, bad format
    assert omne_reward(GOOD, golds, successful_calls=2) == pytest.approx(1.0)


def test_repetition_penalty_counts_identical_calls():
    repeated = [GOOD[0], GOOD[1], f"<think>again</think>{CALL.replace('Inception', ' Inception ')}", GOOD[2]]
    calls = tool_calls(repeated)
    assert [c["name"] for c in calls] == ["entity_matcher", "node_info", "node_info"]
    assert repetition_penalty(calls, 0.2) == pytest.approx(-0.2)  # whitespace-normalised: the same call
    assert repetition_penalty(tool_calls(GOOD), 0.2) == 0.0
    assert repetition_penalty([*calls, calls[1]], 0.2) == pytest.approx(-0.4)
    golds = ["Christopher Nolan"]
    assert omne_reward(repeated, golds) == pytest.approx(1.0)  # stages 1: no penalty
    assert omne_reward(repeated, golds, OmneRewardConfig(repetition_weight=0.2)) == pytest.approx(0.8)


# 2Wiki-style gold chains: a compositional one (hop 2 starts at hop 1's answer) and a comparison
COMPOSITIONAL = (Hop(answer="Christopher Nolan", passage_ids=("p1",),
                     triples=(("Inception", "director", "Christopher Nolan"),)),
                 Hop(answer="London", passage_ids=("p2",),
                     triples=(("Christopher Nolan", "place of birth", "London"),)))
COMPARISON = (Hop(answer="2010", triples=(("Inception", "publication date", "2010"),)),
              Hop(answer="2014", triples=(("Interstellar", "publication date", "2014"),)))


def plan(*subgoals: str) -> str:
    return json.dumps({"subgoals": list(subgoals)})


def test_plan_reward_parts():
    good = plan("Who directed Inception?", "Where was [Answer1] born?")
    assert plan_reward(good, execution=1.0) == pytest.approx(1.0)
    assert plan_reward(good, execution=0.5) == pytest.approx(0.4 + 0.2 + 0.2)
    assert plan_logic(["Where was [Answer2] born?", "Who directed Inception?"]) == 0.5  # a forward reference
    forward = plan("Where was [Answer2] born?", "Who directed Inception?")
    assert plan_reward(forward, 0.0) == pytest.approx(0.4 * 0.5 + 0.2)
    assert plan_logic(["Who directed Inception?", "Who directed Inception?"]) == 0.5  # a repeat
    assert plan_logic(["Where was [Answer1] born?"]) == 0.0  # points at itself
    assert plan_reward("Who directed Inception?", execution=1.0) == pytest.approx(0.4)  # no JSON plan
    assert plan_reward('{"subgoals": []}', execution=0.0) == 0.0
    six = plan("a", "b", "c", "d", "e", "f")
    assert plan_reward(six, 0.0) == 0.0
    assert plan_reward(six, 0.0, config=PlanRewardConfig(max_subgoals=6)) == pytest.approx(0.6)
    assert plan_reward(good, execution=3.0) == pytest.approx(1.0)  # execution clipped


def test_a_one_step_plan_of_a_multi_hop_question_has_no_logic():
    one = plan("Where was the director of Inception born?")
    two = plan("Who directed Inception?", "Where was [Answer1] born?")
    assert plan_logic(["Where was the director of Inception born?"], hops=2) == 0.0
    assert plan_logic(["Where was the director of Inception born?"], hops=1) == 1.0
    # even when the restated question happens to be answered, the correct two-hop plan scores higher
    assert plan_reward(one, 1.0, COMPOSITIONAL) < plan_reward(two, 0.0, COMPOSITIONAL) + 0.4
    assert plan_reward(one, 0.0, COMPOSITIONAL) < plan_reward(two, 0.0, COMPOSITIONAL)
    assert plan_reward(one, 0.0, hops=3) == pytest.approx(0.2)  # only its structure


def test_plan_structure_against_the_gold_chain():
    assert chain_links(COMPOSITIONAL) == {(2, 1)} and chain_links(COMPARISON) == set()
    musique = (Hop(question="Who directed Inception?", answer="Christopher Nolan"),
               Hop(question="Where was #1 born?", answer="London"))
    assert chain_links(musique) == {(2, 1)}
    assert chain_links((Hop(passage_ids=("a",)), Hop(passage_ids=("b",)))) is None  # HotpotQA: no sub-answers
    assert plan_structure(["Who directed Inception?", "Where was [Answer1] born?"], COMPOSITIONAL) == 1.0
    assert plan_structure(["Who directed Inception?", "Where was Nolan born?"], COMPOSITIONAL) == 0.5  # no link
    assert plan_structure(["When was Inception out?", "When was Interstellar out?"], COMPARISON) == 1.0
    assert plan_structure(["When was Inception out?", "When was [Answer1] out?"], COMPARISON) == 0.5
    three = ["Who directed Inception?", "Who is [Answer1]?", "Where was [Answer2] born?"]
    assert plan_structure(three, COMPOSITIONAL) == pytest.approx((2 / 3 + 2 / 3) / 2)  # count 2/3, Dice 2/3
    assert plan_structure(["a", "b", "c"], (Hop(passage_ids=("a",)), Hop(passage_ids=("b",)))) == pytest.approx(2 / 3)
    assert plan_structure(["a"], ()) == 1.0
    assert plan_reward(plan(*three), 0.0, COMPOSITIONAL) == pytest.approx(0.4 + 0.2 * 2 / 3)


def shown(*facts: tuple[str, str, str]) -> str:
    """An analysis context as OPERA shows KG facts."""
    return "\n".join(f"[{i}] {s}: ({s}) -[{r}]-> ({o})" for i, (s, r, o) in enumerate(facts, start=1))


def test_hop_one_is_scored_against_its_own_gold():
    right = '{"reasoning": "p1 says so", "sufficient": true, "answer": "Christopher Nolan"}'
    final = '{"reasoning": "", "sufficient": true, "answer": "London"}'
    seen = shown(("Inception", "director", "Christopher Nolan"))
    gold = analysis_gold(1, 2, COMPOSITIONAL, ["London"], ["Inception"], seen)
    assert gold == AnalysisGold(True, ("Christopher Nolan",))
    assert analysis_reward(right, gold) == pytest.approx(1.0)  # the hop-1 answer is right at hop 1
    assert analysis_reward(final, gold) == pytest.approx(0.3 + 0.2)  # the final answer is wrong at hop 1
    last = analysis_gold(2, 2, COMPOSITIONAL, ["London"], ["Christopher Nolan"],
                         shown(("Christopher Nolan", "place of birth", "London")))
    assert analysis_reward(final, last) == pytest.approx(1.0)
    assert analysis_reward('{"sufficient": true, "answer": "Nolan"}', gold) == pytest.approx(0.3 + 0.2)  # EM, not F1


def test_sufficiency_is_whether_the_hops_evidence_was_seen():
    unsure = '{"sufficient": false, "answer": ""}'
    claims = '{"sufficient": true, "answer": "Christopher Nolan"}'
    # on a KG: the fact line names the triple's subject and object (ids are entity names, never passage ids)
    other = analysis_gold(1, 2, COMPOSITIONAL, ["London"], ["Interstellar"],
                          shown(("Interstellar", "director", "Christopher Nolan")))
    assert other.sufficient is False
    assert analysis_reward(unsure, other) == pytest.approx(0.3 + 0.2)
    assert analysis_reward(claims, other) == pytest.approx(0.2)  # right by guessing: no EM credit, claims too much
    # on passages: the hop's passage id among the retrieved ones
    assert analysis_gold(1, 2, COMPOSITIONAL, ["London"], ["p9", "p1"], "[1] a: b").sufficient is True
    assert analysis_gold(2, 2, COMPOSITIONAL, ["London"], ["p1"], "[1] a: b").sufficient is False
    assert analysis_reward('{"sufficient": "yes", "answer": "x"}', other) == 0.0  # unreadable
    assert analysis_reward("Christopher Nolan", other) == 0.0


def test_without_per_hop_gold_only_the_last_subgoal_is_scored_on_the_final_answer():
    hotpot = (Hop(passage_ids=("p1",)), Hop(passage_ids=("p2",)))  # evidence, no sub-answers
    final = '{"sufficient": true, "answer": "London"}'
    first = analysis_gold(1, 2, hotpot, ["London"], ["p1"], "")
    last = analysis_gold(2, 2, hotpot, ["London"], ["p2"], "")
    assert first == AnalysisGold(None, None) and last == AnalysisGold(None, ("London",))
    assert analysis_reward(final, first) == pytest.approx(0.2)
    assert analysis_reward(final, last) == pytest.approx(0.5 + 0.2)
    # a plan whose length differs from the chain's is not matched hop by hop either
    assert analysis_gold(1, 3, COMPOSITIONAL, ["London"], ["p1"], "") == AnalysisGold(None, None)
    assert analysis_gold(3, 3, COMPOSITIONAL, ["London"], ["p1"], "") == AnalysisGold(None, ("London",))
    config = AnalysisRewardConfig(sufficiency=0.0, accuracy=1.0, format=0.0)
    assert analysis_reward(final, last, config) == pytest.approx(1.0)


def test_rewrite_reward_is_the_root_ndcg_of_the_new_retrieval():
    query = '{"query": "Christopher Nolan birthplace"}'
    assert rewrite_reward(query, 1.0) == pytest.approx(1.0)  # perfect retrieval kept is not worth 0
    assert rewrite_reward(query, 0.25) == pytest.approx(0.8 * 0.5 + 0.2)
    assert rewrite_reward(query, 0.0) == pytest.approx(0.2)
    assert rewrite_reward('{"query": ""}', 1.0) == pytest.approx(0.8)
    assert rewrite_reward("birthplace of Nolan", 0.0) == 0.0
    assert rewrite_reward(query, 0.25, RewriteRewardConfig(retrieval=1.0, format=0.0)) == pytest.approx(0.5)


def test_ndcg_of_retrieved_contexts_against_the_gold_evidence():
    hop2 = COMPOSITIONAL[1:]
    birth = ("Christopher Nolan", "(Christopher Nolan) -[place of birth]-> (London)\n(x) -[y]-> (z)")
    noise = ("Interstellar", "(Interstellar) -[director]-> (Christopher Nolan)")
    assert evidence_ndcg([birth, noise], hop2, k=5) == pytest.approx(1.0)
    assert evidence_ndcg([noise, birth], hop2, k=5) == pytest.approx(1 / math.log2(3))
    assert evidence_ndcg([noise, birth], hop2, k=1) == 0.0
    # the object's facts hold the same line: one relevant item per hop, found once
    london = ("London", "(Christopher Nolan) -[place of birth]-> (London)")
    assert evidence_ndcg([birth, london], hop2, k=5) == pytest.approx(1.0)
    assert evidence_ndcg([("p2", "text"), ("p1", "text")], COMPOSITIONAL, k=2) == pytest.approx(1.0)  # passage ids
    assert evidence_ndcg([("p9", "text"), ("p1", "text")], COMPOSITIONAL, k=2) == pytest.approx(
        (1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    assert evidence_ndcg([birth], (), k=5) == 0.0  # no gold evidence


def test_retrieval_metrics():
    assert ndcg(["a", "b"], ["a", "b"]) == pytest.approx(1.0)
    assert ndcg(["x", "a"], ["a"]) == pytest.approx(1 / math.log2(3))
    assert ndcg(["a", "a"], ["a", "b"]) == pytest.approx(1 / (1 + 1 / math.log2(3)))  # a repeat counts once
    assert ndcg([], ["a"]) == 0.0
    assert ndcg(["a"], ["a", "b"], k=5) == pytest.approx(1 / (1 + 1 / math.log2(3)))  # ideal at k, not at len(ids)


def test_mygo_threshold_never_decreases():
    tau = MyGORewardConfig().tau_0
    history = [tau]
    for batch in ([0.2, 0.4], [0.0, 0.1], [], [0.9, 0.7]):
        tau = next_tau(tau, batch)
        history.append(tau)
    assert history == pytest.approx([0.0, 0.3, 0.3, 0.3, 0.8])
    assert next_tau(0.5, [0.1]) == 0.5
    trajectories = [{"id": "a", "reward": 0.9}, {"id": "b", "reward": 0.3}, {"id": "c", "reward": 0.3}]
    assert [t["id"] for t in keep(trajectories, 0.3)] == ["a", "b", "c"]
    assert [t["id"] for t in keep(trajectories, 0.31)] == ["a"]
    assert [t["id"] for t in keep([{"id": "x", "f1": 1.0}], 1.0, key="f1")] == ["x"]
