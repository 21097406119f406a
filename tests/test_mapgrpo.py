"""MAPGRPO on a tiny random Qwen2, a hash-embedder store and a tiny HotpotQA file: the role rewards run
the real OPERA graph and store against the gold chains, an expert completion anchors its GRPO group (and
is trained on only when asked), each role trains its own adapter while the earlier ones stay frozen, and
the three roles train progressively end to end (LoRA and full fine-tuning)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("trl")
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from mhqa_graph.training import dev as dev_module  # noqa: E402
from mhqa_graph.training import mapgrpo, policy  # noqa: E402
from mhqa_graph.training.configs import DevConfig, RolloutConfig, load_config  # noqa: E402
from mhqa_graph.training.logs import read_log  # noqa: E402
from mhqa_graph.training.mapgrpo import (  # noqa: E402
    ExpertGRPOTrainer,
    MAPGRPOConfig,
    MAPGRPOTrainer,
    RoleRewards,
    first_prompt,
    grpo_args,
    load_expert,
    prompt_key,
    shown_passages,
    stage_rows,
)
from mhqa_graph.training.rewards import AnalysisRewardConfig, PlanRewardConfig, RewriteRewardConfig  # noqa: E402
from mhqa_graph.training.rollouts import rollouts  # noqa: E402
from mhqa_graph.training.tiny import tiny_model_and_tokenizer  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from test_eval import ROWS, write_dataset  # noqa: E402

from mhqa_graph.errors import InvalidInput  # noqa: E402
from mhqa_graph.eval import environment_name, prepare  # noqa: E402
from mhqa_graph.eval.runner import load_questions  # noqa: E402
from mhqa_graph.export import export, role_rows  # noqa: E402
from mhqa_graph.ingest.datasets import Hop  # noqa: E402
from mhqa_graph.store import open_store  # noqa: E402
from mhqa_graph.testing.fakes import FakeChatModel  # noqa: E402

YAML = Path(__file__).resolve().parent.parent / "configs" / "train" / "mapgrpo.yaml"
CONTEXT = {"max_rounds": 2, "max_rewrites": 1}
GOLD = {question: answer for question, answer, _, _ in ROWS.values()}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    """The tiny HotpotQA file and a hash-embedder store holding its corpus."""
    root = tmp_path_factory.mktemp("mapgrpo")
    data = write_dataset(root / "tiny.jsonl")
    uri = f"embedded://{root}/s?embedder=hash"
    with open_store(uri) as store:
        corpus = prepare(store, "hotpotqa", data, environment_name("hotpotqa", data))["corpus"]
    return {"root": root, "data": data, "store": uri, "corpus": corpus}


def expert_model() -> FakeChatModel:
    """A scripted strong OPERA: plans the question as one sub-goal, finds the evidence insufficient on the
    first attempt (so it rewrites) and answers right after the rewrite."""
    seen: set[str] = set()

    def respond(messages) -> str:
        system, user = messages[0].text, messages[-1].text
        question = user.split("Question: ", 1)[-1].split("\n", 1)[0].strip()
        if system.startswith("You are the Plan agent"):
            return json.dumps({"subgoals": [question]})
        if system.startswith("You are the Analysis-Answer agent"):
            if question not in seen:
                seen.add(question)
                return json.dumps({"reasoning": "not stated", "sufficient": False, "answer": ""})
            return json.dumps({"reasoning": "stated", "sufficient": True, "answer": GOLD.get(question, "")})
        if system.startswith("You are the Rewrite agent"):
            return json.dumps({"query": f"{question} {GOLD.get(question, '')}"})
        return GOLD.get(question, "unknown")

    return FakeChatModel(respond=respond)


@pytest.fixture(scope="module")
def expert_dir(env) -> Path:
    """`mhqa export --format roles` of the scripted expert's run over the first two questions."""
    cfg = RolloutConfig(agent="opera", dataset="hotpotqa", path=str(env["data"]), store=env["store"], limit=2,
                        context=CONTEXT)
    records = rollouts(cfg, expert_model(), env["root"] / "expert_run")
    assert [r["f1"] for r in records] == [1.0, 1.0]
    counts = export(env["root"] / "expert_run" / "sample0", "roles", env["root"] / "expert")
    assert counts == {"plan": 2, "analysis": 4, "rewrite": 2}
    return env["root"] / "expert"


