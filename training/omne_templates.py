"""Template trajectories for Omne's SFT stage, synthesised from the gold chains (the paper mixes
template-synthesised data into its SFT; arXiv 2508.17330).

For a question with a gold chain (PathQuestion's gold path, 2Wiki's evidence triples) the real Omne graph
runs over the real store with a scripted policy (`TemplateWalk`, played by the project's `FakeChatModel`)
that walks the chain: per hop a short `<think>`, one tagged `<tool_call>` in the protocol's canonical form
(`entity_matcher` for each entity the walk starts from, then `node_info` on it; `node_info` on each entity a
fact reached), and at the end a thought stating the facts found and the gold answer in `<answer>` tags.
Every tool result is the graph's own, as the graph feeds it back. Before each turn the walk checks the
previous result: the start entity among entity_matcher's names, the gold facts among node_info's lines.
When the tools do not reach the gold answer along the chain, the question is skipped and counted under
one of `SKIPS`. A kept trajectory is the chat of the graph's last prompt and reply, a row of the `sft`
export layout (`mhqa_graph.export`), which Omne's stage 2 and warm start consume.

    rows, counts = rollout_templates(config.rollout, limit=200)          # the trainer's `templates: 200`
    counts = export_templates(config.rollout, "runs/templates")          # `mhqa templates --out ...`
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.omne import prompts as P

from mhqa_graph.errors import InvalidInput
from mhqa_graph.eval.environments import environment_name, open_environment
from mhqa_graph.eval.runner import load_questions
from mhqa_graph.eval.scoring import normalize_answer, score
from mhqa_graph.export import THINK_WEIGHT, _features, _write_jsonl, weighted_message
from mhqa_graph.ingest.datasets import QAItem
from mhqa_graph.models.chat import chat_dicts
from mhqa_graph.parsing import words
from mhqa_graph.store.base import KnowledgeStore
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.tools import _DESCRIPTION
from mhqa_graph.types import Fact, Triple

from .configs import RolloutConfig

# why a question yields no trajectory
SKIPS = {
    "no chain": "the question has no gold triples",
    "start not named": "no entity the chain starts from is named in the question",
    "chain broken": "a hop starts from an entity that no earlier fact reached and the question does not name",
    "answer not in chain": "the gold answer is neither yes/no nor an entity of the chain",
    "too many hops": "the walk needs more model turns than max_rounds",
    "start not matched": "entity_matcher did not list the start entity among its top_k names",
    "entity missing": "node_info found no entity of that name",
    "fact cut": "a gold fact is in the graph but not in node_info's result (result_chars, 40 facts)",
    "fact missing": "a gold fact is not in the graph",
    "sent back": "a guard of the graph sent the answer back",
    "context": "the conversation outgrew context_chars: the graph cut earlier results or forced the answer",
    "graph": "the graph ended otherwise than with the gold answer",
}
MADE = "made"
OUTCOMES = "outcomes.jsonl.gz"  # beside counts.json: each question's outcome

_RESPONSE = re.compile(r"<tool_response>\n(.*)\n</tool_response>", re.DOTALL)


class NoTemplate(Exception):
    """The walk cannot go on; `reason` is one of SKIPS."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Visit:
    """One entity of the walk: looked up first with entity_matcher (`match`), then read with node_info,
    where its gold facts (`triples`) must show."""

    entity: str  # as the chain spells it
    match: bool
    triples: tuple[Triple, ...]


def _key(name: str) -> str:
    return name.casefold()


def plan_walk(item: QAItem) -> list[Visit]:
    """The entities to visit along the gold chain, depth first: an entity a confirmed fact reached next, else
    the one the question names first (looked up with entity_matcher). NoTemplate if the chain cannot be
    walked so."""
    triples = list(dict.fromkeys(t for hop in item.chain for t in hop.triples))
    if not triples:
        raise NoTemplate("no chain")
    spelled: dict[str, str] = {}
    facts: dict[str, list[Triple]] = {}
    for s, r, o in triples:
        spelled.setdefault(_key(s), s)
        facts.setdefault(_key(s), []).append((s, r, o))
    asked = f" {words(item.question)} "
    named = {_key(e) for e in item.topic_entities} | {k for k, s in spelled.items() if f" {words(s)} " in asked}
    where = {k: asked.find(f" {words(s)} ") % (len(asked) + 1) for k, s in spelled.items()}  # not found: last
    pending, reached, visits = list(facts), set(), []
    while pending:
        key = next((k for k in pending if k in reached), None)
        match = key is None
        if match:
            key = min((k for k in pending if k in named), key=where.__getitem__, default=None)
            if key is None:
                raise NoTemplate("chain broken" if visits else "start not named")
        pending.remove(key)
        visits.append(Visit(spelled[key], match, tuple(facts[key])))
        reached |= {_key(o) for _, _, o in facts[key]}
    return visits


