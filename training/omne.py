"""Omne's three training stages (arXiv 2508.17330), each continuing from the weights of the one before:

1. GRPO over multi-turn tool episodes, R = R_format * (0.1 + 0.9 * R_result): the format (turns of blocks
   only, a <think> opening each, well-formed calls, one final <answer>, no invented <tool_response>, one
   successful tool call at least) gates the reward. A stage whose format stays 0 for `format_patience`
   logged steps stops with a message; `warm_start` first runs stage-2-style SFT on the teacher's
   trajectories, so a policy that never writes the protocol can start.
2. Weighted SFT on Omne trajectories: <think> tokens weigh 0.001, tool calls and answers 1.0, tool results 0;
   rollout trajectories need F1 >= `sft_min_reward` (0.5) and the format.
3. GRPO again, with R minus a penalty per repeated identical tool call.

An RL episode is a run of the Omne graph itself (graphs/omne/: its prompts, parsing, tools over the
store, round cap, nudge and forced answer) with the policy as its chat model. `EpisodeModel` keeps the
episode as one token sequence: the first prompt, then each reply as sampled (env_mask 1, but 0 for a token its
reply grammar forced) and the template
tokens of what the graph adds in between, tool results and nudges (env_mask 0), and it generates every
reply from that sequence. TRL's GRPOTrainer (`GrammarGRPOTrainer`) gets these through `rollout_func` and trains
only the env_mask 1 tokens, each scored under the distribution it was sampled from: the policy's, renormalised over
the tokens the reply grammar allowed at its step (`training/grammar_scoring.py`). TRL 1.16 has no PPOTrainer: GRPO
(group-relative advantages, no value model) is the closest supported alternative.

    trainer = OmneTrainer(load_config(OmneConfig, "configs/train/omne.yaml"))
    summary = trainer.train()   # output_dir/log.jsonl, output_dir/final
"""

from __future__ import annotations

import copy
import dataclasses
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.omne import prompts as P
from mhqa_graph.graphs.omne.protocol import canonical_reply
from pydantic import PrivateAttr

from mhqa_graph.errors import InvalidInput, MhqaError, ModelError, TrainingError
from mhqa_graph.eval.environments import environment_name, prepare
from mhqa_graph.eval.runner import RunMismatch, load_questions
from mhqa_graph.export import THINK_WEIGHT, sft_rows, weighted_message
from mhqa_graph.models.chat import TransformersChatModel, chat_dicts, model_device

from .checkpoints import STEP_SAVES, load_checkpoint, save_checkpoint, saved_checkpoints, train_resuming
from .configs import DevConfig, ModelConfig, RolloutConfig
from .dev import GUARDS_OFF, check_disjoint, policy_dev, publish_final, untrained_runs
from .devices import on_main_process, precision_args
from .logs import LOG, jsonl_log, plot_curve, read_log, write_log
from .policy import load_model, policy_chat_model, save_policy
from .rewards import OmneRewardConfig, format_reward, omne_reward, repetition_penalty, tool_calls
from .rollouts import rollout_store, rollouts, teacher_folder, teacher_rollouts

STAGES = {1: "grpo", 2: "sft", 3: "grpo"}
SUMMARY_KEYS = ("stage", "kind", "steps", "stopped")  # of a stage in train()'s summary (and its checkpoint state)
STATE_TYPES = {"stage": int, "position": int, "order": list, "kind": str, "steps": int}  # of a stage's checkpoint
# what rollout_func returns per episode besides logprobs: the sequence, its env_mask, what the grammar allowed at its
# partly constrained steps (the trainer's, not a reward's), then what reaches the reward functions
EPISODE_COUNTS = ("episode_rounds", "episode_tool_calls", "episode_successful_calls", "episode_repeated_calls",
                  "episode_forced")  # logged as episodes/<name>
EPISODE_KEYS = ("prompt_ids", "completion_ids", "env_mask", "grammar_allowed", "turns", *EPISODE_COUNTS)
# 3,072 episode tokens: a clean 3-hop PathQuestion episode (entity_matcher, node_info x 3, answer) measures
# 660-1,080 completion tokens, leaving room for longer reasoning, a failed call or two and the forced answer
GRPO_DEFAULTS = {"report_to": [], **STEP_SAVES, "logging_steps": 1, "max_completion_length": 3072}
SFT_DEFAULTS = {"report_to": [], **STEP_SAVES, "logging_steps": 1, "max_length": 4096}


