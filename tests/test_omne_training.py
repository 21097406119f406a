"""Omne's training stages on a tiny random Qwen2 over a hash-embedder store with a handful of 2Wiki
evidence triples: episodes are runs of the Omne graph whose tool-result tokens are masked from the GRPO
loss, generation stops at <tool_response> and what the graph did not keep is cut, a low budget forces the
final answer, each stage trains end to end (LoRA and full fine-tuning), stage 3 penalises repeated calls,
stage 1 warm-starts on teacher trajectories and stops when the format stays 0."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from mhqa_graph.graphs.omne.prompts import FORCE_ANSWER  # noqa: E402
from mhqa_graph.graphs.omne.protocol import parse_reply  # noqa: E402
from mhqa_graph.training.configs import DevConfig, ModelConfig, load_config  # noqa: E402
from mhqa_graph.training.omne import (  # noqa: E402
    LOG,
    EpisodeModel,
    OmneConfig,
    OmneEnvironment,
    OmneTrainer,
    stage_rewards,
)
from mhqa_graph.training.rewards import OmneRewardConfig, format_reward, omne_reward  # noqa: E402
from mhqa_graph.training.tiny import CHATML  # noqa: E402

from mhqa_graph.errors import InvalidInput, MhqaError, TrainingError  # noqa: E402
from mhqa_graph.export import export  # noqa: E402
from mhqa_graph.store import open_store  # noqa: E402

YAML = Path(__file__).resolve().parents[1] / "configs" / "train" / "omne.yaml"
GRAPH = "2wiki-dev_evidences"
TINY_GRPO = {"use_cpu": True, "bf16": False, "gradient_checkpointing": False, "max_steps": 1, "num_generations": 2,
             "per_device_train_batch_size": 2, "max_completion_length": 1024, "learning_rate": 0.05,
             "disable_tqdm": True}
TINY_SFT = {"use_cpu": True, "bf16": False, "gradient_checkpointing": False, "max_steps": 2,
            "per_device_train_batch_size": 2, "learning_rate": 0.05, "max_length": 2048, "disable_tqdm": True}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def wiki_row(rid: str) -> dict:
    return {"_id": rid, "type": "compositional", "question": f"Who is the father of Ann {rid}?",
            "answer": f"Bob {rid}", "supporting_facts": [[f"Ann {rid}", 0]],
            "evidences": [[f"Ann {rid}", "father", f"Bob {rid}"], [f"Bob {rid}", "spouse", f"Cat {rid}"]]}


def call(name: str, arg: str, value: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"{arg}": "{value}", "graph_type": "{GRAPH}"}}}}</tool_call>'


def replies(rid: str, answer: str, repeat: bool = False) -> list[str]:
    """An episode in the graph's protocol: find the entity, read its facts (or repeat the search), answer."""
    second = call("entity_matcher", "query", f"Ann {rid}") if repeat else call("node_info", "entity", f"Ann {rid}")
    return [f"<think>Find Ann {rid}.</think>{call('entity_matcher', 'query', f'Ann {rid}')}",
            f"<think>Read the facts of Ann {rid}.</think>{second}",
            f"<think>The father is known.</think><answer>{answer}</answer>"]


def script(model, tokenizer, monkeypatch, repeat: bool = False, after: str = "") -> list[str]:
    """Make `model.generate` write scripted episodes: the reply of turn n (assistant turns in its input), or
    the answer after the forced-answer message, with the right answer in every other episode so that GRPO
    groups have different rewards. With `after`, call turns go on with it and stop at a <tool_response>
    they start (as generation with the graph's stop strings does), else they end with the end-of-turn token."""
    inputs, finished = [], [0]

    def generate(input_ids, generation_config, **kwargs):
        max_new_tokens = generation_config.max_new_tokens
        assert generation_config.stop_strings == ["<tool_response>"]
        text = tokenizer.decode(input_ids[0])
        inputs.append(text)
        rid = text.split("father of Ann ")[1].split("?")[0]
        turn = 2 if text.rstrip().endswith(FORCE_ANSWER + "<|im_end|>\n<|im_start|>assistant") \
            else text.count("<|im_start|>assistant") - 1
        answer = f"Bob {rid}" if finished[0] % 2 == 0 else "Nobody"
        reply = replies(rid, answer, repeat)[turn]
        finished[0] += turn == 2
        end = tokenizer.encode(after + "<tool_response>", add_special_tokens=False) if after and turn < 2 \
            else [tokenizer.eos_token_id]
        new = tokenizer.encode(reply, add_special_tokens=False)[:max_new_tokens - len(end)] + end
        return torch.cat([input_ids, torch.tensor([new], device=input_ids.device)], dim=1)

    monkeypatch.setattr(model, "generate", generate)
    return inputs


@pytest.fixture
def config(tmp_path) -> OmneConfig:
    data = tmp_path / "dev_evidences.json"
    data.write_text(json.dumps([wiki_row("1"), wiki_row("2")]))
    cfg = load_config(OmneConfig, YAML)
    rollout = dataclasses.replace(cfg.rollout, path=str(data), store=f"embedded://{tmp_path}/s?embedder=hash",
                                  limit=None, max_new_tokens=160)
    rollout = dataclasses.replace(rollout, start=0)
    return dataclasses.replace(cfg, model=ModelConfig(name="tiny", lora=True), rollout=rollout, dev=DevConfig(),
                               output_dir=str(tmp_path / "out"), grpo=TINY_GRPO, grpo_stage3={}, sft=TINY_SFT,
                               sft_min_reward=None)


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def changed(before: dict, model) -> bool:
    return any(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters() if n in before)


