"""Omne's three training stages (arXiv 2508.17330), each continuing from the weights of the one before:

1. GRPO over multi-turn tool episodes, R = R_format * (0.1 + 0.9 * R_result): the format (a <think>
   before every tool call, well-formed calls, one final <answer>) gates the reward.
2. Weighted SFT on Omne trajectories: <think> tokens weigh 0.001, tool calls and answers 1.0, tool results 0.
3. GRPO again, with R minus a penalty per repeated identical tool call.

An RL episode is a run of the Omne graph itself (graphs/omne.py: its prompts, parsing, tools over the
store, round cap, nudge and forced answer) with the policy as its chat model. `EpisodeModel` keeps the
episode as one token sequence: the first prompt, then each reply as sampled (env_mask 1) and the template
tokens of what the graph adds in between, tool results and nudges (env_mask 0), and it generates every
reply from that sequence. TRL's GRPOTrainer gets these through `rollout_func` and trains only the env_mask
1 tokens. TRL 1.16 has no PPOTrainer: GRPO (group-relative advantages, no value model) is the closest
supported alternative.

    trainer = OmneTrainer(load_config(OmneConfig, "configs/train/omne.yaml"))
    summary = trainer.train()   # output_dir/log.jsonl, output_dir/final
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs import omne_prompts as P
from pydantic import PrivateAttr

from mhqa_graph.errors import InvalidInput, MhqaError, ModelError
from mhqa_graph.eval.environments import environment_name, prepare
from mhqa_graph.eval.runner import load_questions
from mhqa_graph.export import THINK_WEIGHT, sft_rows
from mhqa_graph.models.chat import TransformersChatModel, chat_dicts
from mhqa_graph.store import open_store

from .common import ModelConfig, RolloutConfig, chat_model_for, jsonl_log, load_model, rollouts
from .rewards import OmneRewardConfig, format_reward, omne_reward, repetition_penalty, tool_calls

STAGES = {1: "grpo", 2: "sft", 3: "grpo"}
LOG = "log.jsonl"
# what rollout_func returns per episode besides logprobs; all but the first three reach the reward functions
EPISODE_KEYS = ("prompt_ids", "completion_ids", "env_mask", "turns", "episode_rounds", "episode_tool_calls",
                "episode_repeated_calls")
GRPO_DEFAULTS = {"report_to": [], "save_strategy": "no", "logging_steps": 1, "max_completion_length": 2048}
SFT_DEFAULTS = {"report_to": [], "save_strategy": "no", "logging_steps": 1, "max_length": 4096}


@dataclass
class OmneConfig:
    """Which stages run, on which questions, with which TRL arguments and rewards."""

    model: ModelConfig = field(default_factory=ModelConfig)
    # questions, golds and knowledge graph of the episodes (a KG dataset: 2wiki evidences or pathquestion);
    # max_new_tokens is per model turn, temperature that of stage 2's rollouts (RL samples as `grpo` says),
    # context holds Omne settings (max_rounds, top_k, think)
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(agent="omne"))
    stages: list[int] = field(default_factory=lambda: [1, 2, 3])
    output_dir: str = "runs/train/omne"
    reward: OmneRewardConfig = field(default_factory=OmneRewardConfig)  # stages 1 and 3
    repetition_weight: float = 0.1  # stage 3: subtracted per tool call identical to an earlier one
    grpo: dict[str, Any] = field(default_factory=dict)  # GRPOConfig args of stages 1 and 3 (num_generations, beta, ...)
    grpo_stage3: dict[str, Any] = field(default_factory=dict)  # stage 3 overrides of `grpo`
    sft: dict[str, Any] = field(default_factory=dict)  # WeightedSFTConfig args of stage 2
    think_weight: float = THINK_WEIGHT  # stage 2 loss weight of <think> tokens
    sft_data: str | None = None  # an exported sft dataset (folder or .jsonl); None: Omne rollouts make it
    sft_teacher: str | None = None  # model spec whose rollouts make the SFT data; None: the policy itself
    sft_min_reward: float | None = None  # keep trajectories with F1 >= this (None: all)

    def __post_init__(self) -> None:
        if not isinstance(self.stages, list) or not self.stages or any(s not in STAGES for s in self.stages) \
                or self.stages != sorted(set(self.stages)):
            raise InvalidInput(f"stages must be a non-empty increasing list of 1, 2, 3; got {self.stages!r}")
        if self.rollout.agent != "omne":
            raise InvalidInput(f"rollout.agent must be 'omne' (the agent Omne trains), got {self.rollout.agent!r}")
        needs_rollouts = any(STAGES[s] == "grpo" for s in self.stages) or (2 in self.stages and not self.sft_data)
        if needs_rollouts and not self.rollout.path:
            raise InvalidInput("rollout.path (the benchmark file of the questions) is required")
        if self.think_weight < 0 or self.repetition_weight < 0:
            raise InvalidInput("think_weight and repetition_weight must be >= 0")
        if self.rollout.context.get("think", True) != self.reward.think:
            raise InvalidInput("reward.think must match rollout.context.think (the format asks what the prompt asks)")
        if not 0 <= self.reward.result_floor <= 1:
            raise InvalidInput(f"reward.result_floor must be in [0, 1], got {self.reward.result_floor}")
        for name in ("grpo", "grpo_stage3", "sft"):
            args = getattr(self, name)
            if not isinstance(args, dict):
                raise InvalidInput(f"{name} must be a mapping of TRL arguments")
            if "output_dir" in args:
                raise InvalidInput(f"{name}.output_dir: set output_dir at the top level (stages write below it)")
            if name != "sft" and args.get("use_vllm"):
                raise InvalidInput(f"{name}.use_vllm: Omne's episodes are generated in process through the graph")
            if name != "sft" and args.get("temperature", 1.0) <= 0:
                raise InvalidInput(f"{name}.temperature must be > 0: GRPO needs different episodes per question")


# -- episodes ------------------------------------------------------------------------------
class EpisodeModel(TransformersChatModel):
    """The policy as the Omne graph's chat model for one episode. The graph's successive prompts extend
    one conversation; each is turned into tokens as the previous sequence (prompt, replies as sampled)
    plus the chat-template tokens of the messages the graph added since the last reply, and the reply
    is generated from exactly that, sampled as the model's generation config says (in RL, GRPOConfig's
    temperature, top_p, top_k, ...). Raises ModelError (the graph stops) once `budget` completion tokens
    are used."""

    budget: int = 2048  # completion tokens of the episode: replies and what the graph adds between them

    _prompt: list[int] = PrivateAttr(default_factory=list)
    _completion: list[int] = PrivateAttr(default_factory=list)
    _mask: list[int] = PrivateAttr(default_factory=list)  # 1: sampled by the policy, 0: added by the graph
    _replies: list[str] = PrivateAttr(default_factory=list)
    _chat: list[dict[str, str]] = PrivateAttr(default_factory=list)  # the conversation through the last reply
    _fault: str | None = PrivateAttr(default=None)

    def episode(self) -> dict[str, Any]:
        """prompt_ids, completion_ids, env_mask and the reply texts (`turns`) of the episode so far."""
        if self._fault:
            raise MhqaError(f"cannot train on this episode: {self._fault}")
        return {"prompt_ids": list(self._prompt), "completion_ids": list(self._completion),
                "env_mask": list(self._mask), "turns": list(self._replies)}

    def _template(self, chat: list[dict[str, str]], generation_prompt: bool) -> list[int]:
        return self._tokenizer.apply_chat_template(chat, add_generation_prompt=generation_prompt,
                                                   return_dict=True)["input_ids"]

    def _added_ids(self, chat: list[dict[str, str]]) -> list[int]:
        """The template tokens of the messages after the last reply, through the generation prompt."""
        n = len(self._chat)
        if chat[:n] != self._chat or len(chat) == n:
            raise ModelError("the Omne graph's prompt does not continue the episode's conversation")
        eos = self._tokenizer.eos_token_id
        head = self._template(self._chat, False)
        ends = [i for i, t in enumerate(head) if t == eos]
        head = head[:ends[-1] + 1] if ends else head  # through the reply's end-of-turn token
        full = self._template(chat, True)
        if full[:len(head)] != head:
            raise ModelError("the chat template renders the conversation differently once it grows")
        added = full[len(head):]
        if self._completion and self._completion[-1] != eos and ends:
            added = [eos, *added]  # the reply was cut at max_new_tokens: the template closes it
        return added

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        import torch

        chat = chat_dicts(messages)
        if not self._prompt:
            self._prompt = self._template(chat, True)
        else:
            try:
                added = self._added_ids(chat)
            except ModelError as exc:  # the graph would only record it: episode() raises it
                self._fault = str(exc)
                raise
            if len(self._completion) + len(added) >= self.budget:
                raise ModelError(f"the episode used its budget of {self.budget} completion tokens")
            self._completion += added
            self._mask += [0] * len(added)
        max_new = min(self.max_new_tokens, self.budget - len(self._completion))
        ids = torch.tensor([self._prompt + self._completion])
        out = self._model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new)
        new = out[0, ids.shape[1]:].tolist()
        self._completion += new
        self._mask += [1] * len(new)
        text = self._tokenizer.decode(new, skip_special_tokens=True)
        self._replies.append(text)
        self._chat = [*chat, {"role": "assistant", "content": text}]
        finish = "stop" if new and new[-1] == self._tokenizer.eos_token_id else "length"
        return ChatResult(generations=[ChatGeneration(message=AIMessage(
            text, response_metadata={"model_name": self._name, "finish_reason": finish}))])


@dataclass
class Question:
    question: str
    answers: list[str]
    topic_entities: list[str]

    @property
    def prompt(self) -> str:
        """The graph's first user message: the key the episodes of this question are found by."""
        text = P.QUESTION.format(question=" ".join(self.question.split()))
        return text + ("\n" + P.TOPIC_ENTITIES.format(entities=", ".join(self.topic_entities))
                       if self.topic_entities else "")