@dataclass
class OmneConfig:
    """Which stages run, on which questions, with which TRL arguments and rewards."""

    model: ModelConfig = field(default_factory=ModelConfig)
    # questions, golds and knowledge graph of the episodes (a KG dataset: 2wiki evidences or pathquestion);
    # max_new_tokens is per model turn, temperature that of stage 2's rollouts (RL samples as `grpo` says),
    # context holds Omne settings (max_rounds, top_k, think)
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(agent="omne"))
    dev: DevConfig = field(default_factory=DevConfig)  # held-out questions answered before and after each stage
    stages: list[int] = field(default_factory=lambda: [1, 2, 3])
    output_dir: str = "runs/train/omne"
    reward: OmneRewardConfig = field(default_factory=OmneRewardConfig)  # stages 1 and 3
    repetition_weight: float = 0.1  # stage 3: subtracted per tool call identical to an earlier one
    grpo: dict[str, Any] = field(default_factory=dict)  # GRPOConfig args of stages 1 and 3 (num_generations, beta, ...)
    grpo_stage3: dict[str, Any] = field(default_factory=dict)  # stage 3 overrides of `grpo`
    sft: dict[str, Any] = field(default_factory=dict)  # WeightedSFTConfig args of stage 2 (and the warm start)
    sft_stage2: dict[str, Any] = field(default_factory=dict)  # stage 2 overrides of `sft` (e.g. max_steps of a
    # control: the warm start, then as many more SFT steps as stage 1 takes GRPO steps)
    think_weight: float = THINK_WEIGHT  # stage 2 loss weight of <think> tokens
    answer_thought: str | None = None  # stage 2: a template thought before answers given without one
    sft_data: str | None = None  # an exported sft dataset (folder or .jsonl); None: Omne rollouts make it
    teacher: str | None = None  # model spec whose Omne rollouts make the SFT data; None: the policy itself
    sft_min_reward: float | None = 0.5  # keep rollout trajectories with F1 >= this and the format (None: all)
    templates: int = 0  # SFT data: template trajectories from the gold chains of up to N rollout questions
    warm_start: bool = False  # SFT on the stage-2 data (the teacher's) before the first stage
    episode_reserve: int = 256  # episode tokens kept back for the forced final answer
    format_patience: int = 10  # an RL stage stops after this many logged steps with format 0 (0: never)

    def __post_init__(self) -> None:
        if not isinstance(self.stages, list) or not self.stages or any(s not in STAGES for s in self.stages) \
                or self.stages != sorted(set(self.stages)):
            raise InvalidInput(f"stages must be a non-empty increasing list of 1, 2, 3; got {self.stages!r}")
        if self.rollout.agent != "omne":
            raise InvalidInput(f"rollout.agent must be 'omne' (the agent Omne trains), got {self.rollout.agent!r}")
        needs_rollouts = any(STAGES[s] == "grpo" for s in self.stages) or (2 in self.stages and not self.sft_data) \
            or self.templates
        if needs_rollouts and not self.rollout.path:
            raise InvalidInput("rollout.path (the benchmark file of the questions) is required")
        if self.think_weight < 0 or self.repetition_weight < 0:
            raise InvalidInput("think_weight and repetition_weight must be >= 0")
        if self.warm_start and self.stages[0] == 3:
            raise InvalidInput("warm_start is an SFT before stage 1 (or before stage 2, stage 1's control); "
                               "stages starts at 3")
        if self.warm_start and not (self.teacher or self.sft_data or self.templates):
            raise InvalidInput("warm_start needs trajectories: set teacher (a model spec), sft_data or templates")
        if not isinstance(self.templates, int) or self.templates < 0:
            raise InvalidInput(f"templates must be an integer >= 0, got {self.templates!r}")
        if self.episode_reserve < 0 or self.format_patience < 0:
            raise InvalidInput("episode_reserve and format_patience must be >= 0")
        if self.rollout.context.get("think", True) != self.reward.think:
            raise InvalidInput("reward.think must match rollout.context.think (the format asks what the prompt asks)")
        if not 0 <= self.reward.result_floor <= 1:
            raise InvalidInput(f"reward.result_floor must be in [0, 1], got {self.reward.result_floor}")
        for name in ("grpo", "grpo_stage3", "sft", "sft_stage2"):
            args = getattr(self, name)
            if not isinstance(args, dict):
                raise InvalidInput(f"{name} must be a mapping of TRL arguments")
            if "output_dir" in args:
                raise InvalidInput(f"{name}.output_dir: set output_dir at the top level (stages write below it)")
            if name.startswith("grpo") and args.get("use_vllm"):
                raise InvalidInput(f"{name}.use_vllm: Omne's episodes are generated in process through the graph")
            if name.startswith("grpo") and args.get("temperature", 1.0) <= 0:
                raise InvalidInput(f"{name}.temperature must be > 0: GRPO needs different episodes per question")