def log_records(cfg: OmneConfig) -> list[dict]:
    return [json.loads(line) for line in (Path(cfg.output_dir) / LOG).read_text().splitlines()]


def test_yaml_config_loads_and_bad_configs_raise(tmp_path):
    cfg = load_config(OmneConfig, YAML)
    assert cfg.stages == [1, 2, 3] and cfg.rollout.agent == "omne" and cfg.think_weight == 0.001
    assert cfg.grpo["num_generations"] == 4 and cfg.grpo["beta"] == 0.0 and cfg.reward.result_floor == 0.1
    assert cfg.sft_min_reward == 0.5 == OmneConfig(rollout=cfg.rollout).sft_min_reward
    assert cfg.grpo["max_completion_length"] == 3072 and cfg.episode_reserve == 256
    for bad in ({"stages": [3, 1]}, {"stages": [4]}, {"stages": []}, {"rollout": {"agent": "mujica", "path": "x"}},
                {"rollout": {"agent": "omne"}}, {"grpo": {"temperature": 0}}, {"grpo_stage3": {"use_vllm": True}},
                {"sft": {"output_dir": "elsewhere"}}, {"think_weight": -1}, {"reward": {"result_floor": 2}},
                {"reward": {"think": False}}, {"warm_start": True}, {"warm_start": True, "stages": [3], "teacher": "x"},
                {"sft_stage2": [1]},
                {"format_patience": -1}, {"no_such_key": 1}):
        path = tmp_path / "bad.yaml"
        path.write_text(json.dumps({"rollout": {"agent": "omne", "path": "x"}} | bad))
        with pytest.raises(InvalidInput):
            load_config(OmneConfig, path)


def test_bad_trl_arguments_raise_invalid_input(config):
    with pytest.raises(InvalidInput, match="stage 1"):
        OmneTrainer(dataclasses.replace(config, stages=[1], grpo={**TINY_GRPO, "no_such_argument": 1})).train()


def test_episodes_run_the_omne_graph_and_mask_tool_results(config, monkeypatch):
    trainer = OmneTrainer(config)
    seen = script(trainer.model, trainer.tokenizer, monkeypatch)
    chats, template = [], EpisodeModel._template

    def spy(self, chat, generation_prompt):
        chats.append(chat)
        return template(self, chat, generation_prompt)

    monkeypatch.setattr(EpisodeModel, "_template", spy)
    tok = trainer.tokenizer
    with open_store(config.rollout.store) as store:
        env = OmneEnvironment(config.rollout, store)
        prompt = next(iter(env.questions))
        ep = env.episode(trainer.model, tok, prompt, budget=1024)
    assert ep["turns"] == replies("1", "Bob 1") and ep["episode_rounds"] == 3 and ep["episode_tool_calls"] == 2
    ids, mask = ep["completion_ids"], ep["env_mask"]
    assert len(ids) == len(mask) and mask[0] == 1 and mask[-1] == 1
    model_text = tok.decode([i for i, m in zip(ids, mask) if m])
    graph_text = tok.decode([i for i, m in zip(ids, mask) if not m])
    assert model_text == "".join(t + "<|im_end|>" for t in ep["turns"])
    assert "<tool_response>\nEntity: Ann 1\n- (Ann 1) -[father]-> (Bob 1)\n</tool_response>" in graph_text
    assert "<tool_response>" not in model_text
    # each reply was generated from the episode's sequence, which reads exactly as the prompt the Omne graph
    # built for that turn (its system prompt, question, replies and tool results)
    assert seen[0].startswith("<|im_start|>system\nYou answer multi-hop questions") and prompt in seen[0]
    assert seen[-1] == tok.apply_chat_template(chats[-1], add_generation_prompt=True, tokenize=False)
    assert seen[-1] == tok.decode(ep["prompt_ids"] + ids[:len(ids) - len(tok.encode(ep["turns"][-1])) - 1])


@pytest.mark.parametrize("guards", [None, "auto"])
def test_episodes_run_without_the_guards_unless_the_config_names_them(config, monkeypatch, guards):
    """An answer with no tool call is one `send_back_ungrounded` sends back; in an RL episode (guards "none"
    by default) it ends the episode, as the paper's loop does."""
    if guards:
        config = dataclasses.replace(config, rollout=dataclasses.replace(
            config.rollout, context={**config.rollout.context, "guards": guards}))
    trainer = OmneTrainer(config)
    tok = trainer.tokenizer

    def generate(input_ids, generation_config, **kwargs):
        new = tok.encode("<think>A guess.</think><answer>Bob 9</answer>", add_special_tokens=False)
        return torch.cat([input_ids, torch.tensor([new + [tok.eos_token_id]], device=input_ids.device)], dim=1)

    monkeypatch.setattr(trainer.model, "generate", generate)
    with open_store(config.rollout.store) as store:
        env = OmneEnvironment(config.rollout, store)
        ep = env.episode(trainer.model, tok, next(iter(env.questions)), budget=1024)
    assert len(ep["turns"]) == (2 if guards else 1)
    assert format_reward(ep["turns"]) == (0 if guards else 1)


