"""Reward functions of the trainers: pure functions of a completion and the signals the export gives.

- Omne: R = R_format * (floor + (1 - floor) * R_result), floor 0.1 (format gates the reward), plus a
  repetition penalty for repeated identical tool calls in stage 3.
- OPERA (MAPGRPO), one reward per role: plan = λ1·logic + λ2·structure + λ3·execution,
  analysis-answer = α·sufficiency + β·accuracy + γ·format, rewrite = ω1·retrieval gain + ω2·format.
- MyGO: the threshold τ_k = max(τ_{k-1}, mean batch reward) and the trajectories it keeps.

Each family has an `XRewardConfig` dataclass with its weights, as TRL trainers have an `XConfig`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mhqa_graph.graphs.omne_prompts import TOOL_SPECS

from mhqa_graph.eval.scoring import score
from mhqa_graph.parsing import extract_json

OMNE_TOOLS = tuple(spec["name"] for spec in TOOL_SPECS)


# -- Omne --------------------------------------------------------------------------------------
@dataclass
class OmneRewardConfig:
    result_floor: float = 0.1  # reward of a well-formed completion with a wrong answer
    think: bool = True  # a <think> block must come before every tool call
    tools: tuple[str, ...] = OMNE_TOOLS
    repetition_weight: float = 0.0  # stage 3: subtracted per repeated identical tool call


_TAG = re.compile(r"</?(think|tool_call|answer)>", re.IGNORECASE)
_BLOCK = re.compile(r"<(think|tool_call|answer)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)


def _blocks(turn: str) -> list[tuple[str, str]] | None:
    """The (tag, body) blocks of one assistant turn in order; None if a tag is unclosed, nested or stray."""
    blocks, pos = [], 0
    for m in _BLOCK.finditer(turn):
        if _TAG.search(turn, pos, m.start()) or _TAG.search(m.group(2)):
            return None
        blocks.append((m.group(1).lower(), m.group(2)))
        pos = m.end()
    return None if _TAG.search(turn, pos) else blocks


def _tool_call(body: str, tools: Sequence[str]) -> dict[str, Any] | None:
    """{"name", "arguments"} of a well-formed tool call body (strict JSON, a known tool), else None."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or value.get("name") not in tools or not isinstance(value.get("arguments"), dict):
        return None
    return value


def _turns(completion: str | Sequence[str]) -> list[str]:
    return [completion] if isinstance(completion, str) else list(completion)


def format_reward(completion: str | Sequence[str], config: OmneRewardConfig = OmneRewardConfig()) -> int:
    """1 if the assistant turns (one string or a list, tool results left out) follow the protocol, else 0:
    every turn but the last makes >= 1 well-formed <tool_call> (strict JSON {"name": a known tool,
    "arguments": {...}}) and no answer, with a non-empty <think> block before its first call when
    `config.think`; the last turn has exactly one non-empty <answer> and no tool call; tags are closed
    and not nested, and no turn has two <think> blocks."""
    turns = _turns(completion)
    if not turns:
        return 0
    for n, turn in enumerate(turns):
        blocks = _blocks(turn)
        if blocks is None:
            return 0
        tags = [tag for tag, _ in blocks]
        if tags.count("think") > 1 or (tags.count("think") == 1 and tags[0] != "think"):
            return 0
        if n < len(turns) - 1:
            calls = [body for tag, body in blocks if tag == "tool_call"]
            if not calls or "answer" in tags or any(_tool_call(c, config.tools) is None for c in calls):
                return 0
            if config.think and not (tags[0] == "think" and blocks[0][1].strip()):
                return 0
        else:
            answers = [body for tag, body in blocks if tag == "answer"]
            if "tool_call" in tags or len(answers) != 1 or not answers[0].strip():
                return 0
    return 1


def final_answer(completion: str | Sequence[str]) -> str:
    """The text of the last <answer> of the last turn, "" if there is none."""
    turns = _turns(completion)
    found = re.findall(r"<answer>(.*?)</answer>", turns[-1] if turns else "", re.DOTALL | re.IGNORECASE)
    return found[-1].strip() if found else ""