def config(env, out: Path, **changes) -> MAPGRPOConfig:
    """The example YAML made tiny: rollouts of one question; one epoch of GRPO steps of one group each."""
    cfg = load_config(MAPGRPOConfig, YAML)
    cfg.model.name, cfg.model.lora_r = "tiny", 4
    cfg.rollout.dataset, cfg.rollout.path, cfg.rollout.store = "hotpotqa", str(env["data"]), env["store"]
    cfg.rollout.limit, cfg.rollout.start, cfg.rollout.max_new_tokens, cfg.rollout.context = 1, 0, 12, dict(CONTEXT)
    cfg.dev = DevConfig()
    cfg.grpo = dict(num_generations=2, beta=0.0, per_device_train_batch_size=2, num_train_epochs=1, learning_rate=0.05,
                    max_completion_length=12)
    cfg.output_dir = str(out)
    for key, value in changes.items():
        setattr(cfg, key, value)
    return cfg


# -- config --------------------------------------------------------------------------------------
def test_example_config_loads_with_the_issue_weights():
    cfg = load_config(MAPGRPOConfig, YAML)
    assert cfg.plan_reward == PlanRewardConfig(logic=0.4, structure=0.2, execution=0.4)
    assert cfg.analysis_reward == AnalysisRewardConfig(sufficiency=0.3, accuracy=0.5, format=0.2)
    assert cfg.rewrite_reward == RewriteRewardConfig(retrieval=0.8, format=0.2)
    assert cfg.roles == ["plan", "analysis", "rewrite"] and cfg.rollout.agent == "opera"
    assert cfg.inject_roles == ["plan"] and cfg.expert_gradient is False
    args = grpo_args(cfg, "/tmp/unused")
    assert (args.num_generations, args.beta) == (cfg.grpo["num_generations"], cfg.grpo["beta"]) == (4, 0.04)


@pytest.mark.parametrize("change, message", [
    ({"roles": ["analysis", "plan"]}, "progressively"),
    ({"roles": ["plan", "plan"]}, "progressively"),
    ({"roles": ["answer"]}, "roles must be"),
    ({"roles": []}, "roles must be"),
    ({"grpo": {"num_generations": 1, "per_device_train_batch_size": 1}}, "at least 2 generations"),
    ({"grpo": {"beta": -0.1}}, "beta"),
    ({"grpo": {"no_such_argument": 1}}, "grpo"),
    ({"grpo": {"num_generations": 3, "per_device_train_batch_size": 4}}, "grpo"),  # batch not a multiple of G
    ({"plan_reward": PlanRewardConfig(logic=-1.0)}, "non-negative"),
    ({"inject_roles": ["answer"]}, "inject_roles"),
    ({"expert": "/no/such/folder"}, "expert"),
    ({"executor": ""}, "executor"),
    ({"heldout": -1}, "heldout"),
    ({"heldout_every": 0}, "heldout_every"),
    ({"heldout": 1}, "leaves no rollout question"),  # the rollouts have one question
])
def test_bad_configs_raise_invalid_input(env, tmp_path, change, message):
    with pytest.raises(InvalidInput, match=message):
        MAPGRPOTrainer(config(env, tmp_path, **change))


@pytest.mark.parametrize("name", ["mapgrpo-analysis", "mapgrpo-plan"])
def test_the_learning_configs_see_several_prompts_per_step_and_hold_prompts_back(name):
    cfg = load_config(MAPGRPOConfig, YAML.parent / "learn" / f"{name}.yaml")
    args = grpo_args(cfg, "/tmp/unused", heldout=True)
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps // args.num_generations >= 4
    assert args.generation_batch_size == args.per_device_train_batch_size * args.gradient_accumulation_steps
    assert args.max_steps >= 6 and cfg.heldout >= 4 and args.eval_strategy == "steps"
    assert args.eval_steps == cfg.heldout_every and args.per_device_eval_batch_size % args.num_generations_eval == 0
    assert cfg.dev.limit >= 100 and cfg.rollout.limit > cfg.heldout
    if name == "mapgrpo-plan":  # the paper's high-score sample selection: an expert plan in each group
        assert cfg.roles == ["plan"] and cfg.expert and cfg.inject_roles == ["plan"] and not cfg.expert_gradient
    else:
        assert cfg.roles == ["analysis"]