# -- episodes ------------------------------------------------------------------------------
class PolicyPerEpisode(BaseChatModel):
    """The environment's model until an episode puts the policy in its place (`OmneEnvironment.episode`): the
    context needs no chat pack or model spec of its own, and a call that reaches this model is an error."""

    @property
    def _llm_type(self) -> str:
        return "policy-per-episode"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        raise TrainingError("the Omne environment's model is the policy, set per episode; none was set")


class EpisodeModel(TransformersChatModel):
    """The policy as the Omne graph's chat model for one episode. The graph's successive prompts extend
    one conversation; each is turned into tokens as the previous sequence (prompt, replies as sampled)
    plus the chat-template tokens of the messages the graph added since the last reply, and the reply
    is generated from exactly that, sampled as `generation_config` says (in RL the GRPOTrainer's: its
    temperature, top_p, top_k, ...; None: the model's own), stopping at the graph's stop strings
    (`<tool_response>`: results are the system's to write); the text before the stop is the reply. As at
    inference, the graph's reply grammar constrains each reply where xgrammar is installed (its mask comes
    before the sampling warpers: `GrammarSteps` records, per step, the tokens it left, and the GRPO loss scores
    each sampled token under the policy renormalised over them). Without it the 0.5B policy writes its calls
    after `<|im_start|>`, a token the decoded text drops, and never the `<tool_call>` tag (docs/training.md).

    The graph keeps a reply only through its last tool call (`parse_reply(...).kept`). When the next
    prompt holds such a cut reply, the sampled tokens are cut to the shortest prefix that decodes to it
    (tokens of a remainder inside a token, and the end-of-turn token, are added with env_mask 0), so the
    sequence stays what the graph shows the model and nothing after the call is trained.

    `budget` caps the episode's completion tokens (replies and what the graph adds). When fewer than the
    turn's tokens (`max_new_tokens`, plus the think budget of a constrained turn) + `reserve` are left before
    a turn, the turn is the forced final answer instead: the
    graph's own FORCE_ANSWER message is added (env_mask 0) and the reply answers it; the episode then
    ends (a later call raises ModelError, as does a turn with no room at all)."""

    budget: int = 3072  # completion tokens of the episode: replies and what the graph adds between them
    reserve: int = 256  # tokens kept back for the forced answer: its message and the reply
    generation_config: Any = None  # transformers' GenerationConfig of the replies; None: the model's own

    _prompt: list[int] = PrivateAttr(default_factory=list)
    _completion: list[int] = PrivateAttr(default_factory=list)
    _mask: list[int] = PrivateAttr(default_factory=list)  # 1: sampled by the policy, 0: added by the graph
    _allowed: dict[int, Any] = PrivateAttr(default_factory=dict)  # completion position -> what the grammar allowed
    _replies: list[str] = PrivateAttr(default_factory=list)
    _chat: list[dict[str, str]] = PrivateAttr(default_factory=list)  # the conversation through the last reply
    _reply_start: int = PrivateAttr(default=0)  # where the last reply's tokens start in _completion
    _closed: bool = PrivateAttr(default=False)  # the forced answer was given
    _forced: bool = PrivateAttr(default=False)
    _fault: str | None = PrivateAttr(default=None)

    def episode(self) -> dict[str, Any]:
        """prompt_ids, completion_ids, env_mask, the allowed sets of its partly constrained tokens by completion
        position (`grammar_allowed`), the reply texts (`turns`) and whether the budget forced the last answer
        (`forced`)."""
        if self.device_fault:
            raise TrainingError(f"the policy failed on its device or dtype during an episode ({self.device_fault})")
        if self._fault:
            raise MhqaError(f"cannot train on this episode: {self._fault}")
        return {"prompt_ids": list(self._prompt), "completion_ids": list(self._completion),
                "env_mask": list(self._mask), "grammar_allowed": dict(self._allowed), "turns": list(self._replies),
                "forced": self._forced}

    def _template(self, chat: list[dict[str, str]], generation_prompt: bool) -> list[int]:
        return self._tokenizer.apply_chat_template(chat, add_generation_prompt=generation_prompt,
                                                   return_dict=True)["input_ids"]

    def _cut_reply(self, kept: str) -> None:
        """Cut the last reply's tokens to `kept` (a prefix of its text) and close the turn (env_mask 0)."""
        tok, eos = self._tokenizer, self._tokenizer.eos_token_id
        reply = self._completion[self._reply_start:]
        if reply and reply[-1] == eos and tok.decode(reply[:-1], skip_special_tokens=True) == kept:
            return  # the whole reply, ended by the model
        n = next((j for j in range(len(reply) + 1) if tok.decode(reply[:j], skip_special_tokens=True)
                  .startswith(kept)), len(reply))
        if tok.decode(reply[:n], skip_special_tokens=True) != kept:  # `kept` ends inside token n: re-encode the rest
            n -= 1
            rest = tok.encode(kept[len(tok.decode(reply[:n], skip_special_tokens=True)):], add_special_tokens=False)
        else:
            rest = []
        cut = self._reply_start + n
        self._completion[cut:] = [*rest, eos]
        self._mask[cut:] = [0] * (len(rest) + 1)
        self._allowed = {p: a for p, a in self._allowed.items() if p < cut}

    def _added_ids(self, chat: list[dict[str, str]]) -> list[int]:
        """The template tokens of the messages after the last reply, through the generation prompt; the
        last reply is cut first when the graph kept only its beginning."""
        n = len(self._chat)
        last = chat[n - 1] if len(chat) > n else None
        if last is None or chat[:n - 1] != self._chat[:n - 1] or last["role"] != "assistant" \
                or not self._chat[-1]["content"].startswith(last["content"]):
            raise ModelError("the Omne graph's prompt does not continue the episode's conversation")
        self._cut_reply(last["content"])
        self._chat[-1] = last
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

    def _next_ids(self, chat: list[dict[str, str]], max_new: int) -> tuple[list[dict[str, str]], list[int]]:
        """The conversation this turn answers and the tokens to add before it: the graph's prompt, or, when
        fewer than the turn's `max_new` tokens plus `reserve` are left, that prompt plus the forced-answer
        message."""
        if not self._prompt:
            return chat, []
        added = self._added_ids(chat)
        if chat[-1]["content"] == P.FORCE_ANSWER:
            return chat, added
        if self.budget - len(self._completion) - len(added) >= max_new + self.reserve:
            return chat, added
        forced = [*chat, {"role": "user", "content": P.FORCE_ANSWER}]
        self._forced = True
        return forced, self._added_ids(forced)

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        import torch

        from .grammar_scoring import GrammarSteps

        if self._closed:
            raise ModelError(f"the episode used its budget of {self.budget} completion tokens")
        turn = int(kwargs.get("max_new_tokens", self.max_new_tokens))  # a constrained turn adds its think budget
        try:
            chat, added = self._next_ids(chat_dicts(messages), turn)
        except ModelError as exc:  # the graph would only record it: episode() raises it
            self._fault = str(exc)
            raise
        if not self._prompt:
            self._prompt = self._template(chat, True)
        room = self.budget - len(self._completion) - len(added) - 1  # 1: a closing eos
        max_new = min(turn, room)
        if max_new < 1:
            self._closed = True
            raise ModelError(f"the episode used its budget of {self.budget} completion tokens")
        self._completion += added
        self._mask += [0] * len(added)
        self._closed = self._forced
        stops = [s for s in (stop or self.stop or []) if s]
        config = copy.deepcopy(self.generation_config or self._model.generation_config)
        config.max_new_tokens, config.stop_strings = max_new, stops or None
        processors, decoding = self.constrained(kwargs)
        steps = GrammarSteps()
        ids = torch.tensor([self._prompt + self._completion], device=model_device(self._model))
        out = self.generate_ids(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                logits_processor=[*processors, steps] if processors else [],
                                tokenizer=self._tokenizer)
        new = out[0, ids.shape[1]:].tolist()
        self._reply_start = len(self._completion)
        self._completion += new
        self._mask += [0 if steps.forced_at(i) else 1 for i in range(len(new))]
        self._allowed |= {self._reply_start + i: a for i in range(len(new)) if (a := steps.allowed_at(i)) is not None}
        text = self._tokenizer.decode(new, skip_special_tokens=True)
        for s in stops:
            text = text.split(s, 1)[0]
        self._replies.append(text)
        self._chat = [*chat, {"role": "assistant", "content": text}]
        finish = "stop" if new and (new[-1] == self._tokenizer.eos_token_id or len(new) < max_new) else "length"
        return ChatResult(generations=[ChatGeneration(message=AIMessage(
            text, response_metadata={"model_name": self._name, "finish_reason": finish, **decoding}))])


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
    """The questions of `config.path` and the graph they are asked over, ingested into the open `store`.
    Episodes run the paper's loop without the small-model guards (`guards: none`, unless `config.context`
    names some): RL is to teach what the guards patch, and a guard's send-back would put an answer in a
    turn before the last, which the format reward scores 0."""

    def __init__(self, config: RolloutConfig, store: Any) -> None:
        env = prepare(store, config.dataset, config.path, environment_name(config.dataset, config.path))
        if not env["graph"]:
            raise InvalidInput(f"{config.path} gives no knowledge graph as {config.dataset}; Omne needs a KG "
                               "dataset (2wiki evidences, pathquestion)")
        items = load_questions(config.dataset, config.path, config.limit, config.start)
        self.questions = {q.prompt: q for q in (Question(i.question, list(i.answers), list(i.topic_entities))
                                                for i in items)}
        self.context = make_context("omne", store=store, graph=env["graph"],
                                    **{"guards": "none", "llm": PolicyPerEpisode(), **config.context})
        self.graph = build_graph("omne")
        self.config = config

    def dataset(self) -> Any:
        from datasets import Dataset

        return Dataset.from_list([{"prompt": [{"role": "user", "content": key}], "answers": q.answers}
                                  for key, q in self.questions.items()])

    def episode(self, model: Any, tokenizer: Any, prompt: str, budget: int, reserve: int = 256,
                generation_config: Any = None) -> dict[str, Any]:
        """One run of the Omne graph on the question of `prompt` with `model` as the policy, its replies
        sampled as `generation_config` says (None: the model's own)."""
        question = self.questions[prompt]
        llm = EpisodeModel.from_loaded(model, tokenizer, model_name="policy", max_new_tokens=self.config.max_new_tokens,
                                       budget=budget, reserve=reserve, generation_config=generation_config)
        inputs = {"question": question.question, "topic_entities": question.topic_entities}
        output = self.graph.invoke(inputs, context=dataclasses.replace(self.context, llm=llm))
        result = llm.episode()
        if not result["prompt_ids"]:
            raise MhqaError(f"the Omne graph made no model call: {output.get('error')}")
        calls = output["tool_calls"]
        return {k: v for k, v in result.items() if k != "forced"} | {
            "episode_rounds": output["rounds"], "episode_tool_calls": len(calls),
            "episode_successful_calls": sum(not c["repeated"] and not c["result_preview"].startswith("Error")
                                            for c in calls),
            "episode_repeated_calls": output["repeated_calls"], "episode_forced": int(result["forced"])}

    def rollout_func(self, reserve: int = 256) -> Callable[[list, Any], dict[str, list]]:
        """TRL's `rollout_func`: one episode per prompt (GRPOTrainer repeats each num_generations times),
        within `max_completion_length` tokens of which `reserve` are kept for the forced answer, sampled with
        the trainer's generation config. (TRL overrides the model's own config for generation only before
        transformers 5; a model whose own config is greedy would give a group of identical episodes.)"""

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
                                                 trainer.args.max_completion_length, reserve,
                                                 trainer.generation_config))
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
             episode_successful_calls: list[int] | None = None,
             log_metric: Callable[[str, float], None] | None = None, **kwargs: Any) -> list[float]:
        successful = episode_successful_calls or [None] * len(turns)
        if log_metric is not None:  # TRL averages these per logging step
            formats = [format_reward(t, base, n) for t, n in zip(turns, successful)]
            log_metric("episodes/format", sum(formats) / len(formats))
            for key in EPISODE_COUNTS:
                values = episode_successful_calls if key == "episode_successful_calls" else kwargs.get(key)
                if values is not None:
                    log_metric(f"episodes/{key.removeprefix('episode_')}", sum(values) / len(values))
        return [omne_reward(t, a, base, n) for t, a, n in zip(turns, answers, successful)]

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