def gold_answer(item: QAItem) -> str:
    """The gold answer as the chain spells it (an entity of its facts), or yes/no."""
    golds = {normalize_answer(a) for a in item.answers}
    for s, _, o in (t for hop in item.chain for t in hop.triples):
        for name in (o, s):
            if normalize_answer(name) in golds:
                return name
    said = next((a for a in item.answers if normalize_answer(a) in ("yes", "no")), None)
    if said is None:
        raise NoTemplate("answer not in chain")
    return said


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def said(triples: Iterable[Triple]) -> str:
    """`the father of A is B; the country of C is D and E`: facts as a thought states them."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for s, r, o in triples:
        grouped.setdefault((s, r), []).append(o)
    return "; ".join(f"the {r} of {s} is {_and(objects)}" for (s, r), objects in grouped.items())


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _relations(visit: Visit) -> str:
    return _and(list(dict.fromkeys(r for _, r, _ in visit.triples)))


class TemplateWalk:
    """The scripted policy of one question: `reply(messages)` is its turn on the graph's prompt
    (`FakeChatModel(respond=walk.reply)`). It checks the previous tool result against the gold chain and
    raises `NoTemplate` (recording `reason`) when the walk cannot go on."""

    def __init__(self, item: QAItem, store: KnowledgeStore, graph: str, think: bool = True) -> None:
        self.item, self.store, self.graph, self.think = item, store, graph, think
        self.visits = plan_walk(item)
        self.answer = gold_answer(item)
        self.steps = [(name, v) for v in self.visits
                      for name in (("entity_matcher", "node_info") if v.match else ("node_info",))]
        self.names: dict[str, str] = {}  # entity key -> its name as the tools showed it
        self.stated: list[Triple] = []  # gold facts confirmed by the last node_info result
        self.reason: str | None = None
        self.said: list[str] = []  # the replies given

    @property
    def turns(self) -> int:
        """Model turns of the walk: its tool calls and the answer."""
        return len(self.steps) + 1

    def reply(self, messages: list[BaseMessage]) -> str:
        try:
            turn = sum(isinstance(m, AIMessage) for m in messages)
            if turn:
                self._check(turn - 1, self._result(messages[-1]))
            self.said.append(self._turn(turn))
            return self.said[-1]
        except NoTemplate as skip:
            self.reason = skip.reason
            raise

    @staticmethod
    def _result(message: BaseMessage) -> str:
        found = _RESPONSE.fullmatch(message.text) if isinstance(message, HumanMessage) else None
        if found is None:
            raise NoTemplate("sent back" if P.is_send_back(message.text) else
                             "context" if message.text == P.FORCE_ANSWER else "graph")
        return found.group(1)

    def _check(self, n: int, result: str) -> None:
        """Whether the result of step `n` holds what the chain needs from it."""
        tool, visit = self.steps[n]
        if tool == "entity_matcher":
            listed = [_DESCRIPTION.sub("", line) for line in result.splitlines()]
            name = next((x for x in listed if _key(x) == _key(visit.entity)), None)
            if name is None:
                raise NoTemplate("start not matched")
            self.names[_key(visit.entity)] = name
            return
        lines = result.splitlines()
        if not lines or not lines[0].startswith("Entity: "):
            raise NoTemplate("entity missing")
        node = lines[0].removeprefix("Entity: ")
        shown = set(lines[1:])
        for _, r, o in visit.triples:
            if f"- {Fact(r, o, 'out').as_text(node)}" not in shown:
                stored = Fact(r, o, "out") in self.store.node_info(self.graph, node).facts
                raise NoTemplate("fact cut" if stored else "fact missing")
            self.names.setdefault(_key(o), o)
        self.stated = list(visit.triples)

    def _call(self, name: str, arg: str, value: str) -> str:
        call = json.dumps({"name": name, "arguments": {arg: value, "graph_type": self.graph}}, ensure_ascii=False)
        return f"<tool_call>\n{call}\n</tool_call>"

    def _turn(self, n: int) -> str:
        """The text of turn `n`: a thought, then the call of step n, or the answer after the last step."""
        before = _sentence(said(self.stated)) + ". " if self.stated else ""
        if n >= len(self.steps):
            leaves = [t for t in dict.fromkeys(t for v in self.visits for t in v.triples)
                      if _key(t[2]) not in {_key(v.entity) for v in self.visits}]
            thought = f"{_sentence(said(leaves))}. So the answer is {self.answer}."
            body = f"<answer>{self.answer}</answer>"
        else:
            tool, visit = self.steps[n]
            if tool == "entity_matcher":
                thought = (f"{before}The question also names {visit.entity}; I look up its exact name." if n else
                           f"The question starts from {visit.entity}; I look up its exact name in the graph.")
                body = self._call(tool, "query", visit.entity)
            else:
                name = self.names[_key(visit.entity)]
                thought = (f"{name} is in the graph; I read its facts for its {_relations(visit)}." if visit.match
                           else f"{before}Next, the {_relations(visit)} of {name}.")
                body = self._call(tool, "entity", name)
        return f"<think>{thought}</think>\n{body}" if self.think else body


def template_context(store: KnowledgeStore, graph: str, rollout: RolloutConfig) -> Any:
    """The Omne context of the rollouts (`rollout.context`, its max_new_tokens) in the text protocol."""
    return make_context("omne", store=store, graph=graph, **{**rollout.context, "max_new_tokens":
                                                            rollout.max_new_tokens, "tool_mode": "text"})


def template_trajectory(item: QAItem, context: Any, graph_app: Any = None,
                        think_weight: float = THINK_WEIGHT) -> dict[str, Any]:
    """The sft row of one question's template trajectory, run through the Omne graph (`graph_app`, built if
    None) in `context` (its store and graph); `NoTemplate` with the reason when there is none."""
    walk = TemplateWalk(item, context.store, context.graph, context.think)
    if walk.turns > context.max_rounds:
        raise NoTemplate("too many hops")
    policy = FakeChatModel(respond=walk.reply)
    graph_app = graph_app or build_graph("omne")
    output = graph_app.invoke({"question": item.question, "topic_entities": list(item.topic_entities)},
                              context=dataclasses.replace(context, llm=policy))
    if walk.reason:
        raise NoTemplate(walk.reason)
    if output.get("guards"):
        raise NoTemplate("sent back")
    if output.get("error") or not score(output.get("answer"), item.answers)[0] or len(policy.calls) != walk.turns:
        raise NoTemplate("graph")
    prompts = [chat_dicts(call) for call in policy.calls]
    if any(p != prompts[-1][:len(p)] for p in prompts):
        raise NoTemplate("context")
    messages = [*prompts[-1], {"role": "assistant", "content": walk.said[-1]}]
    if [m["content"] for m in messages if m["role"] == "assistant"] != walk.said:
        raise NoTemplate("graph")  # the graph kept a reply otherwise than written
    return {"id": item.id, "question": item.question, "answers": list(item.answers), "prediction": output["answer"],
            "reward": 1.0, "agent": "omne", "conversation": 0, "roles": ["tool-agent"],
            "messages": [weighted_message(m["role"], m["content"], think_weight) for m in messages]}


def template_rows(items: Iterable[QAItem], context: Any, outcomes: list[dict[str, Any]],
                  think_weight: float = THINK_WEIGHT) -> Iterator[dict[str, Any]]:
    """The sft rows of the questions that yield a template trajectory; `outcomes` gets each question's (id, type,
    `made` or its skip reason)."""
    graph_app = build_graph("omne")
    for item in items:
        try:
            row = template_trajectory(item, context, graph_app, think_weight)
        except NoTemplate as skip:
            outcome, row = skip.reason, None
        else:
            outcome = MADE
        outcomes.append({"id": item.id, "type": item.type, "outcome": outcome})
        if row is not None:
            yield row


def rollout_templates(rollout: RolloutConfig, limit: int | None = None, think_weight: float = THINK_WEIGHT,
                      outcomes: list[dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], Counter]:
    """Template rows for at most `limit` questions of the rollout slice (`path`, `start`, `limit`) over its
    store (the file's graph ingested if missing), and the counts (`made` and skip reasons); `outcomes` gets each
    question's (`template_rows`)."""
    if not rollout.path:
        raise InvalidInput("templates need rollout.path (the benchmark file of the questions)")
    items = load_questions(rollout.dataset, rollout.path, rollout.limit, rollout.start)
    outcomes = [] if outcomes is None else outcomes
    with open_environment(rollout.store, rollout.dataset, rollout.path) as (store, env):
        if not env["graph"]:
            raise InvalidInput(f"{rollout.path} gives no knowledge graph as {rollout.dataset}; templates need a KG "
                               "dataset (2wiki evidences, pathquestion)")
        rows = []
        for row in template_rows(items, template_context(store, env["graph"], rollout), outcomes, think_weight):
            rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
    return rows, Counter(o["outcome"] for o in outcomes)


def export_templates(rollout: RolloutConfig, out: str | Path, limit: int | None = None,
                     think_weight: float = THINK_WEIGHT, rows: bool = True) -> Counter:
    """Write the template rows as `mhqa export --format sft` does (`save_to_disk(out)` and `out/sft.jsonl`,
    readable as Omne's `sft_data`; not with `rows=False`), and their records to commit: `counts.json` and
    `outcomes.jsonl.gz`, each question's id, type and outcome (`made` or its skip reason), which
    `training/template_yield.py` tables; returns the counts."""
    from mhqa_graph.eval import records
    from mhqa_graph.export import _datasets

    outcomes: list[dict[str, Any]] = []
    made, counts = rollout_templates(rollout, limit, think_weight, outcomes)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if made and rows:
        _datasets().Dataset.from_list(made, features=_features("sft")).save_to_disk(str(out))
        _write_jsonl(made, out / "sft.jsonl")
    skipped = {reason: n for reason, n in counts.most_common() if reason != MADE}
    (out / "counts.json").write_text(json.dumps({"path": rollout.path, "graph": environment_name(
        rollout.dataset, rollout.path), "start": rollout.start, "limit": rollout.limit, MADE: counts[MADE],
        "skipped": skipped}, indent=1) + "\n")
    records.write(out / OUTCOMES, outcomes)
    return counts