class OmneEnvironment:
    """The questions of `config.path` and the graph they are asked over, ingested into the open `store`."""

    def __init__(self, config: RolloutConfig, store: Any) -> None:
        env = prepare(store, config.dataset, config.path, environment_name(config.dataset, config.path))
        if not env["graph"]:
            raise InvalidInput(f"{config.path} gives no knowledge graph as {config.dataset}; Omne needs a KG "
                               "dataset (2wiki evidences, pathquestion)")
        items = load_questions(config.dataset, config.path, config.limit, config.start)
        self.questions = {q.prompt: q for q in (Question(i.question, list(i.answers), list(i.topic_entities))
                                                for i in items)}
        self.context = make_context("omne", store=store, graph=env["graph"], **config.context)
        self.graph = build_graph("omne")
        self.config = config

    def dataset(self) -> Any:
        from datasets import Dataset

        return Dataset.from_list([{"prompt": [{"role": "user", "content": key}], "answers": q.answers}
                                  for key, q in self.questions.items()])

    def episode(self, model: Any, tokenizer: Any, prompt: str, budget: int) -> dict[str, Any]:
        """One run of the Omne graph on the question of `prompt` with `model` as the policy."""
        question = self.questions[prompt]
        llm = EpisodeModel.from_loaded(model, tokenizer, model_name="policy", max_new_tokens=self.config.max_new_tokens,
                                       budget=budget)
        inputs = {"question": question.question, "topic_entities": question.topic_entities}
        output = self.graph.invoke(inputs, context=dataclasses.replace(self.context, llm=llm))
        result = llm.episode()
        if not result["prompt_ids"]:
            raise MhqaError(f"the Omne graph made no model call: {output.get('error')}")
        return result | {"episode_rounds": output["rounds"], "episode_tool_calls": len(output["tool_calls"]),
                         "episode_repeated_calls": output["repeated_calls"]}

    def rollout_func(self) -> Callable[[list, Any], dict[str, list]]:
        """TRL's `rollout_func`: one episode per prompt (GRPOTrainer repeats each num_generations times)."""

        def rollout(prompts: list, trainer: Any) -> dict[str, list]:
            from trl.models.utils import unwrap_model_for_generation

            episodes = []  # sampled with the trainer's generation settings, which its logprobs assume
            with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                             generation_kwargs=trainer.generation_kwargs,
                                             gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs
                                             ) as model:
                for prompt in prompts:
                    key = prompt[-1]["content"] if isinstance(prompt, list) else prompt
                    episodes.append(self.episode(model, trainer.processing_class, key,
                                                 trainer.args.max_completion_length))
            # logprobs None: no importance-sampling correction, as TRL's own transformers generation
            return {key: [e[key] for e in episodes] for key in EPISODE_KEYS} | {"logprobs": None}

        return rollout