def result_reward(answer: str, golds: Iterable[str]) -> float:
    """Token F1 of the answer, the max over the gold aliases."""
    return score(answer, golds)[1]


def tool_calls(completion: str | Sequence[str], config: OmneRewardConfig = OmneRewardConfig()) -> list[dict]:
    """The well-formed tool calls of the completion, in order."""
    calls = []
    for turn in _turns(completion):
        for m in _BLOCK.finditer(turn):
            if m.group(1).lower() == "tool_call" and (call := _tool_call(m.group(2), config.tools)) is not None:
                calls.append(call)
    return calls


def _call_key(call: Mapping[str, Any]) -> str:
    args = {k: " ".join(v.split()) if isinstance(v, str) else v for k, v in (call.get("arguments") or {}).items()}
    return json.dumps([call.get("name"), args], sort_keys=True, default=str)


def repetition_penalty(calls: Sequence[Mapping[str, Any]], weight: float) -> float:
    """-weight per call identical (same name, same whitespace-normalised arguments) to an earlier one."""
    keys = [_call_key(c) for c in calls]
    return -weight * (len(keys) - len(set(keys)))


def omne_reward(completion: str | Sequence[str], golds: Iterable[str],
                config: OmneRewardConfig = OmneRewardConfig()) -> float:
    """R_format * (floor + (1 - floor) * R_result), plus the repetition penalty when configured."""
    reward = format_reward(completion, config) * (
        config.result_floor + (1 - config.result_floor) * result_reward(final_answer(completion), golds))
    if config.repetition_weight:
        reward += repetition_penalty(tool_calls(completion, config), config.repetition_weight)
    return reward


# -- OPERA roles ---------------------------------------------------------------------------------
@dataclass
class PlanRewardConfig:
    logic: float = 0.4  # λ1
    structure: float = 0.2  # λ2
    execution: float = 0.4  # λ3
    max_subgoals: int = 5


@dataclass
class AnalysisRewardConfig:
    sufficiency: float = 0.3  # α
    accuracy: float = 0.5  # β
    format: float = 0.2  # γ


@dataclass
class RewriteRewardConfig:
    gain: float = 0.8  # ω1
    format: float = 0.2  # ω2
    metric: str = "recall"  # recall | ndcg, of the gold supporting ids among the retrieved ids


_PLACEHOLDER = re.compile(r"\[[^\[\]\d]{0,40}?(\d{1,2})[^\[\]\d]{0,40}\]")  # as graphs/opera.py: [Answer1]


def plan_subgoals(completion: str, max_subgoals: int | None = None) -> list[str] | None:
    """The sub-goals of a {"subgoals": [...]} reply (JSON as the agent's tolerant parser finds it), or None
    unless it holds 1..max_subgoals non-empty strings."""
    value = extract_json(completion, dict)
    subgoals = value.get("subgoals") if value else None
    if not isinstance(subgoals, list) or not subgoals or (max_subgoals and len(subgoals) > max_subgoals):
        return None
    if not all(isinstance(s, str) and s.strip() for s in subgoals):
        return None
    return [" ".join(s.split()) for s in subgoals]


def plan_logic(subgoals: Sequence[str]) -> float:
    """The fraction of sub-goals in a sensible order: each one new (no repeat of an earlier sub-goal) and
    its placeholders [AnswerN] pointing only backwards (1 <= N < its own number)."""
    if not subgoals:
        return 0.0
    good = 0
    for i, goal in enumerate(subgoals, start=1):
        refs = [int(n) for n in _PLACEHOLDER.findall(goal)]
        good += all(1 <= n < i for n in refs) and goal.lower() not in (g.lower() for g in subgoals[:i - 1])
    return good / len(subgoals)


def plan_reward(completion: str, execution: float, config: PlanRewardConfig = PlanRewardConfig()) -> float:
    """λ1·logic + λ2·structure + λ3·execution; `execution` is the F1 of the answer the plan led to when
    run (clipped to [0, 1]). A reply without a valid plan gets only its execution share."""
    subgoals = plan_subgoals(completion, config.max_subgoals)
    logic = plan_logic(subgoals) if subgoals else 0.0
    return (config.logic * logic + config.structure * (subgoals is not None)
            + config.execution * min(max(execution, 0.0), 1.0))


