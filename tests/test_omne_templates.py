"""Omne template trajectories (training/omne_templates.py) over small real stores: PathQuestion's 2-hop KB
and the evidence triples of the first 2Wiki dev rows, in hash-embedder stores. Every trajectory replays
through the real Omne graph with a scripted model that says its assistant turns: the graph shows the same
prompts (its system prompt, the real tool results), ends with the gold answer, and every turn is the
protocol's canonical form. Questions whose chain the tools cannot follow are skipped with their reason."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections import Counter

import pytest
from mhqa_graph.graphs import build_graph
from mhqa_graph.graphs.omne.protocol import canonical_reply, parse_reply
from mhqa_graph.training.configs import RolloutConfig  # noqa: E402
from mhqa_graph.training.omne_templates import (  # noqa: E402
    MADE,
    SKIPS,
    NoTemplate,
    plan_walk,
    rollout_templates,
    template_context,
    template_trajectory,
)
from mhqa_graph.training.rewards import OmneRewardConfig, format_reward  # noqa: E402

from mhqa_graph.eval.environments import open_environment
from mhqa_graph.eval.scoring import score
from mhqa_graph.ingest.datasets import QAItem, questions
from mhqa_graph.models.chat import chat_dicts
from mhqa_graph.testing.fakes import FakeChatModel

CONTEXT = {"max_rounds": 7, "think": True, "top_k": 5}
TWOWIKI_ROWS = 40
# PathQuestion lines whose gold chain the tools cannot follow: a gold fact that is not in the KB, and a
# start entity that is not in it
NOT_IN_KB = ("which nationality is frederica_of_mecklenburg-strelitz 's couple ?\tfrance(france/)\t"
             "frederica_of_mecklenburg-strelitz#spouse#ernest_augustus_i_of_hanover#nationality#france#<end>#france")
NO_START = ("who is the spouse of zorblat_quinterfax ?\tnobody(nobody/)\t"
            "zorblat_quinterfax#spouse#nobody#<end>#nobody")


@pytest.fixture(scope="module")
def pq(data_dir, tmp_path_factory) -> RolloutConfig:
    """The first 8 PQ-2H questions and the two above, beside the 2-hop KB."""
    folder = tmp_path_factory.mktemp("pq")
    shutil.copy(data_dir / "pathquestion" / "2H-kb.txt", folder / "2H-kb.txt")
    lines = (data_dir / "pathquestion" / "PQ-2H.txt").read_text(encoding="utf-8").splitlines()[:8]
    (folder / "PQ-2H.txt").write_text("\n".join([*lines, NOT_IN_KB, NO_START]) + "\n", encoding="utf-8")
    return RolloutConfig(agent="omne", dataset="pathquestion", path=str(folder / "PQ-2H.txt"),
                         store=f"embedded://{folder}/store?embedder=hash", context=CONTEXT)


@pytest.fixture(scope="module")
def wiki(data_dir, tmp_path_factory) -> RolloutConfig:
    """The first 2Wiki dev rows with evidences; their triples make the graph."""
    folder = tmp_path_factory.mktemp("wiki")
    rows = json.loads((data_dir / "2wikimultihopqa" / "dev_evidences.json").read_text(encoding="utf-8"))
    (folder / "dev_evidences.json").write_text(json.dumps(rows[:TWOWIKI_ROWS]), encoding="utf-8")
    return RolloutConfig(agent="omne", dataset="2wiki", path=str(folder / "dev_evidences.json"),
                         store=f"embedded://{folder}/store?embedder=hash", context=CONTEXT)


def items(rollout: RolloutConfig) -> dict[str, QAItem]:
    return {i.id: i for i in questions(rollout.dataset, rollout.path)}


def replay(row: dict, rollout: RolloutConfig) -> tuple[dict, FakeChatModel]:
    """Run the real Omne graph on the row's question with a scripted model saying the row's assistant turns."""
    said = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    item = items(rollout)[row["id"]]
    with open_environment(rollout.store, rollout.dataset, rollout.path) as (store, env):
        context = template_context(store, env["graph"], rollout)
        fake = FakeChatModel(responses=said, cycle=False)
        output = build_graph("omne").invoke({"question": item.question, "topic_entities": list(item.topic_entities)},
                                            context=dataclasses.replace(context, llm=fake))
    return output, fake


def check_replays(row: dict, rollout: RolloutConfig) -> None:
    """The row's trajectory through the graph: the same prompts, the gold answer, the canonical protocol."""
    item = items(rollout)[row["id"]]
    output, fake = replay(row, rollout)
    assert output["error"] is None and output["guards"] == []
    assert score(output["answer"], item.answers)[0] == 1 and output["answer"] == row["prediction"]
    messages = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
    assert chat_dicts(fake.calls[-1]) == messages[:-1]  # the graph's own prompt: system, question, real results
    said = [m["content"] for m in messages if m["role"] == "assistant"]
    assert len(fake.calls) == len(said) == output["rounds"]
    calls = [parse_reply(turn) for turn in said[:-1]]
    assert all(len(r.calls) == 1 and not r.calls[0]["error"] and r.answer is None and r.kept == turn
               for r, turn in zip(calls, said))
    assert calls[0].calls[0]["name"] == "entity_matcher"
    assert parse_reply(said[-1]).answer == output["answer"] and not parse_reply(said[-1]).calls
    assert all(canonical_reply(turn) == turn and turn.startswith("<think>") for turn in said)
    successful = sum(not c["repeated"] and not c["result_preview"].startswith("Error") for c in output["tool_calls"])
    assert successful == len(calls) and format_reward(said, OmneRewardConfig(think=True), successful) == 1
    shown = "\n".join(m["content"] for m in messages if m["role"] == "user")
    for hop in item.chain:  # every gold fact was in a tool result the graph fed back
        assert all(f"({s}) -[{r}]-> ({o})" in shown for s, r, o in hop.triples)
    weights = [seg["weight"] for m in row["messages"] if m["role"] == "assistant" for seg in m["segments"]]
    assert 0.001 in weights and 1.0 in weights
    assert all(m["weight"] == 0 for m in row["messages"] if m["role"] != "assistant")