# -- rewards -------------------------------------------------------------------------------
def stage_rewards(stage: int, reward: OmneRewardConfig, repetition_weight: float) -> list[Callable[..., list[float]]]:
    """TRL reward functions of an RL stage over the episodes' assistant turns (`turns`) and golds
    (`answers`): `omne`, R_format * (floor + (1 - floor) * R_result), and in stage 3 `repetition`, minus
    `repetition_weight` per repeated identical tool call. TRL sums them and logs each."""
    base = dataclasses.replace(reward, repetition_weight=0.0)

    def omne(prompts: list, completions: list, turns: list[list[str]], answers: list[list[str]],
             log_metric: Callable[[str, float], None] | None = None, **kwargs: Any) -> list[float]:
        if log_metric is not None:  # TRL averages these per logging step
            log_metric("episodes/format", sum(format_reward(t, base) for t in turns) / len(turns))
            for key in EPISODE_KEYS[4:]:
                log_metric(f"episodes/{key.removeprefix('episode_')}", sum(kwargs[key]) / len(kwargs[key]))
        return [omne_reward(t, a, base) for t, a in zip(turns, answers)]

    def repetition(prompts: list, completions: list, turns: list[list[str]], **kwargs: Any) -> list[float]:
        return [repetition_penalty(tool_calls(t, base), repetition_weight) for t in turns]

    return [omne, repetition] if stage == 3 else [omne]