def test_generation_stops_at_tool_response_and_what_the_graph_drops_is_cut(config, monkeypatch):
    trainer = OmneTrainer(config)
    tok = trainer.tokenizer
    seen = script(trainer.model, tok, monkeypatch, after="\nI wait for the result.\n")
    with open_store(config.rollout.store) as store:
        env = OmneEnvironment(config.rollout, store)
        ep = env.episode(trainer.model, tok, next(iter(env.questions)), budget=1024)
    kept = replies("1", "Bob 1")
    # the replies as written, up to the stop; the text after the call makes their format 0
    assert ep["turns"][:2] == [t + "\nI wait for the result.\n" for t in kept[:2]] and ep["turns"][2] == kept[2]
    assert omne_reward(ep["turns"], ["Bob 1"]) == 0.0 and omne_reward(kept, ["Bob 1"], successful_calls=2) == 1.0
    ids, mask = ep["completion_ids"], ep["env_mask"]
    # only the kept calls are trained; the end of each call turn is the template's, not sampled
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == kept[0] + kept[1] + kept[2] + "<|im_end|>"
    assert "I wait" not in tok.decode(ids) and "<tool_response>\nEntity: Ann 1" in tok.decode(ids)
    # each prompt was the graph's conversation exactly: the sequence so far reads as its template
    assert seen[-1] == tok.decode(ep["prompt_ids"] + ids[:len(ids) - len(tok.encode(kept[2])) - 1])