def test_bad_yaml_raises_invalid_input(env, tmp_path):
    (tmp_path / "a.yaml").write_text(YAML.read_text() + "\nlearning_rate: 0.1\n")
    with pytest.raises(InvalidInput, match="unknown key"):
        load_config(MAPGRPOConfig, tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text(YAML.read_text().replace("agent: opera", "agent: rag"))
    with pytest.raises(InvalidInput, match="opera"):
        MAPGRPOTrainer(load_config(MAPGRPOConfig, tmp_path / "b.yaml"))


# -- rewards -------------------------------------------------------------------------------------
def executor_model() -> FakeChatModel:
    """Finds the answer only for the sub-goal that names Alpha; the synthesis repeats the findings' answer."""
    def respond(messages) -> str:
        system, user = messages[0].text, messages[-1].text
        if system.startswith("You are the Analysis-Answer agent"):
            found = "Current sub-goal: Which city did the band Alpha" in user
            return json.dumps({"reasoning": "", "sufficient": found, "answer": "Tulsa" if found else ""})
        if system.startswith("You are the Rewrite agent"):
            return json.dumps({"query": "something else"})
        return "Tulsa" if "-> Tulsa" in user else "unknown"

    return FakeChatModel(respond=respond)


def test_plan_reward_executes_the_plan_through_opera(env, tmp_path):
    cfg = config(env, tmp_path)
    executor = executor_model()
    question = "Which city did the band Alpha first perform in?"
    plans = [json.dumps({"subgoals": [question]}), json.dumps({"subgoals": ["Who founded Gamma Records?"]}),
             "no plan at all"]
    logged = {}
    with open_store(env["store"], read_only=True) as store:
        rewards = RoleRewards(cfg, store, env["corpus"], None, executor)
        scores = rewards.plan([[{"role": "assistant", "content": p}] for p in plans], question=[question] * 3,
                              answers=[["Tulsa"]] * 3, chain=["[]"] * 3, log_metric=logged.__setitem__)
        # right plan: logic + structure + execution; wrong sub-goal: no answer; no plan: OPERA plans the
        # question as its only sub-goal, which answers it, so only the execution share
        assert scores == pytest.approx([1.0, 0.6, 0.4])
        assert logged["plan/execution"] == pytest.approx(2 / 3) and rewards.executions == 3
        asked = [m[-1].text for m in executor.calls if m[0].text.startswith("You are the Analysis-Answer")]
        assert any("Current sub-goal: Who founded Gamma Records?" in text for text in asked)
        calls = len(executor.calls)
        assert rewards.plan([plans[0]], question=[question], answers=[["Tulsa"]], chain=["[]"]) == pytest.approx([1.0])
        assert len(executor.calls) == calls and rewards.executions == 3  # cached


def test_rewrite_reward_is_the_root_ndcg_of_the_new_query_in_the_store(env, tmp_path):
    cfg = config(env, tmp_path)
    cfg.rollout.context = {"top_k": 1}
    item = load_questions("hotpotqa", env["data"])[0]  # Page q1, about Tulsa
    chain = json.dumps([{"passage_ids": list(h.passage_ids)} for h in item.chain])
    with open_store(env["store"], read_only=True) as store:
        rewards = RoleRewards(cfg, store, env["corpus"], None, None)
        right, wrong = "Which city did the band Alpha first perform in?", "In which year was Delta born?"
        assert rewards.search(right)[0][0] == item.supporting_ids[0]
        assert item.supporting_ids[0] not in [i for i, _ in rewards.search(wrong)]
        completions = [json.dumps({"query": right}), json.dumps({"query": wrong}), '{"query": ""}']
        logged = {}
        scores = rewards.rewrite(completions, query=[right] * 3, supporting_ids=[list(item.supporting_ids)] * 3,
                                 step=[1] * 3, steps=[1] * 3, chain=[chain] * 3, log_metric=logged.__setitem__)
        # a query that keeps the gold passage at rank 1 is worth the most, even without a gain over the old one
        assert scores[:2] == pytest.approx([1.0, 0.2])
        assert scores[2] == pytest.approx(0.8)  # an empty query: OPERA searches the old one again; no format share
        assert logged["rewrite/ndcg"] == pytest.approx(2 / 3)
        no_chain = rewards.rewrite(completions[:1], query=[wrong], supporting_ids=[list(item.supporting_ids)],
                                   step=[1], steps=[1], chain=["[]"])
        assert no_chain == pytest.approx([1.0])  # the supporting passages stand in for the chain


def test_analysis_reward_reads_what_the_prompt_showed(env, tmp_path):
    cfg = config(env, tmp_path)
    user = ("Question: Where was the director of Inception born?\nEarlier findings:\n1. Who directed Inception? -> "
            "Christopher Nolan\nCurrent sub-goal: Where was Christopher Nolan born?\n\nRetrieved passages:\n"
            "[1] Christopher Nolan: (Christopher Nolan) -[place of birth]-> (London)\n\nReply with JSON only, in "
            "this format:\n{}")
    prompt = [{"role": "system", "content": "You are the Analysis-Answer agent."}, {"role": "user", "content": user}]
    assert shown_passages(prompt) == "[1] Christopher Nolan: (Christopher Nolan) -[place of birth]-> (London)"
    chain = json.dumps([{"answer": "Christopher Nolan", "triples": [["Inception", "director", "Christopher Nolan"]]},
                        {"answer": "London", "triples": [["Christopher Nolan", "place of birth", "London"]]}])
    found = '{"sufficient": true, "answer": "London"}'
    with open_store(env["store"], read_only=True) as store:
        rewards = RoleRewards(cfg, store, env["corpus"], None, None)
        scores = rewards.analysis([prompt, prompt], [found, '{"sufficient": false, "answer": ""}'],
                                  answers=[["London"]] * 2, shown_ids=[["Christopher Nolan"]] * 2, step=[2, 1],
                                  steps=[2, 2], chain=[chain, chain])
    # step 2 saw its hop's fact and answered it; step 1's fact (Inception's director) is not in these passages
    assert scores == pytest.approx([1.0, 0.3 + 0.2])


def test_role_rows_carry_step_and_gold_chain_and_repairs_are_cut(env, tmp_path):
    cfg = RolloutConfig(agent="opera", dataset="hotpotqa", path=str(env["data"]), store=env["store"], limit=1,
                        context=CONTEXT)
    records = rollouts(cfg, expert_model(), tmp_path / "run")
    rows = role_rows(records)
    analysis_rows, _ = stage_rows(rows["analysis"], {}, lambda qid: [Hop(passage_ids=("x",))] if qid == "q1" else [])
    assert [(r["step"], r["steps"]) for r in analysis_rows] == [(1, 1), (1, 1)]  # one sub-goal, two attempts
    first, second = (set(r["shown_ids"]) for r in analysis_rows)  # the second was shown the first's passages too
    assert first and first <= second and len(second) > len(first)
    assert all(json.loads(r["chain"]) == [{"question": None, "answer": None, "passage_ids": ["x"], "triples": []}]
               for r in analysis_rows)
    prompt = analysis_rows[0]["prompt"]
    repaired = [*prompt, {"role": "assistant", "content": "oops"},
                {"role": "user", "content": "That reply could not be used (no JSON). Reply again."}]
    assert first_prompt(repaired) == prompt


def test_expert_rows_load_from_the_export_folder(expert_dir):
    plan = load_expert(expert_dir, "plan", min_score=1.0)
    assert len(plan) == 2 and all(json.loads(e["expert"])["subgoals"] for e in plan.values())
    jsonl = expert_dir.parent / "expert_jsonl"
    jsonl.mkdir()
    (jsonl / "rewrite.jsonl").write_text((expert_dir / "rewrite.jsonl").read_text())
    rewrite = load_expert(jsonl, "rewrite")
    assert len(rewrite) == 2 and all(e["row"]["query"] and e["row"]["supporting_ids"] for e in rewrite.values())
    assert load_expert(jsonl, "plan") == {} and load_expert(expert_dir, "plan", min_score=2.0) == {}


# -- expert injection ----------------------------------------------------------------------------
def completion_logp(model, tokenizer, prompt: list[dict], ids: list[int]) -> float:
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True)["input_ids"]
    inputs = torch.tensor([prompt_ids + ids], device=model.device)
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=inputs).logits[0, :-1], dim=-1)
    return sum(logps[len(prompt_ids) - 1 + i, t].item() for i, t in enumerate(ids))


