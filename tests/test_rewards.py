"""Reward functions on hand-made completions: Omne's format gate and repetition penalty, the OPERA role
rewards, MyGO's threshold."""

from __future__ import annotations

import math

import pytest
from mhqa_graph.training.rewards import (
    AnalysisRewardConfig,
    MyGORewardConfig,
    OmneRewardConfig,
    PlanRewardConfig,
    RewriteRewardConfig,
    analysis_reward,
    final_answer,
    format_reward,
    keep,
    ndcg,
    next_tau,
    omne_reward,
    plan_logic,
    plan_reward,
    recall,
    repetition_penalty,
    result_reward,
    rewrite_reward,
    tool_calls,
)

CALL = '<tool_call>{"name": "node_info", "arguments": {"entity": "Inception", "graph_type": "kg"}}</tool_call>'
MATCH = '<tool_call>{"name": "entity_matcher", "arguments": {"query": "Inception", "graph_type": "kg"}}</tool_call>'
GOOD = [f"<think>Find the film.</think>{MATCH}", f"<think>Now its director.</think>\n{CALL}",
        "<think>Nolan directed it.</think><answer>Christopher Nolan</answer>"]


@pytest.mark.parametrize("completion", [
    GOOD,
    "<think>I know this.</think><answer>Christopher Nolan</answer>",
    "<answer>Christopher Nolan</answer>",  # no tool call, so no reasoning is required
    [f"<think>two calls</think>{MATCH}\n{CALL}", "<answer>x</answer>"],
])
def test_well_formed_completions(completion):
    assert format_reward(completion) == 1


@pytest.mark.parametrize("completion", [
    [MATCH, "<answer>Christopher Nolan</answer>"],  # a tool call without reasoning before it
    [f"<think> </think>{MATCH}", "<answer>x</answer>"],  # empty reasoning
    [f"{MATCH}<think>late</think>", "<answer>x</answer>"],  # reasoning after the call
    ['<think>a</think><tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', "<answer>x</answer>"],
    ['<think>a</think><tool_call>{"name": "node_info", "arguments": {"entity": "x"</tool_call>', "<answer>x</answer>"],
    ['<think>a</think><tool_call>{"name": "node_info", "arguments": "x"}</tool_call>', "<answer>x</answer>"],
    ["<think>a</think><tool_call>not json</tool_call>", "<answer>x</answer>"],
    [f"<think>a</think>{CALL}"],  # never answers
    [f"<think>a</think>{CALL}<answer>x</answer>"],  # a call in the answer turn
    ["<think>a</think><answer>x</answer><answer>y</answer>"],  # two answers
    [f"<think>a</think>{CALL}<answer>x</answer>", "<answer>x</answer>"],  # an answer before the last turn
    ["<think>a</think><answer></answer>"],  # empty answer
    ["<think>a<answer>x</answer></think>"],  # nested
    ["<think>a</think><answer>x"],  # unclosed
    ["<think>a</think></think><answer>x</answer>"],  # stray closing tag
    ["<think>a</think><think>b</think><answer>x</answer>"],  # two reasoning blocks
    ["thinking aloud", "<answer>x</answer>"],  # a turn with neither call nor answer
    [],
])
def test_malformed_completions(completion):
    assert format_reward(completion) == 0


def test_think_off_needs_no_reasoning_before_calls():
    completion = [MATCH, "<answer>Christopher Nolan</answer>"]
    assert format_reward(completion, OmneRewardConfig(think=False)) == 1


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


def test_plan_reward_parts():
    good = '{"subgoals": ["Who directed Inception?", "Where was [Answer1] born?"]}'
    assert plan_reward(good, execution=1.0) == pytest.approx(1.0)
    assert plan_reward(good, execution=0.5) == pytest.approx(0.4 + 0.2 + 0.2)
    forward = '{"subgoals": ["Where was [Answer2] born?", "Who directed Inception?"]}'
    assert plan_logic(["Where was [Answer2] born?", "Who directed Inception?"]) == 0.5
    assert plan_reward(forward, execution=0.0) == pytest.approx(0.4 * 0.5 + 0.2)
    assert plan_logic(["Who directed Inception?", "Who directed Inception?"]) == 0.5  # a repeat
    assert plan_logic(["Where was [Answer1] born?"]) == 0.0  # points at itself
    assert plan_reward("Who directed Inception?", execution=1.0) == pytest.approx(0.4)  # no JSON plan
    assert plan_reward('{"subgoals": []}', execution=0.0) == 0.0
    six = '{"subgoals": ["a", "b", "c", "d", "e", "f"]}'
    assert plan_reward(six, 0.0) == 0.0
    assert plan_reward(six, 0.0, PlanRewardConfig(max_subgoals=6)) == pytest.approx(0.6)
    assert plan_reward(good, execution=3.0) == pytest.approx(1.0)  # execution clipped


def test_analysis_reward_parts():
    golds, support = ["Christopher Nolan"], ["p1", "p2"]
    right = '{"reasoning": "p1 says so", "sufficient": true, "answer": "Christopher Nolan"}'
    assert analysis_reward(right, golds, ["p1", "p9"], support) == pytest.approx(1.0)
    assert analysis_reward(right, golds, ["p8", "p9"], support) == pytest.approx(0.5 + 0.2)  # claims too much
    unsure = '{"sufficient": false, "answer": ""}'
    assert analysis_reward(unsure, golds, ["p8"], support) == pytest.approx(0.3 + 0.2)
    assert analysis_reward('{"sufficient": "yes", "answer": "x"}', golds, ["p1"], support) == 0.0
    assert analysis_reward("Christopher Nolan", golds, ["p1"], support) == 0.0
    config = AnalysisRewardConfig(sufficiency=0.0, accuracy=1.0, format=0.0)
    partial = '{"sufficient": true, "answer": "Nolan"}'
    assert analysis_reward(partial, golds, [], support, config) == pytest.approx(2 / 3)


def test_rewrite_reward_parts():
    support = ["p1", "p2"]
    query = '{"query": "Christopher Nolan birthplace"}'
    assert rewrite_reward(query, ["p9"], ["p1", "p2"], support) == pytest.approx(1.0)
    assert rewrite_reward(query, ["p1"], ["p1", "p2"], support) == pytest.approx(0.8 * 0.5 + 0.2)
    assert rewrite_reward(query, ["p1", "p2"], ["p9"], support) == pytest.approx(0.2)  # a loss is clipped to 0
    assert rewrite_reward('{"query": ""}', ["p9"], ["p1"], support) == pytest.approx(0.4)
    assert rewrite_reward("birthplace of Nolan", ["p9"], ["p9"], support) == 0.0
    ndcg_config = RewriteRewardConfig(metric="ndcg")
    assert rewrite_reward(query, ["p9", "p1"], ["p1", "p9"], ["p1"], ndcg_config) == pytest.approx(
        0.8 * (1 - 1 / math.log2(3)) + 0.2)


def test_retrieval_metrics():
    assert recall(["a", "b", "c"], ["a", "d"]) == 0.5 and recall(["a"], []) == 0.0
    assert ndcg(["a", "b"], ["a", "b"]) == pytest.approx(1.0)
    assert ndcg(["x", "a"], ["a"]) == pytest.approx(1 / math.log2(3))
    assert ndcg(["a", "a"], ["a", "b"]) == pytest.approx(1 / (1 + 1 / math.log2(3)))  # a repeat counts once
    assert ndcg([], ["a"]) == 0.0


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