def format_stop(patience: int, stage: int) -> Any:
    """A callback that stops an RL stage once `patience` logged steps in a row had `episodes/format` 0:
    every reward, so every advantage, is 0 and nothing is learnt. Its `message` says so (None if not)."""
    from transformers import TrainerCallback

    class FormatStop(TrainerCallback):
        zeros, message = 0, None

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            if not logs or "episodes/format" not in logs:
                return
            self.zeros = self.zeros + 1 if logs["episodes/format"] == 0 else 0
            if patience and on_main_process(lambda: self.zeros >= patience, share=True):  # one decision for all
                self.message = (f"stage {stage} stopped at step {state.global_step}: the format reward stayed 0 for "
                                f"{self.zeros} steps (no episode followed the tool protocol), so every advantage was "
                                "0; warm-start the policy on teacher trajectories (teacher + warm_start: true) or "
                                "run stage 2 first")
                control.should_training_stop = True

    return FormatStop()


def canonical_row(row: dict[str, Any], think_weight: float, answer_thought: str | None = None) -> dict[str, Any]:
    """An SFT row with every trained assistant reply in the protocol's form (`graphs.omne.protocol.canonical_reply`),
    its loss segments made anew: a teacher that writes its calls as bare JSON, which the graph reads, still
    teaches tagged calls. With `answer_thought`, a reply that opens with its answer gets that thought first."""
    def canonical(text: str) -> str:
        text = canonical_reply(text)
        return f"<think>{answer_thought}</think>\n{text}" if answer_thought and text.startswith("<answer>") else text

    return row | {"messages": [weighted_message("assistant", canonical(m["content"]), think_weight)
                               if m["role"] == "assistant" and m.get("weight") else m for m in row["messages"]]}