def test_pathquestion_templates_replay_through_the_graph(pq):
    rows, counts = rollout_templates(pq)
    assert counts == Counter({MADE: 8, "fact missing": 1, "start not matched": 1})
    assert [r["id"] for r in rows] == [f"PQ-2H-{n}" for n in range(1, 9)]
    for row in rows:
        check_replays(row, pq)
    roles = [m["role"] for m in rows[0]["messages"]]  # entity_matcher, node_info on the two hops, the answer
    assert roles == ["system", "user"] + ["assistant", "user"] * 3 + ["assistant"]


def test_twowiki_templates_cover_every_question_type_and_replay(wiki):
    rows, counts = rollout_templates(wiki)
    assert sum(counts.values()) == TWOWIKI_ROWS and counts[MADE] == len(rows) >= TWOWIKI_ROWS // 2
    assert set(counts) - {MADE} <= set(SKIPS)
    by_id = items(wiki)
    assert {by_id[r["id"]].type for r in rows} == {"compositional", "comparison", "bridge_comparison", "inference"}
    assert {"yes", "no"} & {r["prediction"] for r in rows}  # yes/no answers, stated after the facts
    two_starts = [r for r in rows if sum('"entity_matcher"' in m["content"] for m in r["messages"]
                                         if m["role"] == "assistant") == 2]
    assert two_starts  # comparisons look up both entities the question names
    for row in rows:
        check_replays(row, wiki)


def test_a_changed_trajectory_does_not_replay(pq):
    """The replay checks can fail: a row with another tool result, or another answer, is told apart."""
    row = rollout_templates(pq, limit=1)[0][0]
    result = next(i for i, m in enumerate(row["messages"]) if m["content"].startswith("<tool_response>\nEntity:"))
    forged = json.loads(json.dumps(row))
    forged["messages"][result]["content"] = forged["messages"][result]["content"].replace("spouse", "sibling")
    with pytest.raises(AssertionError):
        check_replays(forged, pq)
    wrong = json.loads(json.dumps(row))
    wrong["messages"][-1]["content"] = wrong["messages"][-1]["content"].replace(row["prediction"], "france")
    output, _ = replay(wrong, pq)
    assert score(output["answer"], items(pq)[row["id"]].answers)[0] == 0


def test_questions_the_tools_cannot_follow_are_counted(pq):
    """Each skip has its reason: a result cut short, too few rounds, a hop that no fact reaches, a start the
    question does not name, an answer outside the chain, no chain at all (and, in the fixture, a gold fact
    missing from the KB and a start entity_matcher does not find: see the PathQuestion test)."""
    first = items(pq)["PQ-2H-1"]
    hop_from_elsewhere = dataclasses.replace(first, chain=(first.chain[0], dataclasses.replace(
        first.chain[1], triples=(("united kingdom", "nationality", "hanover"),))))
    unnamed = dataclasses.replace(first, question="which nationality is her couple ?", topic_entities=())
    cases = [(first, {"result_chars": 60}, "fact cut"), (first, {"max_rounds": 3}, "too many hops"),
             (hop_from_elsewhere, {}, "chain broken"), (unnamed, {}, "start not named"),
             (dataclasses.replace(first, chain=()), {}, "no chain"),
             (dataclasses.replace(first, answers=("paris",)), {}, "answer not in chain")]
    with open_environment(pq.store, pq.dataset, pq.path) as (store, env):
        assert template_trajectory(first, template_context(store, env["graph"], pq))["id"] == "PQ-2H-1"
        for item, settings, reason in cases:
            rollout = dataclasses.replace(pq, context={**CONTEXT, **settings})
            with pytest.raises(NoTemplate) as skip:
                template_trajectory(item, template_context(store, env["graph"], rollout))
            assert skip.value.reason == reason
    walk = plan_walk(first)
    assert [(v.entity, v.match) for v in walk] == [("frederica of mecklenburg-strelitz", True),
                                                   ("ernest augustus i of hanover", False)]