def test_a_low_budget_forces_the_final_answer(config, monkeypatch):
    trainer = OmneTrainer(config)
    tok = trainer.tokenizer
    script(trainer.model, tok, monkeypatch)
    with open_store(config.rollout.store) as store:
        env = OmneEnvironment(config.rollout, store)
        prompt = next(iter(env.questions))
        full = env.episode(trainer.model, tok, prompt, budget=1024)
        # room for one call and its result, then too little for another turn and the reserve
        budget = len(full["completion_ids"]) - 20
        ep = env.episode(trainer.model, tok, prompt, budget=budget, reserve=budget // 2)
        assert len(ep["completion_ids"]) <= budget and ep["episode_forced"] == 1
        assert len(ep["turns"]) < 3 and ep["turns"][-1] == replies("1", "Nobody")[2]  # an answer, not a 0
        graph_text = tok.decode([i for i, m in zip(ep["completion_ids"], ep["env_mask"]) if not m])
        assert FORCE_ANSWER in graph_text
        assert omne_reward(ep["turns"], ["Bob 1"], successful_calls=ep["episode_successful_calls"]) == \
            pytest.approx(0.1)  # the format holds: the reward is the answer's
        tiny = env.episode(trainer.model, tok, prompt, budget=60, reserve=0)  # no room even for one whole reply
        assert len(tiny["completion_ids"]) <= 60 and omne_reward(tiny["turns"], ["Bob 1"]) == 0.0


def test_a_changing_template_stops_training(config, monkeypatch):
    trainer = OmneTrainer(config)
    tok = trainer.tokenizer
    script(trainer.model, tok, monkeypatch)
    with open_store(config.rollout.store) as store:
        env = OmneEnvironment(config.rollout, store)
        # a template that drops the <think> of earlier turns: the sequence is no longer what the graph shows
        monkeypatch.setattr(tok, "chat_template", CHATML.replace(
            "{{ m['content'] }}", "{{ m['content'].split('</think>')[-1] if m['role'] == 'assistant' and not loop.last "
                                  "else m['content'] }}"))
        with pytest.raises(MhqaError, match="renders the conversation differently"):
            env.episode(trainer.model, tok, next(iter(env.questions)), budget=1024)


def scored_group(config, monkeypatch) -> tuple:
    """A fully fine-tuned tiny policy's GRPO trainer and one scored group of two scripted episodes of one question."""
    trainer = OmneTrainer(dataclasses.replace(config, model=ModelConfig(name="tiny", lora=False)))
    script(trainer.model, trainer.tokenizer, monkeypatch)
    with open_store(config.rollout.store) as store:
        env = OmneEnvironment(config.rollout, store)
        grpo = trainer.grpo_trainer(1, env)
        row = env.dataset()[0]
        return trainer, grpo, grpo._generate_and_score_completions([dict(row), dict(row)])


def test_tool_result_tokens_get_no_gradient(config, monkeypatch):
    _, grpo, inputs = scored_group(config, monkeypatch)
    assert inputs["advantages"].abs().min() > 0  # one right and one wrong answer in the group
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    assert (inputs["tool_mask"] == 0).any()
    logps = []
    original = grpo._get_per_token_logps_and_entropies

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        if out[0].requires_grad:
            out[0].retain_grad()
            logps.append(out[0])
        return out

    monkeypatch.setattr(grpo, "_get_per_token_logps_and_entropies", spy)
    grpo.model.train()
    grpo.current_gradient_accumulation_steps = 1  # set by the training loop otherwise
    grpo.compute_loss(grpo.model, inputs).backward()
    grad = logps[-1].grad
    assert torch.all(grad[mask == 0] == 0) and torch.all(grad[mask == 1] != 0)


@pytest.mark.parametrize("forced_masked", [True, False])
def test_a_groups_update_is_unchanged_by_tokens_the_grammar_forced(config, monkeypatch, forced_masked):
    """Two groups whose episodes differ only in the last token of each completion, marked forced (env_mask 0, as
    `GrammarSteps` marks a token the grammar left alone), give the same parameter update. Were forced tokens scored
    as the policy's own (mask 1), the updates would differ."""
    trainer, grpo, inputs = scored_group(config, monkeypatch)
    assert inputs["advantages"].abs().min() > 0
    last = inputs["completion_mask"].sum(dim=1) - 1  # each completion's last token (completions are right-padded)
    rows = torch.arange(len(last))
    inputs["tool_mask"][rows, last] = 0 if forced_masked else 1
    other = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    other["completion_ids"][rows, last] = (other["completion_ids"][rows, last] + 1) % trainer.model.config.vocab_size
    grpo.model.train()
    grpo.current_gradient_accumulation_steps = 1  # set by the training loop otherwise

    def update(batch: dict) -> dict[str, torch.Tensor]:
        grpo.model.zero_grad()
        grpo.compute_loss(grpo.model, batch).backward()
        return {n: p.grad.clone() for n, p in grpo.model.named_parameters() if p.grad is not None}

    first, second = update(inputs), update(other)
    same = all(torch.allclose(first[n], second[n], atol=1e-7) for n in first)
    assert same is forced_masked


def scored_logps(grpo, inputs, monkeypatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(the per-token log-probabilities the loss scored `inputs` with, the policy's own at the trainer's
    temperature, every token allowed), each (rows, completion tokens)."""
    seen = []
    original = grpo._get_per_token_logps_and_entropies

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        seen.append(out[0].detach())
        return out

    monkeypatch.setattr(grpo, "_get_per_token_logps_and_entropies", spy)
    grpo.model.train()
    grpo.current_gradient_accumulation_steps = 1  # set by the training loop otherwise
    assert torch.isfinite(grpo.compute_loss(grpo.model, inputs))
    ids = inputs["completion_ids"]
    with torch.no_grad():
        logits = grpo.model(input_ids=torch.cat([inputs["prompt_ids"], ids], 1),
                            attention_mask=torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)).logits
    own = torch.log_softmax(logits[:, -ids.size(1) - 1:-1].float() / grpo.temperature, -1)
    return seen[-1], own


def test_the_loss_scores_a_partly_constrained_token_under_the_grammars_distribution(config, monkeypatch):
    """A token sampled where the grammar allowed it and one other is scored as log p / (p + p_other): the policy's
    distribution at the trainer's temperature, renormalised over what the grammar allowed; a token without a
    recorded step is scored as TRL scores it (the policy's own distribution)."""
    trainer, grpo, inputs = scored_group(config, monkeypatch)
    assert inputs["grammar_allowed"] == [{}, {}]  # the scripted episodes ran without a grammar
    ids, mask = inputs["completion_ids"], (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    pos = int(mask[0].nonzero()[0])  # the first token of row 0 the policy sampled
    token, other = int(ids[0, pos]), (int(ids[0, pos]) + 1) % trainer.model.config.vocab_size
    allowed = np.zeros(trainer.model.config.vocab_size, dtype=bool)
    allowed[[token, other]] = True
    inputs["grammar_allowed"] = [{pos: np.packbits(allowed)}, {}]
    scored, own = scored_logps(grpo, inputs, monkeypatch)
    renormalised = own[0, pos, token] - torch.logsumexp(own[0, pos, [token, other]], 0)
    assert scored[0, pos] == pytest.approx(float(renormalised), abs=1e-4) and scored[0, pos] > own[0, pos, token]
    mask[0, pos] = False
    assert torch.allclose(scored[mask], own.gather(-1, ids.unsqueeze(-1)).squeeze(-1)[mask], atol=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("xgrammar") is None, reason="needs xgrammar (models extra)")
def test_a_group_decoded_under_the_grammar_is_scored_under_it(config, monkeypatch):
    """Episodes sampled under the reply grammar reach the loss with what the grammar allowed at each partly
    constrained step: there the loss's log-probability is the renormalised one (at least the policy's own, above it
    where the grammar ruled out some of the policy's mass); elsewhere it is the policy's own."""
    trainer = OmneTrainer(dataclasses.replace(config, model=ModelConfig(name="tiny", lora=False)))
    with open_store(config.rollout.store) as store:
        env = OmneEnvironment(config.rollout, store)
        grpo = trainer.grpo_trainer(1, env)
        row = env.dataset()[0]
        inputs = grpo._generate_and_score_completions([dict(row), dict(row)])
    rows = inputs["grammar_allowed"]
    assert all(rows)
    scored, own = scored_logps(grpo, inputs, monkeypatch)
    ids = inputs["completion_ids"]
    own = own.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    steps = torch.zeros_like(ids, dtype=torch.bool)
    for r, allowed in enumerate(rows):
        steps[r, list(allowed)] = True
    assert torch.all(scored[steps] >= own[steps] - 1e-5) and torch.any(scored[steps] > own[steps] + 1e-3)
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool() & ~steps
    assert torch.allclose(scored[mask], own[mask], atol=1e-4)


def test_a_group_of_episodes_is_sampled_with_the_trainers_settings(config):
    """The tiny policy's own generation config is greedy; a GRPO group of one question must still be sampled at
    GRPOConfig's temperature, or its episodes are identical and every advantage is 0."""
    trainer = OmneTrainer(config)
    assert not trainer.model.generation_config.do_sample
    with open_store(config.rollout.store) as store:
        env = OmneEnvironment(config.rollout, store)
        grpo = trainer.grpo_trainer(1, env)
        prompt = env.dataset()[0]["prompt"]
        out = env.rollout_func()([prompt] * 4, grpo)
    assert grpo.generation_config.do_sample and grpo.generation_config.temperature == 1.0
    assert len({tuple(ids) for ids in out["completion_ids"]}) > 1


@pytest.mark.skipif(importlib.util.find_spec("xgrammar") is None, reason="needs xgrammar (models extra)")
def test_episodes_are_decoded_under_the_inference_grammar(config):
    """A random policy writes no protocol; its episodes, sampled under the graph's reply grammar as at
    inference, are turn by turn calls the protocol reads, or an answer. (Room for a full think block of
    random bytes: max_new_tokens 2000.)"""
    config = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, max_new_tokens=2000))
    trainer = OmneTrainer(config)
    with open_store(config.rollout.store) as store:
        env = OmneEnvironment(config.rollout, store)
        grpo = trainer.grpo_trainer(1, env)
        prompt = env.dataset()[0]["prompt"]
        episode = env.episode(trainer.model, trainer.tokenizer, prompt[0]["content"], budget=20000,
                              generation_config=grpo.generation_config)
    turns = episode["turns"]
    assert turns and all(parse_reply(t).calls or parse_reply(t).answer for t in turns), turns
    assert all(not call["error"] for t in turns for call in parse_reply(t).calls)
    # the grammar's partly constrained steps, by completion position: the policy's own tokens, each one they allowed
    steps, ids, mask = episode["grammar_allowed"], episode["completion_ids"], episode["env_mask"]
    assert steps and all(mask[p] == 1 for p in steps)
    assert all(np.unpackbits(allowed, count=trainer.model.config.vocab_size)[ids[p]] for p, allowed in steps.items())


def test_stage3_reward_is_lower_for_repeated_identical_calls():
    golds = ["Bob 1"]
    distinct, repeated = replies("1", "Bob 1"), replies("1", "Bob 1", repeat=True)
    cfg = OmneRewardConfig()

    def total(stage: int, turns: list[str]) -> float:
        return sum(f(prompts=[None], completions=[None], turns=[turns], answers=[golds])[0]
                   for f in stage_rewards(stage, cfg, repetition_weight=0.25))

    assert total(1, distinct) == total(1, repeated) == pytest.approx(1.0)
    assert total(3, distinct) == pytest.approx(1.0)
    assert total(3, repeated) == pytest.approx(0.75)
    assert total(3, ["<tool_call>{}</tool_call>", "<answer>Bob 1</answer>"]) == 0.0  # no <think>: format fails


@pytest.mark.parametrize("lora", [True, False])
def test_rl_stages_train_end_to_end(config, monkeypatch, lora):
    cfg = dataclasses.replace(config, stages=[1, 3], model=ModelConfig(name="tiny", lora=lora))
    trainer = OmneTrainer(cfg)
    script(trainer.model, trainer.tokenizer, monkeypatch, repeat=True)
    before = weights(trainer.model)
    summary = trainer.train()
    assert [s["stage"] for s in summary["stages"]] == [1, 3] and all(s["steps"] == 1 for s in summary["stages"])
    assert changed(before, trainer.model)
    logs = log_records(cfg)
    first = next(r for r in logs if r["stage"] == 1 and "loss" in r)
    third = next(r for r in logs if r["stage"] == 3 and "loss" in r)
    assert first["episodes/format"] == 1.0 and first["episodes/repeated_calls"] == 1.0
    assert "rewards/repetition/mean" not in first and third["rewards/repetition/mean"] == pytest.approx(-0.1)
    assert (Path(summary["final"]) / ("adapter_config.json" if lora else "config.json")).is_file()


def test_all_stages_with_the_tiny_policy_and_a_teacher_for_sft(config, tmp_path):
    teacher = "fake:" + json.dumps(replies("1", "Bob 1"))
    cfg = dataclasses.replace(config, teacher=teacher, grpo={**TINY_GRPO, "max_completion_length": 128},
                              rollout=dataclasses.replace(config.rollout, limit=1, max_new_tokens=16))
    trainer = OmneTrainer(cfg)
    rows = trainer.sft_data()
    assert len(rows) == 1 and [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant", "user",
                                                                             "assistant", "user", "assistant"]
    before = weights(trainer.model)
    summary = trainer.train()
    assert [s["kind"] for s in summary["stages"]] == ["grpo", "sft", "grpo"] and changed(before, trainer.model)
    logs = log_records(cfg)
    assert {r["stage"] for r in logs} == {1, 2, 3}
    assert any(r["stage"] == 2 and "loss" in r for r in logs) and any("rewards/omne/mean" in r for r in logs)
    tags = [seg for m in rows[0]["messages"] for seg in m["segments"] if seg["text"] in ("<think>", "</think>")]
    thoughts = [seg for m in rows[0]["messages"] for seg in m["segments"] if seg["weight"] == 0.001]
    assert len(tags) == 6 and all(seg["weight"] == 1.0 for seg in tags) and len(thoughts) == 3
    # the teacher's run, exported as the CLI does, is read back as stage 2's given dataset
    export(trainer.sft_rollout_dir() / "sample0", "sft", tmp_path / "sft")
    for path in (tmp_path / "sft", tmp_path / "sft" / "sft.jsonl"):
        given = OmneTrainer(dataclasses.replace(cfg, stages=[2], sft_data=str(path))).sft_data()
        assert [m["content"] for m in given[0]["messages"]] == [m["content"] for m in rows[0]["messages"]]


def test_teacher_trajectories_need_the_reward_and_the_format(config):
    wrong = "fake:" + json.dumps(replies("1", "Nobody"))
    malformed = "fake:" + json.dumps(['<think>Look.</think><tool_call>{"name": "node_info", "arguments": }</tool_call>',
                                      *replies("1", "Bob 1")])
    for teacher, f1 in ((wrong, 0.0), (malformed, 1.0)):
        cfg = dataclasses.replace(config, stages=[2], teacher=teacher, sft_min_reward=0.5,
                                  rollout=dataclasses.replace(config.rollout, limit=1, max_new_tokens=16))
        trainer = OmneTrainer(cfg)
        with pytest.raises(InvalidInput, match="no trajectories"):
            trainer.sft_data()
        record, = map(json.loads, (trainer.sft_rollout_dir() / "sample0" / "results.jsonl").read_text().splitlines())
        assert record["f1"] == f1  # this teacher's own trajectory: the right answer after a malformed call is out


def test_teacher_text_around_its_calls_is_left_out_and_thinking_is_not_asked(config):
    first, second, last = replies("1", "Bob 1")
    sloppy = ["Waiting. " + first, second, last.replace("<think>The father is known.</think>", "")]
    cfg = dataclasses.replace(config, stages=[2], teacher="fake:" + json.dumps(sloppy), sft_min_reward=0.5,
                              rollout=dataclasses.replace(config.rollout, limit=1, max_new_tokens=16))
    row, = OmneTrainer(cfg).sft_data()
    said = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    assert said[0].startswith("<tool_call>") and said[2] == "<answer>Bob 1</answer>"
    assert format_reward(said, dataclasses.replace(cfg.reward, think=False)) == 1
    row, = OmneTrainer(dataclasses.replace(cfg, answer_thought="The facts give it.")).sft_data()
    said = [m for m in row["messages"] if m["role"] == "assistant"]
    assert said[2]["content"] == "<think>The facts give it.</think>\n<answer>Bob 1</answer>"
    assert said[2]["segments"][1] == {"text": "The facts give it.", "weight": cfg.think_weight}
    assert not said[1]["content"].startswith("<think>The facts")  # call turns keep their own


def test_a_teacher_writing_bare_json_calls_teaches_tagged_ones(config):
    bare = [r.replace("<tool_call>", "\n").replace("</tool_call>", "") for r in replies("1", "Bob 1")]
    cfg = dataclasses.replace(config, stages=[2], teacher="fake:" + json.dumps(bare), sft_min_reward=0.5,
                              rollout=dataclasses.replace(config.rollout, limit=1, max_new_tokens=16))
    row, = OmneTrainer(cfg).sft_data()
    said = [m for m in row["messages"] if m["role"] == "assistant"]
    assert [m["content"].count("<tool_call>") for m in said] == [1, 1, 0]
    assert format_reward([m["content"] for m in said], cfg.reward) == 1
    assert all("".join(s["text"] for s in m["segments"]) == m["content"] for m in said)
    assert said[0]["segments"][:3] == [{"text": "<think>", "weight": 1.0},
                                       {"text": "Find Ann 1.", "weight": cfg.think_weight},
                                       {"text": "</think>", "weight": 1.0}]


def test_each_teacher_has_its_own_rollouts_and_the_policy_starts_afresh(config):
    right, wrong = ("fake:" + json.dumps(replies("1", answer)) for answer in ("Bob 1", "Nobody"))
    cfg = dataclasses.replace(config, stages=[2], sft_min_reward=0.5,
                              rollout=dataclasses.replace(config.rollout, limit=1, max_new_tokens=16))

    def sft_data(teacher: str | None, **rollout) -> tuple[OmneTrainer, list[dict]]:
        trainer = OmneTrainer(dataclasses.replace(cfg, teacher=teacher,
                                                  rollout=dataclasses.replace(cfg.rollout, **rollout)))
        try:
            return trainer, trainer.sft_data()
        except InvalidInput:
            return trainer, []

    first, rows = sft_data(right)
    assert len(rows) == 1
    results = first.sft_rollout_dir() / "sample0" / "results.jsonl"
    made = results.read_text()
    other, none = sft_data(wrong)  # another teacher into the same output_dir: its own folder and trajectories
    assert none == [] and other.sft_rollout_dir() != first.sft_rollout_dir() and results.read_text() == made
    again, rows = sft_data(right)  # the first teacher again: its rollouts are reused, not remade
    assert len(rows) == 1 and again.sft_rollout_dir() == first.sft_rollout_dir() and results.read_text() == made
    with pytest.warns(UserWarning, match="other rollout settings; started them afresh"):
        _, rows = sft_data(right, max_new_tokens=24)
    assert len(rows) == 1 and json.loads(results.read_text())["id"] == json.loads(made)["id"]
    assert [r["event"] for r in log_records(cfg)] == ["rollouts_restarted"]
    policy, _ = sft_data(None)
    assert policy.sft_rollout_dir().name == "policy"
    (policy.sft_rollout_dir() / "sample0" / "results.jsonl").write_text(made)  # an earlier training's policy
    sft_data(None)
    assert json.loads((policy.sft_rollout_dir() / "sample0" / "run.json").read_text())["llm"] != json.loads(
        (first.sft_rollout_dir() / "sample0" / "run.json").read_text())["llm"]
    assert (policy.sft_rollout_dir() / "sample0" / "results.jsonl").read_text() != made


def test_stage1_warm_starts_on_the_teacher_and_stops_when_the_format_stays_zero(config, monkeypatch):
    """A random policy never writes the protocol: without a warm start every reward is 0 and stage 1 stops
    with a message; the warm start is an SFT on the teacher's trajectories before it."""
    teacher = "fake:" + json.dumps(replies("1", "Bob 1"))
    cfg = dataclasses.replace(config, stages=[1], teacher=teacher, warm_start=True, format_patience=2,
                              sft_min_reward=0.5, grpo={**TINY_GRPO, "max_steps": 4, "max_completion_length": 64},
                              rollout=dataclasses.replace(config.rollout, limit=1, max_new_tokens=16))
    trainer = OmneTrainer(cfg)
    before = weights(trainer.model)
    with pytest.warns(UserWarning, match="format reward stayed 0"):
        summary = trainer.train()
    warm, first = summary["stages"]
    assert (warm["stage"], warm["kind"]) == (0, "sft") and warm["steps"] == 2 and changed(before, trainer.model)
    assert first["stage"] == 1 and first["steps"] == 2 and "stage 1 stopped at step 2" in first["stopped"]
    stopped = [r for r in log_records(cfg) if r.get("event") == "stopped"]
    assert len(stopped) == 1 and "warm-start" in stopped[0]["message"]


def test_stage1s_control_is_the_warm_start_then_as_many_more_sft_steps(config):
    """`warm_start` before stage 2, whose `sft_stage2` overrides the SFT arguments: the control of stage 1, the same
    warm start and then SFT instead of GRPO, for as many steps as stage 1 would take."""
    teacher = "fake:" + json.dumps(replies("1", "Bob 1"))
    cfg = dataclasses.replace(config, stages=[2], teacher=teacher, warm_start=True, sft_min_reward=0.5,
                              sft_stage2={"max_steps": 1},
                              rollout=dataclasses.replace(config.rollout, limit=1, max_new_tokens=16))
    trainer = OmneTrainer(cfg)
    before = weights(trainer.model)
    warm, control = trainer.train()["stages"]
    assert (warm["stage"], warm["kind"], warm["steps"]) == (0, "sft", 2) and changed(before, trainer.model)
    assert (control["stage"], control["kind"], control["steps"]) == (2, "sft", 1)


def test_a_teacher_is_an_omne_or_mygo_setting():
    from mhqa_graph.training import train

    with pytest.raises(InvalidInput, match="teacher"):
        train("mapgrpo", YAML.parent / "mapgrpo.yaml", teacher="llamacpp:qwen2.5-coder-1.5b")


def test_a_rerun_resumes_after_the_last_trained_stage(config, monkeypatch):
    """Each trained stage is checkpointed; a rerun whose stages begin with those loads the last one's weights and
    trains only the rest, and a run of other stages does not resume from them."""
    teacher = "fake:" + json.dumps(replies("1", "Bob 1"))
    cfg = dataclasses.replace(config, stages=[2], teacher=teacher,
                              rollout=dataclasses.replace(config.rollout, limit=1, max_new_tokens=16))
    first = OmneTrainer(cfg)
    steps = first.train()["stages"][0]["steps"]
    trained = weights(first.model)
    again = OmneTrainer(dataclasses.replace(cfg, stages=[2, 3]))
    assert changed(trained, again.model)  # a fresh policy
    seen = {}

    def grpo(stage, log, state):
        seen[stage] = weights(again.model)
        return SimpleNamespace(state=SimpleNamespace(global_step=0), stopped=None)

    monkeypatch.setattr(again, "_sft", lambda *args: pytest.fail("stage 2 trained again"))
    monkeypatch.setattr(again, "_grpo", grpo)
    summary = again.train()
    assert [(s["stage"], s["steps"]) for s in summary["stages"]] == [(2, steps), (3, 0)]
    assert all(torch.equal(trained[n], seen[3][n]) for n in trained)  # stage 3 starts from stage 2's weights
    assert [r["after_stage"] for r in log_records(cfg) if r.get("event") == "resumed"] == [2]
    assert OmneTrainer(dataclasses.replace(cfg, stages=[3])).resume() == []


def test_a_stage_stopped_between_steps_resumes_at_its_last_step(config, stop_training, tmp_path):
    """A stage stopped after step 2 of 3 leaves checkpoint-2; the rerun trains step 3 only and ends with the
    weights of a run that was never stopped. Step checkpoints of other arguments are not resumed."""
    import mhqa_graph.training.omne as omne

    teacher = "fake:" + json.dumps(replies("1", "Bob 1"))
    cfg = dataclasses.replace(config, stages=[2], teacher=teacher, sft={**TINY_SFT, "max_steps": 3,
                                                                        "per_device_train_batch_size": 1},
                              rollout=dataclasses.replace(config.rollout, limit=2, max_new_tokens=16))
    whole = OmneTrainer(dataclasses.replace(cfg, output_dir=str(tmp_path / "whole")))
    whole.train()

    go_on = stop_training(omne, 2)
    with pytest.raises(stop_training.error):
        OmneTrainer(cfg).train()
    stage = Path(cfg.output_dir) / "stage2"
    assert sorted(p.name for p in stage.glob("checkpoint-*")) == ["checkpoint-2"]
    go_on()

    again = OmneTrainer(cfg)
    summary = again.train()
    assert summary["stages"][0]["steps"] == 3
    records = log_records(cfg)
    assert [r["from"] for r in records if r.get("event") == "resumed"] == ["checkpoint-2"]
    trained_steps = [r["step"] for r in records if r.get("stage") == 2 and "loss" in r]
    assert trained_steps == [1, 2, 3]  # step 3 by the rerun only
    assert not list(stage.glob("checkpoint-*"))  # removed once the stage is done
    assert all(torch.allclose(p, whole.model.state_dict()[n]) for n, p in again.model.state_dict().items())

    # a stopped stage of other arguments starts afresh
    (stage / "checkpoint-2").mkdir()
    (stage / "checkpoint-2" / "state.json").write_text(json.dumps({"stage": 2, "args": {"learning_rate": 1.0}}))
    (stage / "checkpoint").rename(stage / "done")  # so the stage itself trains again
    with pytest.warns(UserWarning, match="another run"):
        OmneTrainer(cfg).train()
    assert [r["event"] for r in log_records(cfg) if r.get("event", "").startswith("step_")] == \
        ["step_checkpoints_removed"]


@pytest.mark.skipif(importlib.util.find_spec("xgrammar") is None, reason="needs xgrammar (models extra)")
def test_tokens_the_grammar_forces_get_no_gradient():
    """Under a grammar whose reply starts with a fixed text, a step where the grammar leaves one token is the
    grammar's choice, not the policy's: the recorder marks it forced (env_mask 0); the steps where the policy chose
    among several tokens are not, and keep the tokens the grammar allowed, the sampled one among them. (A fixed text
    may still be spelt in several tokenizations: those steps count as chosen.)"""
    import torch
    from mhqa_graph.training.grammar_scoring import GrammarSteps
    from mhqa_graph.training.tiny import tiny_model_and_tokenizer

    from mhqa_graph.models import grammar as G

    model, tokenizer = tiny_model_and_tokenizer(seed=0)
    processor = G.cache_for(tokenizer, model.config.vocab_size).processor(
        'root ::= "<answer>" [a-z]{1,8} "</answer>"\n')
    recorder = GrammarSteps()
    ids = torch.tensor([tokenizer("Question: who?")["input_ids"]])
    torch.manual_seed(0)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=True,
                         logits_processor=[processor, recorder], tokenizer=tokenizer)
    new = out[0, ids.shape[1]:].tolist()
    text = tokenizer.decode(new, skip_special_tokens=True)
    assert text.startswith("<answer>") and "</answer>" in text
    forced = [recorder.forced_at(i) for i in range(len(new))]
    assert forced[0] and not all(forced), (text, forced)  # "<" can only open the tag; the letters are chosen
    assert len(recorder.forced) >= len(new) - 1
    chosen = [i for i in range(len(new)) if recorder.allowed_at(i) is not None]
    assert chosen and not any(forced[i] for i in chosen)
    assert all(np.unpackbits(recorder.allowed_at(i), count=model.config.vocab_size)[new[i]] for i in chosen)


def test_the_environment_needs_no_chat_pack_its_model_is_the_policy(config, monkeypatch):
    """A GPU machine with the train extra alone (no chat pack) builds the environment: each episode puts the policy
    in the context's place; a call that reached the placeholder would fail, not answer."""
    from mhqa_graph.training.omne import PolicyPerEpisode

    from mhqa_graph.models import factory

    monkeypatch.setattr(factory, "best_installed_chat_pack", lambda: None)
    with open_store(config.rollout.store) as store:
        env = OmneEnvironment(config.rollout, store)
    assert isinstance(env.context.llm, PolicyPerEpisode)
    with pytest.raises(TrainingError, match="set per episode"):
        env.context.llm.invoke("who?")