# -- the trainer ---------------------------------------------------------------------------
def read_sft_data(path: str) -> list[dict[str, Any]]:
    """Rows of an exported sft dataset: a `save_to_disk` folder or a JSONL file of rows with `messages`."""
    source = Path(path)
    if source.is_dir():
        from datasets import load_from_disk

        return list(load_from_disk(str(source)))
    try:
        return [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"cannot read sft_data {path}: {exc}") from None


class OmneTrainer:
    """Runs the configured stages on one model; `train()` returns a summary of every stage's logs."""

    def __init__(self, config: OmneConfig) -> None:
        self.config = config
        self.out = Path(config.output_dir)
        self.model, self.tokenizer = load_model(config.model)

    def _trl_args(self, cls: type, defaults: dict, args: dict, stage: int, **fixed: Any) -> Any:
        try:
            return cls(**{**defaults, "seed": self.config.model.seed, **args, **fixed,
                          "output_dir": str(self.out / f"stage{stage}")})
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"stage {stage} TRL arguments: {exc}") from None

    def grpo_trainer(self, stage: int, env: OmneEnvironment, callbacks: list | None = None) -> Any:
        """The GRPOTrainer of RL stage `stage` over the episodes of `env`, on the current weights."""
        from trl import GRPOConfig, GRPOTrainer

        args = self._trl_args(GRPOConfig, GRPO_DEFAULTS,
                              {**self.config.grpo, **(self.config.grpo_stage3 if stage == 3 else {})}, stage)
        return GRPOTrainer(model=self.model, args=args, processing_class=self.tokenizer,
                           reward_funcs=stage_rewards(stage, self.config.reward, self.config.repetition_weight),
                           train_dataset=env.dataset(), rollout_func=env.rollout_func(), callbacks=callbacks)

    def _grpo(self, stage: int, log: Any) -> Any:
        with open_store(self.config.rollout.store) as store:
            trainer = self.grpo_trainer(stage, OmneEnvironment(self.config.rollout, store), [log])
            trainer.train()
        return trainer

    def sft_data(self) -> list[dict[str, Any]]:
        """Stage 2's chats: `sft_data`, else the sft export of Omne rollouts by the teacher (or the policy)."""
        cfg = self.config
        if cfg.sft_data:
            rows = read_sft_data(cfg.sft_data)
        else:
            llm = cfg.sft_teacher or chat_model_for(self.model, self.tokenizer, temperature=cfg.rollout.temperature,
                                                    max_new_tokens=cfg.rollout.max_new_tokens)
            records = rollouts(cfg.rollout, llm, self.out / "stage2" / "rollouts")
            rows = sft_rows(records, min_reward=cfg.sft_min_reward, think_weight=cfg.think_weight)
        rows = [{"messages": r["messages"]} for r in rows
                if any(m["role"] == "assistant" for m in r.get("messages") or [])]
        if not rows:
            raise InvalidInput("stage 2 has no trajectories to train on (check sft_data / sft_min_reward)")
        return rows

    def _sft(self, stage: int, log: Any) -> Any:
        from datasets import Dataset

        from .weighted_sft import WeightedSFTConfig, WeightedSFTTrainer

        args = self._trl_args(WeightedSFTConfig, SFT_DEFAULTS, self.config.sft, stage,
                              think_weight=self.config.think_weight)
        trainer = WeightedSFTTrainer(model=self.model, args=args, train_dataset=Dataset.from_list(self.sft_data()),
                                     processing_class=self.tokenizer, callbacks=[log])
        trainer.train()
        return trainer

    def train(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        summary: dict[str, Any] = {"stages": []}
        for stage in self.config.stages:
            log = jsonl_log(self.out / LOG, stage=stage)
            trainer = (self._grpo if STAGES[stage] == "grpo" else self._sft)(stage, log)
            summary["stages"].append({"stage": stage, "kind": STAGES[stage], "steps": trainer.state.global_step,
                                      "log": log.entries})
        final = self.out / "final"
        self.model.save_pretrained(final)
        self.tokenizer.save_pretrained(final)
        summary["final"] = str(final)
        return summary