def test_the_trainer_takes_templates_as_its_sft_data(pq, tmp_path):
    pytest.importorskip("trl")
    from mhqa_graph.training.configs import DevConfig, ModelConfig
    from mhqa_graph.training.omne import LOG, OmneConfig, OmneTrainer

    from mhqa_graph.errors import InvalidInput
    from mhqa_graph.export import tokenize_with_weights

    cfg = OmneConfig(model=ModelConfig(name="tiny"), rollout=pq, dev=DevConfig(), stages=[1], warm_start=True,
                     templates=3, output_dir=str(tmp_path / "out"))
    trainer = OmneTrainer(cfg)
    rows = trainer.sft_data()  # no teacher, no rollouts: the templates are the warm start's data
    assert len(rows) == 3 and all(set(r) == {"messages"} for r in rows)
    ids, weights = tokenize_with_weights(trainer.tokenizer, rows[0]["messages"])  # as WeightedSFTTrainer reads them
    assert len(ids) == len(weights) and {0.0, 0.001, 1.0} <= set(weights)
    assert all(m["content"].startswith("<think>") for r in rows for m in r["messages"] if m["role"] == "assistant")
    logged = [json.loads(line) for line in (tmp_path / "out" / LOG).read_text().splitlines()]
    assert logged == [{"event": "templates", MADE: 3}]
    with pytest.raises(InvalidInput, match="templates"):
        OmneConfig(rollout=pq, templates=-1)
    with pytest.raises(InvalidInput, match="warm_start needs"):
        OmneConfig(rollout=pq, stages=[1], warm_start=True)


def test_cli_exports_templates_as_sft_data(wiki, tmp_path):
    from mhqa_graph.training.omne import read_sft_data

    out = tmp_path / "templates"
    done = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "templates", "--dataset", "2wiki", "--path",
                           wiki.path, "--store", wiki.store, "--limit", "10", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    counts = json.loads((out / "counts.json").read_text())
    made = counts[MADE]
    assert f"templates: {made} of 10 questions" in done.stdout and made > 0
    assert len(read_sft_data(str(out))) == len(read_sft_data(str(out / "sft.jsonl"))) == made
    assert made + sum(counts["skipped"].values()) == 10 and set(counts["skipped"]) <= set(SKIPS)
    assert all(f"skipped, {reason}: {n} (" in done.stdout for reason, n in counts["skipped"].items())


def test_template_records_hold_each_questions_outcome_and_table_the_yield(pq, wiki, tmp_path, capsys):
    """`--no-rows` writes only the records to commit; each question's outcome adds up to counts.json, and
    training/template_yield.py tables them, by question type where a file has several."""
    from mhqa_graph.training import template_yield
    from mhqa_graph.training.omne_templates import OUTCOMES, export_templates

    from mhqa_graph.errors import InvalidInput
    from mhqa_graph.eval.records import load

    for name, rollout in (("pq", pq), ("wiki", wiki)):
        done = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "templates", "--dataset", rollout.dataset,
                               "--path", rollout.path, "--store", rollout.store, "--limit", "10", "--no-rows",
                               "--out", str(tmp_path / name)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["counts.json", OUTCOMES]
    outcomes = load(tmp_path / "pq" / OUTCOMES)
    assert [o["outcome"] for o in outcomes] == [MADE] * 8 + ["fact missing", "start not matched"]
    assert len(outcomes) == len({o["id"] for o in outcomes}) == 10
    wiki_outcomes = load(tmp_path / "wiki" / OUTCOMES)
    counts = json.loads((tmp_path / "wiki" / "counts.json").read_text())
    assert sum(o["outcome"] == MADE for o in wiki_outcomes) == counts[MADE]
    assert export_templates(dataclasses.replace(wiki, limit=10), tmp_path / "again", rows=False) == Counter(
        o["outcome"] for o in load(tmp_path / "wiki" / OUTCOMES))  # the same walk, the same outcomes

    template_yield.main([str(tmp_path / "pq"), str(tmp_path / "wiki")])
    printed = capsys.readouterr().out
    assert "| `PQ-2H.txt` (pathquestion-2H-kb) | 10 | 8 (80%) | fact missing 1, start not matched 1 |" in printed
    made_by_type = [line for line in printed.splitlines() if line.startswith("| `dev_evidences.json` |")]
    assert len(made_by_type) >= 2 and sum(int(line.split("|")[4]) for line in made_by_type) == counts[MADE]
    with pytest.raises(InvalidInput, match="outcomes"):
        template_yield.main([str(tmp_path)])
