"""Reward functions of the trainers: pure functions of a completion and the signals the export gives.

- Omne: R = R_format * (floor + (1 - floor) * R_result), floor 0.1 (format gates the reward), plus a
  repetition penalty for repeated identical tool calls in stage 3.
- OPERA (MAPGRPO), one reward per role, scored against the question's gold chain (`QAItem.chain`, one
  `Hop` per reasoning step) where the data has one:
  plan = λ1·logic + λ2·structure + λ3·execution, analysis-answer = α·𝕀[sufficiency = gold] +
  β·EM(sub-answer, gold sub-answer) + γ·format, rewrite = ω1·√NDCG@k + ω2·format.
- MyGO: the threshold τ_k = max(τ_{k-1}, mean batch reward) and the trajectories it keeps.

Each family has an `XRewardConfig` dataclass with its weights, as TRL trainers have an `XConfig`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mhqa_graph.graphs.omne.prompts import TOOL_SPECS

from mhqa_graph.eval.diagnostics import hop_seen
from mhqa_graph.eval.scoring import score
from mhqa_graph.ingest.datasets import Hop
from mhqa_graph.parsing import extract_json
from mhqa_graph.parsing import words as normalize_line  # the normalisation hop_seen expects

OMNE_TOOLS = tuple(spec["name"] for spec in TOOL_SPECS)


# -- Omne --------------------------------------------------------------------------------------
@dataclass
class OmneRewardConfig:
    result_floor: float = 0.1  # reward of a well-formed completion with a wrong answer
    think: bool = True  # a non-empty <think> block must open every turn, call turns and the answer turn
    require_tool: bool = True  # an episode without one successful tool call has no format (questions need the KG)
    tools: tuple[str, ...] = OMNE_TOOLS
    repetition_weight: float = 0.0  # stage 3: subtracted per repeated identical tool call


_TAG = re.compile(r"</?(think|tool_call|answer)>", re.IGNORECASE)
_BLOCK = re.compile(r"<(think|tool_call|answer)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
_RESPONSE = re.compile(r"</?tool_response>", re.IGNORECASE)


def _blocks(turn: str) -> list[tuple[str, str]] | None:
    """The (tag, body) blocks of one assistant turn in order; None if a tag is unclosed, nested or stray,
    or if there is text (other than white space) outside the blocks."""
    blocks, pos = [], 0
    for m in _BLOCK.finditer(turn):
        if _TAG.search(turn, pos, m.start()) or _TAG.search(m.group(2)) or turn[pos:m.start()].strip():
            return None
        blocks.append((m.group(1).lower(), m.group(2)))
        pos = m.end()
    return None if turn[pos:].strip() else blocks


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


def format_reward(completion: str | Sequence[str], config: OmneRewardConfig = OmneRewardConfig(),
                  successful_calls: int | None = None) -> int:
    """1 if the assistant turns (one string or a list, tool results left out) follow the protocol, else 0.
    Every turn is blocks only (white space between them): no text outside <think>, <tool_call> and
    <answer>, no <tool_response> the model wrote itself, tags closed and not nested, at most one <think>,
    first. With `config.think` every turn opens with a non-empty <think>. Every turn but the last makes
    >= 1 well-formed <tool_call> (strict JSON {"name": a known tool, "arguments": {...}}) and no answer;
    the last has exactly one non-empty <answer> and no call. With `config.require_tool`, an episode whose
    `successful_calls` (tool calls that returned a result, not an error or a repeat) is 0 gets 0; None
    means unknown and is not checked."""
    turns = _turns(completion)
    if not turns or (config.require_tool and successful_calls == 0):
        return 0
    for n, turn in enumerate(turns):
        blocks = None if _RESPONSE.search(turn) else _blocks(turn)
        if not blocks:
            return 0
        tags = [tag for tag, _ in blocks]
        if tags.count("think") > 1 or (tags.count("think") == 1 and tags[0] != "think"):
            return 0
        if config.think and not (tags[0] == "think" and blocks[0][1].strip()):
            return 0
        if n < len(turns) - 1:
            calls = [body for tag, body in blocks if tag == "tool_call"]
            if not calls or "answer" in tags or any(_tool_call(c, config.tools) is None for c in calls):
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


def omne_reward(completion: str | Sequence[str], golds: Iterable[str], config: OmneRewardConfig = OmneRewardConfig(),
                successful_calls: int | None = None) -> float:
    """R_format * (floor + (1 - floor) * R_result), plus the repetition penalty when configured."""
    reward = format_reward(completion, config, successful_calls) * (
        config.result_floor + (1 - config.result_floor) * result_reward(final_answer(completion), golds))
    if config.repetition_weight:
        reward += repetition_penalty(tool_calls(completion, config), config.repetition_weight)
    return reward


# -- gold chains ---------------------------------------------------------------------------------
def per_hop(chain: Sequence[Hop], subgoals: int) -> bool:
    """Whether sub-goal i of a plan can be scored against hop i of the gold chain: the chain has
    sub-answers for every hop and the plan as many sub-goals as the chain hops."""
    return bool(chain) and len(chain) == subgoals and all(h.answer for h in chain)


def shown_lines(text: str) -> list[str]:
    """The lines of `text`, normalised as `hop_seen` compares them."""
    return [normalize_line(line) for line in text.splitlines() if line.strip()]


def evidence_seen(hop: Hop, retrieved_ids: Iterable[str], shown: str) -> bool | None:
    """Whether the hop's gold evidence was in what an agent saw: one of its passages retrieved (by id), or a
    line of `shown` naming both ends of one of its triples (how KG facts are shown); None if it has none."""
    return hop_seen(hop, set(map(str, retrieved_ids)), shown_lines(shown))


def chain_links(chain: Sequence[Hop]) -> set[tuple[int, int]] | None:
    """The gold chain's dependencies (i, j), 1-based: hop i needs the answer of hop j < i, because a triple
    of hop i starts at that answer, its sub-question names it, or refers to it as #j (MuSiQue). None when
    the chain has no sub-answers to tell."""
    if not any(h.answer for h in chain):
        return None
    links = set()
    for i, hop in enumerate(chain, start=1):
        subjects = {normalize_line(s) for s, _, _ in hop.triples}
        question = f" {normalize_line(hop.question)} " if hop.question else ""
        links |= {(i, int(n)) for n in re.findall(r"#(\d{1,2})\b", hop.question or "") if 1 <= int(n) < i}
        for j, earlier in enumerate(chain[:i - 1], start=1):
            answer = normalize_line(earlier.answer or "")
            if answer and (answer in subjects or f" {answer} " in question):
                links.add((i, j))
    return links


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
    retrieval: float = 0.8  # ω1, times √NDCG@k of the new query's retrieval against the gold evidence
    format: float = 0.2  # ω2


_PLACEHOLDER = re.compile(r"\[[^\[\]\d]{0,40}?(\d{1,2})[^\[\]\d]{0,40}\]")  # as graphs/opera/plan.py: [Answer1]


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


def plan_links(subgoals: Sequence[str]) -> set[tuple[int, int]]:
    """(i, n) for every placeholder [AnswerN] in sub-goal i (1-based)."""
    return {(i, int(n)) for i, goal in enumerate(subgoals, start=1) for n in _PLACEHOLDER.findall(goal)}


def plan_logic(subgoals: Sequence[str], hops: int | None = None) -> float:
    """The fraction of sub-goals in a sensible order: each one new (no repeat of an earlier sub-goal) and
    its placeholders [AnswerN] pointing only backwards (1 <= N < its own number). A one-sub-goal plan for
    a question of `hops` >= 2 gets 0: it restates the question."""
    if not subgoals or (hops is not None and hops >= 2 and len(subgoals) == 1):
        return 0.0
    good = 0
    for i, goal in enumerate(subgoals, start=1):
        refs = [int(n) for n in _PLACEHOLDER.findall(goal)]
        good += all(1 <= n < i for n in refs) and goal.lower() not in (g.lower() for g in subgoals[:i - 1])
    return good / len(subgoals)


def plan_structure(subgoals: Sequence[str], chain: Sequence[Hop]) -> float:
    """How the plan's shape matches the gold chain: 1 - |sub-goals - hops| / max of the two, averaged with
    the Dice overlap of its placeholder links and the chain's dependencies (`chain_links`) where the
    chain tells them (no links on either side counts as a match). 1.0 without a chain."""
    if not chain:
        return 1.0
    count = 1 - abs(len(subgoals) - len(chain)) / max(len(subgoals), len(chain))
    gold = chain_links(chain)
    if gold is None:
        return count
    links = plan_links(subgoals)
    overlap = 1.0 if not gold and not links else 2 * len(gold & links) / (len(gold) + len(links))
    return (count + overlap) / 2


def plan_reward(completion: str, execution: float, chain: Sequence[Hop] = (), hops: int | None = None,
                config: PlanRewardConfig = PlanRewardConfig()) -> float:
    """λ1·logic + λ2·structure + λ3·execution. `execution` is the F1 of the answer the plan led to when run
    (clipped to [0, 1]); `chain` the question's gold chain, `hops` its hop count (default: the chain's
    length). Structure is 0 for a reply without a valid plan, else `plan_structure`. A reply without a
    valid plan gets only its execution share."""
    subgoals = plan_subgoals(completion, config.max_subgoals)
    hops = hops if hops is not None else (len(chain) or None)
    logic = plan_logic(subgoals, hops) if subgoals else 0.0
    structure = plan_structure(subgoals, chain) if subgoals else 0.0
    return config.logic * logic + config.structure * structure + config.execution * min(max(execution, 0.0), 1.0)


def parse_analysis(completion: str) -> dict[str, Any] | None:
    """{"sufficient": bool, "answer": str, ...} of an Analysis-Answer reply, None if it is not that."""
    value = extract_json(completion, dict)
    if not value or not isinstance(value.get("sufficient"), bool) or not isinstance(value.get("answer"), str):
        return None
    if "reasoning" in value and not isinstance(value["reasoning"], str):
        return None
    return value


@dataclass(frozen=True)
class AnalysisGold:
    """What an analysis of one sub-goal is scored against: the sufficiency label (None: no gold
    evidence, the term is not scored) and the gold answers (None: not scored)."""

    sufficient: bool | None
    answers: tuple[str, ...] | None


def analysis_gold(step: int, steps: int, chain: Sequence[Hop], final_answers: Sequence[str],
                  shown_ids: Iterable[str], shown: str) -> AnalysisGold:
    """The gold of sub-goal `step` (1-based) of a plan of `steps`. With per-hop gold (`per_hop`): the
    sufficiency label is whether hop `step`'s evidence was in what the analysis saw (`evidence_seen` of the
    passage ids and the text it was shown), the answer that hop's sub-answer. Without: only the last
    sub-goal is scored, against the final answers."""
    if per_hop(chain, steps) and 1 <= step <= steps:
        hop = chain[step - 1]
        return AnalysisGold(evidence_seen(hop, shown_ids, shown), (hop.answer,))
    return AnalysisGold(None, tuple(final_answers) if step == steps else None)


def analysis_reward(completion: str, gold: AnalysisGold,
                    config: AnalysisRewardConfig = AnalysisRewardConfig()) -> float:
    """α·𝕀[sufficient = gold label] + β·EM(answer, gold answers) + γ·format; a term without gold is 0.
    Format is 1 for a JSON object with a bool "sufficient" and a string "answer"; an unreadable reply gets 0.
    EM earns nothing when the hop's evidence was not shown (gold label False): a right answer there is a guess,
    and rewarding it would teach guessing."""
    value = parse_analysis(completion)
    if value is None:
        return 0.0
    agree = gold.sufficient is not None and value["sufficient"] == gold.sufficient
    exact = score(value["answer"], gold.answers)[0] if gold.answers and gold.sufficient is not False else 0.0
    return config.sufficiency * agree + config.accuracy * exact + config.format


def ndcg(ids: Sequence[Hashable | None], gold: Iterable[Hashable], k: int | None = None) -> float:
    """Binary-relevance NDCG@k of the ranked `ids` (k defaults to len(ids)); a repeated id counts once."""
    gold, seen = set(gold), set()
    k = len(ids) if k is None else k
    dcg = 0.0
    for rank, i in enumerate(ids[:k]):
        if i in gold and i not in seen:
            dcg += 1 / math.log2(rank + 2)
        seen.add(i)
    ideal = sum(1 / math.log2(rank + 2) for rank in range(min(len(gold), k)))
    return dcg / ideal if ideal else 0.0


def evidence_ndcg(contexts: Sequence[tuple[str, str]], hops: Sequence[Hop], k: int) -> float:
    """NDCG@k of retrieved contexts (id, text), best first, against the gold evidence of `hops`, one
    relevant item per hop: a context counts for the first hop not found higher up whose evidence it holds
    (`evidence_seen`: its passage id, or a line naming both ends of one of its triples)."""
    hops = [h for h in hops if h.passage_ids or h.triples]
    found: list[int | None] = []
    for cid, text in contexts[:k]:
        found.append(next((n for n, hop in enumerate(hops) if n not in found and evidence_seen(hop, [cid], text)),
                          None))
    return ndcg(found, range(len(hops)), k)


def rewrite_query(completion: str) -> str | None:
    """The non-empty "query" of a {"query": ...} reply, None if it is not that."""
    value = extract_json(completion, dict)
    query = value.get("query") if value else None
    return query.strip() if isinstance(query, str) and query.strip() else None


def rewrite_reward(completion: str, retrieval_ndcg: float,
                   config: RewriteRewardConfig = RewriteRewardConfig()) -> float:
    """ω1·√NDCG@k + ω2·format: NDCG@k of the rewritten query's retrieval against the gold evidence
    (`evidence_ndcg`), format 1 for a JSON object with a non-empty string "query"."""
    return (config.retrieval * math.sqrt(min(max(retrieval_ndcg, 0.0), 1.0))
            + config.format * (rewrite_query(completion) is not None))


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