def parse_analysis(completion: str) -> dict[str, Any] | None:
    """{"sufficient": bool, "answer": str, ...} of an Analysis-Answer reply, None if it is not that."""
    value = extract_json(completion, dict)
    if not value or not isinstance(value.get("sufficient"), bool) or not isinstance(value.get("answer"), str):
        return None
    if "reasoning" in value and not isinstance(value["reasoning"], str):
        return None
    return value


def evidence_found(retrieved_ids: Iterable[str], supporting_ids: Iterable[str]) -> bool:
    """Whether any gold supporting passage was retrieved."""
    return bool(set(map(str, retrieved_ids)) & set(map(str, supporting_ids)))


def analysis_reward(completion: str, golds: Iterable[str], retrieved_ids: Iterable[str],
                    supporting_ids: Iterable[str], config: AnalysisRewardConfig = AnalysisRewardConfig()) -> float:
    """α·sufficiency + β·accuracy + γ·format: sufficiency 1 when the reply's "sufficient" agrees with
    whether a gold supporting passage was retrieved, accuracy the F1 of its answer against `golds`,
    format 1 for a JSON object with a bool "sufficient" and a string "answer". An unreadable reply gets 0."""
    value = parse_analysis(completion)
    if value is None:
        return 0.0
    agree = value["sufficient"] == evidence_found(retrieved_ids, supporting_ids)
    return config.sufficiency * agree + config.accuracy * score(value["answer"], golds)[1] + config.format


def recall(ids: Sequence[str], gold: Iterable[str]) -> float:
    gold = set(gold)
    return len(gold & set(ids)) / len(gold) if gold else 0.0


def ndcg(ids: Sequence[str], gold: Iterable[str]) -> float:
    """Binary-relevance NDCG of the ranked `ids` (cut at len(ids)); a repeated id counts once."""
    gold, seen = set(gold), set()
    dcg = 0.0
    for rank, i in enumerate(ids):
        if i in gold and i not in seen:
            dcg += 1 / math.log2(rank + 2)
        seen.add(i)
    ideal = sum(1 / math.log2(rank + 2) for rank in range(min(len(gold), len(ids))))
    return dcg / ideal if ideal else 0.0


def rewrite_query(completion: str) -> str | None:
    """The non-empty "query" of a {"query": ...} reply, None if it is not that."""
    value = extract_json(completion, dict)
    query = value.get("query") if value else None
    return query.strip() if isinstance(query, str) and query.strip() else None


def rewrite_reward(completion: str, before_ids: Sequence[str], after_ids: Sequence[str],
                   supporting_ids: Iterable[str], config: RewriteRewardConfig = RewriteRewardConfig()) -> float:
    """ω1·gain + ω2·format: gain is recall (or NDCG) of the gold supporting ids retrieved after the rewrite
    minus before it, clipped to [0, 1]; format 1 for a JSON object with a non-empty string "query"."""
    metric = {"recall": recall, "ndcg": ndcg}[config.metric]
    gold = list(map(str, supporting_ids))
    gain = metric(list(map(str, after_ids)), gold) - metric(list(map(str, before_ids)), gold)
    return config.gain * min(max(gain, 0.0), 1.0) + config.format * (rewrite_query(completion) is not None)


# -- MyGO ----------------------------------------------------------------------------------------
@dataclass
class MyGORewardConfig:
    tau_0: float = 0.0  # the first threshold; τ_k = max(τ_{k-1}, mean reward of iteration k's samples)
    reward: str = "f1"  # the score of a trajectory: f1 | em of its final answer


def next_tau(prev_tau: float, batch_rewards: Iterable[float]) -> float:
    """max(τ_{k-1}, mean batch reward): τ never decreases; an empty batch keeps it."""
    rewards = list(batch_rewards)
    return max(prev_tau, sum(rewards) / len(rewards)) if rewards else prev_tau


def keep(trajectories: Iterable[Mapping[str, Any]], tau: float, key: str = "reward") -> list[Mapping[str, Any]]:
    """The trajectories whose reward is >= τ, in order."""
    return [t for t in trajectories if t[key] >= tau]