@pytest.mark.parametrize("gradient", [False, True])
def test_expert_completion_anchors_its_group_and_is_trained_on_when_asked(tmp_path, gradient):
    model, tokenizer = tiny_model_and_tokenizer(seed=5)
    with_expert = [{"role": "user", "content": "Who directed Inception?"}]
    without = [{"role": "user", "content": "Where was Nolan born?"}]
    expert = '{"subgoals": ["Who directed Inception?"]}'
    expert_ids = tokenizer(expert, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    group = 4
    seen = []

    def reward(completions, **_):
        texts = [c[0]["content"] for c in completions]
        seen.append(texts)
        return [float(t == expert) for t in texts]

    args = grpo_args(MAPGRPOConfig(grpo={"num_generations": group, "per_device_train_batch_size": 2 * group,
                                         "max_steps": 1, "learning_rate": 0.05, "max_completion_length": 8}),
                     tmp_path, expert_slot=True)
    assert args.num_generations == group + 1 and args.per_device_train_batch_size == 2 * (group + 1)
    trainer = ExpertGRPOTrainer(model, reward_funcs=[reward], args=args,
                                train_dataset=Dataset.from_list([{"prompt": with_expert}, {"prompt": without}]),
                                processing_class=tokenizer, experts={prompt_key(with_expert): expert},
                                expert_gradient=gradient)
    batches = []
    score_batch = trainer._generate_and_score_completions

    def capture(inputs):
        batches.append((inputs, score_batch(inputs)))
        return batches[-1][1]

    trainer._generate_and_score_completions = capture
    before = completion_logp(model, tokenizer, with_expert, expert_ids)
    trainer.train()
    after = completion_logp(trainer.model, tokenizer, with_expert, expert_ids)

    (inputs, out), = batches
    prompts = [x["prompt"] for x in inputs]
    texts = seen[0]
    rows = [i for i, t in enumerate(texts) if t == expert]
    assert len(rows) == 1 and prompts[rows[0]] == with_expert  # one member of that group, none elsewhere
    members = [i for i, p in enumerate(prompts) if p == with_expert]
    assert len(members) == group + 1 and rows[0] == members[-1]  # added to the group's samples, not one of them
    i = rows[0]
    assert out["completion_ids"][i][:len(expert_ids)].tolist() == expert_ids
    # its reward is in the group's baseline: the sampled members fall below it
    rewards = torch.tensor([float(texts[j] == expert) for j in members])
    expected = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    torch.testing.assert_close(out["advantages"][members], expected, atol=1e-4, rtol=0)
    assert out["advantages"][i] > 0 and all(out["advantages"][j] < 0 for j in members if j != i)
    sampled = out["completion_mask"].sum() - out["completion_mask"][i].sum()
    if gradient:
        assert out["completion_mask"][i].sum().item() == len(expert_ids)  # its tokens are in the loss
        assert after > before  # the positive advantage made the expert completion more likely
    else:
        assert out["completion_mask"][i].sum().item() == 0  # no direct gradient: it only anchors
    assert out["num_items_in_batch"].item() == sampled.item() + (len(expert_ids) if gradient else 0)



def test_the_expert_sample_works_with_vllms_sampling_logprobs(tmp_path, monkeypatch):
    """With `use_vllm` TRL gets each sampled token's log-probability from vLLM and corrects for the mismatch
    with the trainer's policy (importance sampling). The expert completion was not sampled: its tokens get NaN
    (not None, which `torch.tensor` refuses), which TRL reads as ratio 1, so the group scores and its loss is
    finite. TRL's vLLM client is stood in for."""
    model, tokenizer = tiny_model_and_tokenizer(seed=5)
    prompt = [{"role": "user", "content": "Who directed Inception?"}]
    expert = '{"subgoals": ["Who directed Inception?"]}'
    group = 2
    args = grpo_args(MAPGRPOConfig(grpo={"num_generations": group, "per_device_train_batch_size": group,
                                         "max_steps": 1, "max_completion_length": 8}), tmp_path, expert_slot=True)
    trainer = ExpertGRPOTrainer(model, reward_funcs=[lambda completions, **_: [1.0] * len(completions)], args=args,
                                train_dataset=Dataset.from_list([{"prompt": prompt}]), processing_class=tokenizer,
                                experts={prompt_key(prompt): expert})

    class StandInVLLM:  # TRL's vLLM client: per prompt row, token ids and each token's top log-probabilities
        def sync_weights(self) -> None:
            pass

        def generate(self, prompts, images, num_generations, profiler):
            ids = [tokenizer("Nolan", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                   for _ in prompts]
            return None, ids, [[[-0.5]] * len(seq) for seq in ids], None

    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer.vllm_generation, trainer._last_loaded_step = StandInVLLM(), 0
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    out = trainer._generate_and_score_completions([{"prompt": prompt}] * (group + 1))
    sampled = out["sampling_per_token_logps"]
    assert torch.isnan(sampled[group]).all() and not torch.isnan(sampled[:group]).any()  # the expert: last place
    assert torch.all(out["importance_sampling_ratio"][group] == 1)
    loss = trainer.compute_loss(trainer.model, out)
    assert torch.isfinite(loss)


# -- end to end ----------------------------------------------------------------------------------
def log_entries(out: Path) -> list[dict]:
    return read_log(out / "log.jsonl")


def test_progressive_lora_training_end_to_end(env, expert_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    cfg = config(env, out, expert=str(expert_dir), expert_min_score=1.0)
    cfg.grpo["beta"] = 0.04  # KL to TRL's "ref" copy of the adapter, dropped after each stage
    cfg.dev = DevConfig(path=str(env["data"]), start=4, limit=1, min_questions=1)
    # the tiny model's own analyses all score 0 and its rewrites are noise that ranks the gold passage alike
    # (no JSON, so no format share either): the experts' completions give each group a signal
    cfg.inject_roles = ["plan", "analysis", "rewrite"]
    trainer = MAPGRPOTrainer(cfg)
    seen = []

    def snapshot() -> dict:
        return {k: v.detach().clone() for k, v in trainer.model.named_parameters() if "lora_B" in k}

    def watched(cfg, llm, out_dir, role_llms=None, **kwargs):  # the weights each stage's rollouts run with
        assert llm._model is trainer.model and cfg.agent == "opera"
        assert {r: m.adapter for r, m in role_llms.items()} == {"plan": "plan", "analysis": "analysis",
                                                               "rewrite": "rewrite", "answer": None}
        seen.append(snapshot())
        return rollouts(cfg, llm, out_dir, role_llms, **kwargs)

    monkeypatch.setattr(mapgrpo, "rollouts", watched)
    monkeypatch.setattr(dev_module, "rollouts",
                        lambda cfg, llm, out, role_llms=None, **_: dev_runs.append(role_llms) or [])
    dev_runs = []
    summary = trainer.train()
    seen.append(snapshot())
    assert list(summary["dev"]) == ["untrained", "plan", "analysis", "rewrite"] and len(dev_runs) == 4
    assert all(m.temperature == 0.0 and m.adapter == r for roles in dev_runs for r, m in roles.items() if r != "answer")

    assert list(summary["roles"]) == ["plan", "analysis", "rewrite"]
    plan = summary["roles"]["plan"]
    # the policy's plan prompt (a repaired one cut back to the first ask) is the expert's of that question,
    # plus the expert's of the other question
    assert plan["steps"] == plan["prompts"] == plan["expert_prompts"] == 2 and plan["plan_executions"] > 0
    analysis, rewrite = summary["roles"]["analysis"], summary["roles"]["rewrite"]
    assert analysis["steps"] == analysis["prompts"] > analysis["expert_prompts"] > 0
    assert rewrite["steps"] == rewrite["prompts"] > rewrite["expert_prompts"] > 0

    def adapter(snapshot: dict, role: str) -> dict:
        return {k: v for k, v in snapshot.items() if f".{role}." in k}

    # LoRA B starts at zero; each stage trains its own role's adapter only; the earlier ones stay frozen
    assert all(not v.any() for v in seen[0].values())
    assert any(v.any() for v in adapter(seen[1], "plan").values())
    assert not any(v.any() for role in ("analysis", "rewrite") for v in adapter(seen[1], role).values())
    for role, later in (("plan", 2), ("plan", 3), ("analysis", 3)):
        assert all(torch.equal(v, seen[later][k]) for k, v in adapter(seen[later - 1], role).items())
    assert any(v.any() for v in adapter(seen[2], "analysis").values())
    assert any(v.any() for v in adapter(seen[3], "rewrite").values())
    logs = log_entries(out)
    for role, stage in summary["roles"].items():
        steps = [e for e in logs if e.get("role") == role and f"rewards/{role}/mean" in e]
        assert len(steps) == stage["steps"]
        assert all(k in e for e in steps for k in ("loss", "reward", "reward_std", "kl", "expert/injected"))
        assert sum(e["expert/injected"] for e in steps) == stage["expert_prompts"]  # once in each expert's group
        assert all(e["reward_std"] > 0 for e in steps if e["expert/injected"])
        assert [e["event"] for e in logs if e.get("role") == role and "event" in e] == ["rollouts"]
    assert any("plan/execution" in e for e in logs) and any("rewrite/ndcg" in e for e in logs)
    final = Path(summary["final"])
    assert not (final / "ref").exists() and not (final / "adapter_model.safetensors").exists()
    for role in ("plan", "analysis", "rewrite"):
        weights = load_file(final / role / "adapter_model.safetensors")
        assert any("lora_B" in k and v.abs().sum() > 0 for k, v in weights.items())


def test_a_role_with_too_few_prompts_for_a_step_is_skipped(env, expert_dir, tmp_path):
    out = tmp_path / "run"
    cfg = config(env, out, roles=["rewrite"], expert=str(expert_dir))  # inject_roles: plan only
    cfg.grpo["per_device_train_batch_size"] = 200
    summary = MAPGRPOTrainer(cfg).train()
    assert summary["roles"]["rewrite"]["steps"] == 0
    assert summary["roles"]["rewrite"]["prompts"] > 0 == summary["roles"]["rewrite"]["expert_prompts"]
    assert [e["event"] for e in log_entries(out)] == ["rollouts", "skipped", "saved"]
    assert (Path(summary["final"]) / "rewrite" / "adapter_config.json").is_file()


def test_full_finetuning_with_kl_end_to_end(env, expert_dir, tmp_path):
    out = tmp_path / "run"
    cfg = config(env, out, expert=str(expert_dir), roles=["analysis", "rewrite"], inject_roles=["analysis", "rewrite"],
                 expert_gradient=True)
    cfg.model.lora = False
    cfg.grpo |= {"beta": 0.1, "max_steps": 2, "per_device_train_batch_size": 4}
    summary = MAPGRPOTrainer(cfg).train()
    assert [s["steps"] for s in summary["roles"].values()] == [2, 2]
    start, _ = tiny_model_and_tokenizer(seed=cfg.model.seed)
    final = load_file(Path(summary["final"]) / "model.safetensors")
    changed = [k for k, v in start.state_dict().items() if k in final and not torch.equal(v, final[k])]
    assert changed
    logs = log_entries(out)
    assert all("kl" in e for e in logs if "reward" in e) and not (out / "analysis" / "reference").exists()


def test_role_models_served_by_llamacpp_write_one_adapter_per_role(env, tmp_path, monkeypatch):
    from mhqa_graph.training.mapgrpo import OPERA_ROLES

    trainer = MAPGRPOTrainer(config(env, tmp_path / "run"))
    with torch.no_grad():  # fresh adapters have B = 0; tell the roles apart
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    for module in (policy, dev_module, mapgrpo):
        monkeypatch.setattr(module, "serves_with_llamacpp", lambda model, cfg: True)
    monkeypatch.setattr("mhqa_graph.models.factory.load_chat_model", lambda spec, **kwargs: spec)
    base, roles = trainer.role_models(0.0, tmp_path / "dev")
    assert base == "llamacpp:tiny" and roles["answer"] == base
    files = {role: tmp_path / "dev" / f"{role}.gguf" for role in OPERA_ROLES}
    assert {role: roles[role] for role in OPERA_ROLES} == {r: f"llamacpp:tiny?lora=file:{f}" for r, f in files.items()}
    contents = {f.read_bytes() for f in files.values()}
    assert len(contents) == len(OPERA_ROLES)  # each role's own weights


def test_held_back_prompts_are_never_trained_on_and_their_reward_is_logged(env, tmp_path, monkeypatch):
    """mapgrpo-analysis.yaml with the tiny policy on the tiny file: 4 prompts per step, 2 steps, the last question
    held back; the scripted expert answered it too, and its completion must never reach a held-back group."""
    out = tmp_path / "run"
    expert_cfg = RolloutConfig(agent="opera", dataset="hotpotqa", path=str(env["data"]), store=env["store"], start=3,
                               limit=2, context=CONTEXT)
    rollouts(expert_cfg, expert_model(), tmp_path / "expert_run")
    export(tmp_path / "expert_run" / "sample0", "roles", tmp_path / "expert")
    cfg = load_config(MAPGRPOConfig, YAML.parent / "learn" / "mapgrpo-analysis.yaml")
    cfg.model.name, cfg.model.lora_r, cfg.dev, cfg.output_dir = "tiny", 4, DevConfig(), str(out)
    cfg.model.rollout_llm, cfg.model.rollout_concurrency = "in_process", 1  # llama-server serves chat packs only
    cfg.rollout.dataset, cfg.rollout.path, cfg.rollout.store = "hotpotqa", str(env["data"]), env["store"]
    cfg.rollout.limit, cfg.rollout.start, cfg.rollout.max_new_tokens, cfg.rollout.context = 5, 0, 12, dict(CONTEXT)
    cfg.rollout.samples = 2  # more distinct prompts: 4 per step
    cfg.grpo |= {"max_steps": 2, "max_completion_length": 12}
    cfg.heldout, cfg.heldout_every, cfg.expert, cfg.inject_roles = 1, 1, str(tmp_path / "expert"), ["analysis"]
    trainer = MAPGRPOTrainer(cfg)
    scored = []  # (whether the policy was training, the prompts scored)
    original = RoleRewards.analysis

    def analysis(self, prompts, completions, **kwargs):  # TRL names the reward by the function
        scored.append((trainer.model.training, {prompt_key(p) for p in prompts}))
        return original(self, prompts, completions, **kwargs)

    monkeypatch.setattr(RoleRewards, "analysis", analysis)
    summary = trainer.train()
    info = summary["roles"]["analysis"]
    assert info["steps"] == 2 and info["heldout_prompts"] > 0 and info["prompts"] > 0
    held = set().union(*(keys for training, keys in scored if not training))
    trained = set().union(*(keys for training, keys in scored if training))
    assert len(held) == info["heldout_prompts"] and not held & trained
    experts = load_expert(tmp_path / "expert", "analysis")  # q4's and q5's: q5's are held back, never injected
    assert info["expert_prompts"] < len(experts) and held & set(experts)
    logs = log_entries(out)
    curve = [e for e in logs if e.get("role") == "analysis" and "eval_rewards/analysis/mean" in e]
    assert [e["step"] for e in curve] == [0, 1, 2]  # before the first step, then every step
    assert all("eval_reward" in e and e["eval_expert/injected"] == 0 for e in curve)  # no expert in a held group
    rollout = next(e for e in logs if e.get("event") == "rollouts")
    assert rollout["heldout_prompts"] == info["heldout_prompts"] and rollout["prompts_per_step"] == 4
    png = Path(summary["curve"])
    assert png.is_file()
    from mhqa_graph.training.curve import step_series

    assert [s for s, _ in step_series(read_log(out / "log.jsonl"))["analysis held-back rewards/analysis/mean"]] == \
        [0, 1, 2]


def test_a_role_stopped_between_steps_resumes_at_its_last_step(env, tmp_path, stop_training):
    """A role stopped after step 2 of 3 (KL on: the "ref" adapter is in the checkpoint too) resumes there: the
    rerun trains step 3 only and ends with the weights of a run that was never stopped."""
    def tiny(out):
        cfg = config(env, out, roles=["analysis"])
        cfg.grpo |= {"beta": 0.04, "max_steps": 3}
        return cfg

    whole = MAPGRPOTrainer(tiny(tmp_path / "whole"))
    whole.train()

    out = tmp_path / "run"
    (out / "analysis").mkdir(parents=True)
    shutil.copytree(tmp_path / "whole" / "analysis" / "rollouts", out / "analysis" / "rollouts")  # the same prompts
    go_on = stop_training(mapgrpo, 2)
    with pytest.raises(stop_training.error):
        MAPGRPOTrainer(tiny(out)).train()
    assert sorted(p.name for p in (out / "analysis" / "grpo").glob("checkpoint-*")) == ["checkpoint-2"]
    go_on()
    again = MAPGRPOTrainer(tiny(out))
    summary = again.train()
    assert summary["roles"]["analysis"]["steps"] == 3
    logs = log_entries(out)
    assert [e["from"] for e in logs if e.get("event") == "resumed"] == ["checkpoint-2"]
    assert [e["step"] for e in logs if "rewards/analysis/mean" in e] == [1, 2, 3]
    assert not list((out / "analysis" / "grpo").glob("checkpoint-*"))
    trained = {k: v for k, v in again.model.state_dict().items() if ".analysis." in k}
    assert trained and all(torch.allclose(v, whole.model.state_dict()[k]) for k, v in trained.items())


def test_a_finished_role_is_not_trained_again(env, expert_dir, tmp_path, monkeypatch, stop_at):
    """A run stopped after its first role (here: in the second role's rollouts) resumes with the first role's
    weights from its checkpoint and trains only the second; other GRPO arguments train every role afresh."""
    out = tmp_path / "run"
    def cfg(roles):  # the expert's plans give the plan role's groups a signal
        return config(env, out, roles=roles, expert=str(expert_dir), expert_min_score=1.0)

    first = MAPGRPOTrainer(cfg(["plan", "analysis"]))
    stop_at(first, "train_role", "analysis")
    with pytest.raises(KeyboardInterrupt):
        first.train()
    plan = {k: v.clone() for k, v in first.model.state_dict().items() if ".plan." in k}
    assert any(v.any() for k, v in plan.items() if "lora_B" in k)

    again = MAPGRPOTrainer(cfg(["plan", "analysis"]))
    asked = []
    monkeypatch.setattr(again, "train_role", lambda role: asked.append(role) or {"steps": 0})
    summary = again.train()
    assert asked == ["analysis"] and summary["roles"]["plan"]["steps"] > 0
    assert all(torch.equal(v, again.model.state_dict()[k]) for k, v in plan.items())
    assert [e["after_role"] for e in log_entries(out) if e.get("event") == "resumed"] == ["plan"]

    changed = cfg(["plan", "analysis"])
    changed.grpo["learning_rate"] = 0.5  # other arguments: nothing of this run is done
    other = MAPGRPOTrainer(changed)
    monkeypatch.setattr(other, "train_role", lambda role: asked.append(role) or {"steps": 0})
    other.train()
    assert asked == ["analysis", "plan", "analysis"]