def format_ok(row: dict[str, Any], record: dict[str, Any], reward: OmneRewardConfig) -> bool:
    """Whether an Omne chat's assistant turns follow the protocol (`format_reward`); a run the graph marked
    NoToolCall had no successful tool call."""
    turns = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    successful = 0 if str(record.get("error") or "").startswith("NoToolCall") else None
    return bool(turns) and format_reward(turns, reward, successful) == 1


class OmneTrainer:
    """Runs the configured stages on one model; `train()` returns a summary of every stage's logs."""

    def __init__(self, config: OmneConfig) -> None:
        check_disjoint(config.rollout, config.dev)
        self.config = config
        self.out = Path(config.output_dir)
        self.model, self.tokenizer = load_model(config.model)
        self._sft_rows: list[dict[str, Any]] | None = None

    def _trl_args(self, cls: type, defaults: dict, args: dict, stage: int, **fixed: Any) -> Any:
        try:
            return cls(**{**defaults, "seed": self.config.model.seed, **precision_args(args), **args, **fixed,
                          "output_dir": str(self.out / f"stage{stage}")})
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"stage {stage} TRL arguments: {exc}") from None

    def grpo_trainer(self, stage: int, env: OmneEnvironment, callbacks: list | None = None) -> Any:
        """The GrammarGRPOTrainer of RL stage `stage` over the episodes of `env`, on the current weights."""
        from trl import GRPOConfig

        from .grammar_scoring import GrammarGRPOTrainer

        args = self._trl_args(GRPOConfig, GRPO_DEFAULTS,
                              {**self.config.grpo, **(self.config.grpo_stage3 if stage == 3 else {})}, stage)
        return GrammarGRPOTrainer(model=self.model, args=args, processing_class=self.tokenizer,
                                  reward_funcs=stage_rewards(stage, self.config.reward, self.config.repetition_weight),
                                  train_dataset=env.dataset(),
                                  rollout_func=env.rollout_func(self.config.episode_reserve), callbacks=callbacks)

    def _grpo(self, stage: int, log: Any, state: dict[str, Any]) -> Any:
        stop = format_stop(self.config.format_patience, stage)
        with rollout_store(self.config.rollout) as store:
            trainer = self.grpo_trainer(stage, OmneEnvironment(self.config.rollout, store), [log, stop])
            train_resuming(trainer, {**state, "args": self.config.grpo}, self.out / LOG)
        if stop.message:
            warnings.warn(stop.message, stacklevel=2)
            write_log(self.out / LOG, {"stage": stage, "event": "stopped", "message": stop.message})
        trainer.stopped = stop.message
        return trainer

    def sft_data(self) -> list[dict[str, Any]]:
        """Stage 2's (and the warm start's) chats, each reply in the protocol's form (`canonical_row`):
        `sft_data`, else the sft export of Omne rollouts by the teacher (or the policy) with F1 >=
        `sft_min_reward` whose turns follow the format but for <think> blocks (the 1.5B teacher calls with a
        thought and answers without one; RL asks for them); plus `templates` template trajectories
        (`omne_templates`), which stand alone where the policy's own rollouts would be used. Made once."""
        if self._sft_rows is not None:
            return self._sft_rows
        cfg = self.config
        rows = self.template_rows()
        if cfg.sft_data:
            rows += [canonical_row(row, cfg.think_weight, cfg.answer_thought) for row in read_sft_data(cfg.sft_data)]
        elif cfg.teacher or not cfg.templates:
            records = self.sft_rollouts()
            protocol = dataclasses.replace(cfg.reward, think=False)  # thinking is not asked of the data
            for record in records:
                for row in sft_rows([record], min_reward=cfg.sft_min_reward, think_weight=cfg.think_weight):
                    row = canonical_row(row, cfg.think_weight, cfg.answer_thought)
                    if cfg.sft_min_reward is None or format_ok(row, record, protocol):
                        rows.append(row)
        rows = [{"messages": r["messages"]} for r in rows
                if any(m["role"] == "assistant" for m in r.get("messages") or [])]
        if not rows:
            raise InvalidInput("no trajectories to train on in SFT (check sft_data / teacher / sft_min_reward)")
        self._sft_rows = rows
        return rows

    def template_rows(self) -> list[dict[str, Any]]:
        """`templates` template trajectories of the rollout questions, their counts logged (event `templates`)."""
        if not self.config.templates:
            return []
        from .omne_templates import rollout_templates

        rows, counts = rollout_templates(self.config.rollout, self.config.templates, self.config.think_weight)
        write_log(self.out / LOG, {"event": "templates", **counts})
        return rows

    def sft_rollout_dir(self) -> Path:
        """Where the SFT rollouts go: `sft_rollouts/teacher-<spec>-<hash>`, one folder per teacher and sampling,
        or `sft_rollouts/policy`."""
        cfg = self.config
        return self.out / "sft_rollouts" / (teacher_folder(cfg.teacher, cfg.rollout, cfg.model.seed) if cfg.teacher
                                            else "policy")

    def sft_rollouts(self) -> list[dict[str, Any]]:
        """The eval records of the SFT rollouts. A teacher's are kept in its own folder (and with `dev.records`
        published there, and read back on another machine): a later training into the same output_dir with that
        teacher and the same rollout settings reuses them (resuming an interrupted run), another teacher never
        touches them, and other rollout settings start the folder afresh with a warning. The policy's are started
        afresh every time: they are of this training's weights."""
        cfg, out = self.config, self.sft_rollout_dir()
        concurrency = cfg.model.rollout_concurrency
        if not cfg.teacher:
            llm = policy_chat_model(self.model, self.tokenizer, cfg.model, out, cfg.rollout.temperature,
                                    cfg.rollout.max_new_tokens)
            return rollouts(cfg.rollout, llm, out, force_new=True, concurrency=concurrency)
        committed = Path(cfg.dev.records) / "sft_rollouts" if cfg.dev.records else None
        try:
            return teacher_rollouts(cfg.rollout, cfg.teacher, cfg.model.seed, out.parent, committed, concurrency)
        except RunMismatch:
            message = f"{out} held the teacher's rollouts with other rollout settings; started them afresh"
            warnings.warn(message, stacklevel=2)
            write_log(self.out / LOG, {"event": "rollouts_restarted", "message": message})
            return teacher_rollouts(cfg.rollout, cfg.teacher, cfg.model.seed, out.parent, committed, concurrency,
                                    force_new=True)

    def _sft(self, stage: int, log: Any, state: dict[str, Any]) -> Any:
        from datasets import Dataset

        from .weighted_sft import WeightedSFTConfig, WeightedSFTTrainer

        sft = {**self.config.sft, **(self.config.sft_stage2 if stage == 2 else {})}
        args = self._trl_args(WeightedSFTConfig, SFT_DEFAULTS, sft, stage, think_weight=self.config.think_weight)
        trainer = WeightedSFTTrainer(model=self.model, args=args, train_dataset=Dataset.from_list(self.sft_data()),
                                     processing_class=self.tokenizer, callbacks=[log])
        train_resuming(trainer, {**state, "args": sft}, self.out / LOG)
        return trainer

    def dev(self, name: str) -> dict[str, Any]:
        """Dev metrics of the policy (greedy), logged as event `dev`: F1, tool-call and well-formed rates, LLM
        calls, and ΔF1 against the untrained run (`dev.dev_run`)."""
        cfg = self.config
        metrics = policy_dev(cfg.rollout, cfg.dev, self.model, self.tokenizer, self.out, name, cfg.model)
        if metrics:
            write_log(self.out / LOG, {"event": "dev", "after": name, **metrics})
        return metrics

    def order(self) -> list[int]:
        """The stages this config runs, in order: the warm start (0) if asked, then `stages`."""
        return ([0] if self.config.warm_start else []) + list(self.config.stages)

    def resume(self) -> list[dict[str, Any]]:
        """The states of the stages already trained by an earlier run of this order (the longest run of
        checkpoints `stage<k>/checkpoint` whose stages are this order's first ones), the last one's weights
        loaded; [] if none."""
        order = self.order()
        by_position = {state["position"]: (state, path)
                       for state, path in saved_checkpoints(self.out, "stage*", STATE_TYPES)}
        done: list[tuple[dict[str, Any], Path]] = []
        for i in range(len(order)):
            found = by_position.get(i)
            if found is None or found[0].get("order") != order[:i + 1]:
                break
            done.append(found)
        if done:
            load_checkpoint(self.model, done[-1][1])
            write_log(self.out / LOG, {"event": "resumed", "after_stage": done[-1][0]["stage"]})
        return [state for state, _ in done]

    def logged_dev(self, name: str) -> dict[str, Any] | None:
        """The dev metrics logged after `name`, if a finished dev run logged them."""
        entries = read_log(self.out / LOG)
        found = [e for e in entries if e.get("event") == "dev" and e.get("after") == name]
        return {k: v for k, v in found[-1].items() if k not in ("event", "after")} if found else None

    def train(self) -> dict[str, Any]:
        """The warm start (stage 0) if asked, then the configured stages, each followed by a dev evaluation. Each
        trained stage is saved to `stage<k>/checkpoint`; a rerun of the same config resumes after the last one,
        and within a stopped stage at its last step (`train_resuming`)."""
        self.out.mkdir(parents=True, exist_ok=True)
        summary: dict[str, Any] = {"stages": [], "dev": untrained_runs(self.config.dev, self.dev)}
        order, done = self.order(), self.resume()
        for i, stage in enumerate(order):
            name = f"stage{stage}"
            if i < len(done):
                summary["stages"].append({k: done[i][k] for k in SUMMARY_KEYS} | {"log": []})
                logged = self.logged_dev(name)
                summary["dev"][name] = logged if logged is not None else self.dev(name)
                continue
            log = jsonl_log(self.out / LOG, stage=stage)
            kind = "sft" if stage == 0 else STAGES[stage]
            state = {"stage": stage, "position": i, "order": order[:i + 1]}
            trainer = (self._grpo if kind == "grpo" else self._sft)(stage, log, state)
            state |= {"kind": kind, "steps": trainer.state.global_step, "stopped": getattr(trainer, "stopped", None)}
            save_checkpoint(self.model, self.out / name, state)
            summary["stages"].append({k: state[k] for k in SUMMARY_KEYS} | {"log": log.entries})
            summary["dev"][name] = self.dev(name)
        if self.config.dev.guards_off and self.config.dev.path:
            summary["dev"][GUARDS_OFF] = self.logged_dev(GUARDS_OFF) or self.dev(GUARDS_OFF)
        if not self.config.dev.path:
            summary["dev"] = {}
        summary["final"] = save_policy(self.model, self.tokenizer, self.out / "final")
        publish_final(self.config.dev, self.model, self.out)
        summary["curve"] = plot_curve(self.out, "Omne")
        return summary
