"""MAPGRPO (OPERA, arXiv 2508.16438): multi-agent progressive GRPO, one OPERA role at a time.

With LoRA, every role has its own PEFT adapter (`plan`, `analysis`, `rewrite`); OPERA runs with one
role-aware chat model per role (`RoleChatModel`, which switches the adapter for each call) and the final
synthesis (`answer`, not trained) on the base model. For each role in order (plan, then analysis-answer,
then rewrite):
1. roll out OPERA over `rollout`'s questions, every role on its own adapter as trained so far;
   `role_rows` turns the traces into the role's prompts and signals, and each question's gold chain
   (`QAItem.chain`, one `Hop` per reasoning step, carried by the eval records) gives the gold;
2. train only that role's adapter with TRL's GRPO (group size `grpo.num_generations`, KL `grpo.beta`):
   the earlier roles' adapters are frozen (requires_grad off, not in the optimizer), so their weights
   stay bit-identical. Rewards (training/rewards.py):
   - plan: λ1·logic + λ2·structure + λ3·execution; logic 0 for a one-sub-goal plan of a multi-hop
     question and for forward references, structure the sub-goal count and placeholder links against
     the gold chain, execution = F1 of the answer OPERA reaches with the completion as its plan (the
     other roles played by `executor`: the current policy with its role adapters, greedy, or a spec);
   - analysis: α·𝕀[sufficient = gold] + β·EM(answer, gold sub-answer) + γ·format for sub-goal i against
     hop i of the chain (the label: whether that hop's evidence was in the passages or facts shown, those
     of the sub-goal's earlier attempts included);
     without per-hop gold only the last sub-goal is scored, against the final answer;
   - rewrite: ω1·√NDCG@k of the rewritten query's retrieval (as OPERA parses it, searched at the
     context's top_k in the read-only store) against the hop's gold evidence + ω2·format;
3. high-score sample selection, for the roles in `inject_roles` (default: plan, as the paper): `expert`
   is a `mhqa export --format roles` folder (e.g. a stronger model's run). For every prompt with an
   expert row (best `expert_score` >= `expert_min_score`), the expert completion is added to its group of
   `num_generations` samples, scored by the same reward: it anchors the group's baseline (mean and std). TRL's
   groups are of one size, so a stage with experts samples groups of num_generations + 1 and puts the expert in
   the last place (a prompt without one keeps num_generations + 1 samples of its own). Its own tokens get no
   gradient unless `expert_gradient` (the paper's current text adds the sample to the group without training
   on it directly). The expert rows' prompts join the role's training prompts.

Full fine-tuning (`model.lora: false`) has one set of weights for every role, so earlier roles change
when later ones train; use LoRA for the paper's frozen roles. With beta > 0 the KL reference is the
policy that entered the stage (TRL copies the active adapter as "ref"; a fully fine-tuned model is
saved and reloaded as the reference). With `dev.path`, OPERA answers the dev slice greedily before
training and after each role (dev F1 with ΔF1 against the untrained run, LLM calls per question in log.jsonl).
With `heldout: N`, the role prompts of the last N rollout questions are held back from training, and GRPO's
evaluation samples the role on them before the first step and every `heldout_every` steps: the role reward on
prompts it never trained on (`eval_rewards/<role>/mean`, `eval_reward` in log.jsonl).

    trainer = MAPGRPOTrainer(load_config(MAPGRPOConfig, "configs/train/mapgrpo.yaml"))
    summary = trainer.train()     # output_dir/log.jsonl, output_dir/final/<role> adapters
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, load_from_disk
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.calls import REPAIR_PREFIX
from mhqa_graph.graphs.opera import prompts as P
from mhqa_graph.graphs.opera.analysis import parse_rewrite
from mhqa_graph.graphs.opera.graph import retrieve_contexts
from trl import GRPOConfig, GRPOTrainer

from mhqa_graph.errors import InvalidInput
from mhqa_graph.eval.diagnostics import chain_from_json, chain_json
from mhqa_graph.eval.paired import cluster_key
from mhqa_graph.eval.runner import load_questions
from mhqa_graph.eval.scoring import score
from mhqa_graph.export import OPERA_ROLES, role_rows
from mhqa_graph.ingest.datasets import Hop
from mhqa_graph.models.chat import TransformersChatModel
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel

from .checkpoints import STEP_SAVES, load_checkpoint, save_checkpoint, saved_checkpoints, train_resuming
from .configs import DevConfig, ModelConfig, RolloutConfig
from .dev import GUARDS_OFF, check_disjoint, dev_run, publish_final, untrained_runs
from .devices import barrier, on_main_process, precision_args
from .logs import LOG, jsonl_log, plot_curve, write_log
from .policy import llamacpp_policy, load_model, policy_chat_model, save_policy, serves_with_llamacpp
from .rewards import (
    AnalysisRewardConfig,
    PlanRewardConfig,
    RewriteRewardConfig,
    analysis_gold,
    analysis_reward,
    evidence_ndcg,
    per_hop,
    plan_reward,
    rewrite_reward,
)
from .rollouts import check_policy_faults, rollouts
from .serving import served_policy


@dataclass
class MAPGRPOConfig:
    """The policy, the OPERA rollouts of each stage, the roles in order, GRPO arguments and the role rewards."""

    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(agent="opera"))
    dev: DevConfig = field(default_factory=DevConfig)  # held-out questions answered before and after each role
    roles: list[str] = field(default_factory=lambda: list(OPERA_ROLES))  # trained in this order
    grpo: dict[str, Any] = field(default_factory=dict)  # GRPOConfig arguments: num_generations, beta, max_steps, ...
    plan_reward: PlanRewardConfig = field(default_factory=PlanRewardConfig)
    analysis_reward: AnalysisRewardConfig = field(default_factory=AnalysisRewardConfig)
    rewrite_reward: RewriteRewardConfig = field(default_factory=RewriteRewardConfig)
    executor: str = "policy"  # who plays analysis/rewrite/answer when a plan is executed: policy or a model spec
    execution_cache: bool = True  # reuse the execution score of a (question, plan) pair within a stage
    expert: str = ""  # a roles export folder (DatasetDict or <role>.jsonl files) of high-score samples
    expert_score: str = "reward"  # the field holding an expert row's score
    expert_min_score: float = 0.0  # expert rows scoring less are not injected
    inject_roles: list[str] = field(default_factory=lambda: ["plan"])  # the roles whose groups take expert samples
    expert_gradient: bool = False  # train on the injected sample's own tokens too (default: it only anchors)
    heldout: int = 0  # the last N rollout questions, whose role prompts are not trained on: the held-back curve
    heldout_every: int = 5  # steps between two evaluations of the role reward on them (and one before the first)
    output_dir: str = "runs/mapgrpo"


def grpo_args(config: MAPGRPOConfig, output_dir: str | Path, heldout: bool = False,
              expert_slot: bool = False) -> GRPOConfig:
    """GRPOConfig from `config.grpo` over CPU-friendly defaults, use_cpu and bf16 from the policy's device
    (`devices.precision_args`), a step checkpoint after every step (a stopped role resumes there); with
    `heldout`, an evaluation every `config.heldout_every` steps, one group of completions per eval batch. With
    `expert_slot`, train groups have one more place, for the expert sample added to num_generations policy
    samples (the batch grows with them: the same prompts a step). Bad arguments raise InvalidInput."""
    defaults = dict(report_to=[], **STEP_SAVES, logging_steps=1, disable_tqdm=True, gradient_checkpointing=False,
                    seed=config.model.seed, **precision_args(config.grpo))
    group = config.grpo.get("num_generations") or GRPOConfig.__dataclass_fields__["num_generations"].default
    if heldout:
        defaults |= dict(eval_strategy="steps", eval_steps=config.heldout_every,
                         per_device_eval_batch_size=config.grpo.get("num_generations_eval") or group)
    grown = {}
    if expert_slot:
        batch = config.grpo.get("per_device_train_batch_size", GRPOConfig.__dataclass_fields__[
            "per_device_train_batch_size"].default)
        if batch % group:
            raise InvalidInput(f"grpo: per_device_train_batch_size {batch} must be a multiple of num_generations "
                               f"{group} to add the expert sample to each group")
        grown = {"num_generations": group + 1, "per_device_train_batch_size": batch // group * (group + 1),
                 "num_generations_eval": config.grpo.get("num_generations_eval") or group}
    try:
        return GRPOConfig(**(defaults | config.grpo | grown | {"output_dir": str(output_dir)}))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"grpo: {exc}") from None


def check_config(config: MAPGRPOConfig) -> None:
    """InvalidInput unless the config can run: OPERA rollouts, known roles in progressive order, valid GRPO
    arguments (a group of >= 2), beta >= 0, non-negative reward weights, an existing expert folder."""
    if config.rollout.agent != "opera":
        raise InvalidInput(f"rollout.agent must be 'opera' (MAPGRPO trains OPERA's roles), "
                           f"not {config.rollout.agent!r}")
    if not config.roles or any(r not in OPERA_ROLES for r in config.roles):
        raise InvalidInput(f"roles must be a non-empty list of {', '.join(OPERA_ROLES)}, got {config.roles!r}")
    if list(config.roles) != sorted(set(config.roles), key=OPERA_ROLES.index):
        raise InvalidInput(f"roles train progressively in the order {' -> '.join(OPERA_ROLES)}, each once; "
                           f"got {config.roles!r}")
    if not isinstance(config.inject_roles, list) or any(r not in OPERA_ROLES for r in config.inject_roles):
        raise InvalidInput(f"inject_roles must be a list of {', '.join(OPERA_ROLES)}, got {config.inject_roles!r}")
    if not isinstance(config.grpo, dict):
        raise InvalidInput(f"grpo must be a mapping of GRPOConfig arguments, got {type(config.grpo).__name__}")
    args = grpo_args(config, Path(config.output_dir) / "grpo")  # GRPOConfig checks num_generations >= 2
    if args.beta < 0:
        raise InvalidInput(f"grpo.beta (the KL coefficient) must be >= 0, got {args.beta}")
    for name in ("plan_reward", "analysis_reward", "rewrite_reward"):
        weights = {k: v for k, v in asdict(getattr(config, name)).items() if k != "max_subgoals"}
        if any(not isinstance(v, (int, float)) or v < 0 for v in weights.values()):
            raise InvalidInput(f"{name}: weights must be non-negative numbers, got {weights}")
    if not isinstance(config.executor, str) or not config.executor:
        raise InvalidInput("executor must be 'policy' or a chat model spec")
    if config.expert and not Path(config.expert).is_dir():
        raise InvalidInput(f"expert: {config.expert} is not a roles export folder")
    if not isinstance(config.heldout, int) or config.heldout < 0 or not isinstance(config.heldout_every, int) \
            or config.heldout_every < 1:
        raise InvalidInput(f"heldout must be an integer >= 0 and heldout_every one >= 1, got {config.heldout!r} and "
                           f"{config.heldout_every!r}")
    if config.heldout and config.rollout.limit is not None and config.heldout >= config.rollout.limit:
        raise InvalidInput(f"heldout ({config.heldout}) leaves no rollout question to train on "
                           f"(rollout.limit {config.rollout.limit})")
    if config.heldout:
        grpo_args(config, Path(config.output_dir) / "grpo", heldout=True)


# -- one adapter per role ------------------------------------------------------------------------
_SWITCH = threading.Lock()  # adapter switches and the generation they serve, one at a time


@contextmanager
def using_adapter(model: Any, adapter: str | None) -> Iterator[None]:
    """`model` generating with `adapter` (None: the base model, adapters off); afterwards the active
    adapter and every parameter's requires_grad are as before, so a role being trained stays the only
    trainable one even while other roles generate inside its reward function."""
    if not hasattr(model, "peft_config"):
        yield
        return
    with _SWITCH:
        active = model.active_adapter
        grads = {n: p.requires_grad for n, p in model.named_parameters()}
        try:
            if adapter is None:
                with model.disable_adapter():
                    yield
            else:
                model.set_adapter(adapter)
                yield
        finally:
            model.set_adapter(active)
            for n, p in model.named_parameters():
                p.requires_grad_(grads[n])


class RoleChatModel(TransformersChatModel):
    """The policy as the chat model of one OPERA role: every call generates with the role's adapter."""

    adapter: str | None = None

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        with using_adapter(self._model, self.adapter):
            return super()._generate(messages, stop, run_manager, **kwargs)


def add_role_adapters(model: Any) -> None:
    """Give a PEFT model one fresh LoRA adapter per OPERA role (the config of its "default" adapter),
    replacing "default"."""
    config = model.peft_config["default"]
    for role in OPERA_ROLES:
        model.add_adapter(role, config)
    model.set_adapter(OPERA_ROLES[0])
    model.delete_adapter("default")


def role_models(model: Any, tokenizer: Any, temperature: float, max_new_tokens: int,
                seed: int | None = None) -> tuple[Any, dict[str, Any]]:
    """(the base model for every other call, {role: its adapter's chat model}) over the policy. Without
    adapters (full fine-tuning) every role is the one model. `seed` seeds sampled calls (call n: seed + n)."""
    def chat(adapter: str | None) -> RoleChatModel:
        return RoleChatModel.from_loaded(model, tokenizer, model_name=f"policy:{adapter or 'base'}", seed=seed,
                                         temperature=temperature, max_new_tokens=max_new_tokens, adapter=adapter)

    if not hasattr(model, "peft_config"):
        base = chat(None)
        return base, {role: base for role in (*OPERA_ROLES, "answer")}
    return chat(None), {role: chat(role) for role in OPERA_ROLES} | {"answer": chat(None)}


# -- prompts, gold and expert samples ------------------------------------------------------------
def prompt_key(prompt: list[dict[str, Any]]) -> str:
    return json.dumps([[m["role"], m["content"]] for m in prompt], ensure_ascii=False)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string or a chat [{"role": "assistant", "content": ...}]."""
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)


def first_prompt(prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompt as first asked: a repair exchange at its end (the bad reply and "That reply could not be
    used ...") is cut off, so the role learns to reply right the first time."""
    while len(prompt) >= 2 and prompt[-2]["role"] == "assistant" and prompt[-1]["role"] == "user" \
            and prompt[-1]["content"].startswith(REPAIR_PREFIX):
        prompt = prompt[:-2]
    return prompt


def training_row(row: dict[str, Any], chain: list[Hop] | None = None) -> dict[str, Any]:
    """The columns GRPO and the role rewards need from a role row (plan rows have no query or step) and
    the question's gold chain (JSON, as eval records carry it). Rows exported before OPERA merged its
    attempts' passages have no `shown_ids`: their analysis was shown what its query retrieved."""
    prompt = first_prompt([{"role": m["role"], "content": m["content"]} for m in row["prompt"]])
    return {"prompt": prompt, "id": str(row.get("id", "")), "question": str(row.get("question", "")),
            "answers": [str(a) for a in row.get("answers") or []],
            "supporting_ids": [str(i) for i in row.get("supporting_ids") or []],
            "shown_ids": [str(i) for i in row.get("shown_ids") or row.get("retrieved_ids") or []],
            "query": str(row.get("query") or ""),
            "step": int(row.get("step") or 0), "steps": int(row.get("steps") or 0),
            "chain": json.dumps(chain_json(chain or []), ensure_ascii=False)}


class GoldChains:
    """Each question's gold chain by id: from the rollouts' eval records, else (expert rows of other
    questions) from the rollout's dataset file, read once when first needed."""

    def __init__(self, records: list[dict[str, Any]], rollout: RolloutConfig) -> None:
        self.chains = {str(r.get("id")): chain_from_json(r.get("chain") or []) for r in records}
        self.rollout, self.read = rollout, False

    def __call__(self, qid: str) -> list[Hop]:
        if qid not in self.chains and not self.read:
            self.read = True
            for item in load_questions(self.rollout.dataset, self.rollout.path):
                self.chains.setdefault(item.id, list(item.chain))
        return self.chains.get(qid, [])


def load_expert(path: str | Path, role: str, score_key: str = "reward",
                min_score: float = 0.0) -> dict[str, dict[str, Any]]:
    """prompt key -> {row (the expert's role row), expert (the completion text), score} of the best-scoring
    expert row of `role` with score >= min_score, from a roles export folder: its DatasetDict
    (load_from_disk) or its `<role>.jsonl`."""
    path = Path(path)
    if (path / "dataset_dict.json").is_file():
        data = load_from_disk(str(path))
        rows = list(data[role]) if role in data else []
    elif (path / f"{role}.jsonl").is_file():
        lines = (path / f"{role}.jsonl").read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    else:
        return {}
    best: dict[str, dict[str, Any]] = {}
    for n, row in enumerate(rows):
        value = row.get(score_key)
        if not (isinstance(row.get("prompt"), list) and row.get("completion") and isinstance(value, (int, float))):
            raise InvalidInput(f"expert {path} ({role}) row {n}: needs a prompt chat, a completion and a numeric "
                               f"{score_key!r}")
        if value < min_score:
            continue
        key = prompt_key(first_prompt(row["prompt"]))
        if key not in best or value > best[key]["score"]:
            best[key] = {"row": row, "expert": completion_text(row["completion"]), "score": float(value)}
    return best


def split_heldout(rows: list[dict[str, Any]], records: list[dict[str, Any]],
                  n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, held-back rows): the rows of the last `n` questions the rollout records answered are held
    back (an expert's row of one of them too), and with them every question of the same gold path
    (`eval.paired.cluster_key`: PathQuestion asks each path in about three paraphrases), so no training prompt
    comes from a held-back question or a paraphrase of one."""
    ids = list(dict.fromkeys(str(r.get("id")) for r in records))
    held = set(ids[len(ids) - n:]) if n else set()
    cluster = {str(r.get("id")): cluster_key(r) for r in records}
    held_clusters = {cluster[i] for i in held if i in cluster}
    held |= {i for i, c in cluster.items() if c in held_clusters}
    return [r for r in rows if r["id"] not in held], [r for r in rows if r["id"] in held]


def stage_rows(rows: list[dict[str, Any]], experts: dict[str, dict[str, Any]],
               chains: Any = lambda qid: []) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The stage's training prompts (the policy's, one per distinct prompt, then the expert-only ones) with
    their gold chains (`chains`: question id -> chain), and the expert completion of each prompt."""
    out, seen = [], set()
    for row in [*rows, *(e["row"] for e in experts.values())]:
        row = training_row(row, chains(str(row.get("id", ""))))
        key = prompt_key(row["prompt"])
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out, {key: e["expert"] for key, e in experts.items()}


# -- GRPO with injected expert samples -----------------------------------------------------------
class ExpertGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose groups take one expert completion: for a prompt in `experts` (prompt key ->
    completion text), the group's last member (the place `grpo_args(expert_slot=True)` adds) is replaced after
    generation by the expert's tokens plus eos,
    all of them (max_completion_length bounds generation only: a cut would score a prefix by the whole).
    Its reward enters the group's mean and std, so it anchors the others' advantages; with
    `expert_gradient` False its own tokens are masked out of the loss."""

    def __init__(self, *args: Any, experts: dict[str, str] | None = None, expert_gradient: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.experts = experts or {}
        self.expert_gradient = expert_gradient
        self._injected: list[int] = []

    def _expert_ids(self, text: str) -> list[int]:
        tok = self.processing_class
        return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    def _generate(self, prompts: list):
        out = list(super()._generate(prompts))
        _, completion_ids, _, completions, logprobs = out[:5]
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        offset = self.accelerator.process_index * len(prompts)  # groups run across processes' slices
        self._injected = []
        for i, prompt in enumerate(prompts):
            text = self.experts.get(prompt_key(prompt)) if (offset + i) % group == group - 1 else None
            if text is None:
                continue
            completion_ids[i] = self._expert_ids(text)
            completions[i] = [{"role": "assistant", "content": text}] if isinstance(completions[i], list) else text
            if logprobs is not None:  # no sampling logprobs for it: NaN, which TRL's importance sampling zeroes
                logprobs[i] = [float("nan")] * len(completion_ids[i])  # (a None would fail torch.tensor in older TRL)
            self._injected.append(i)
        self._metrics[mode]["expert/injected"].append(float(len(self._injected)))
        return tuple(out)

    def _generate_and_score_completions(self, inputs: list) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        if self._injected and not self.expert_gradient:
            mask = out["completion_mask"]
            removed = mask[self._injected].sum()
            mask[self._injected] = 0
            out["num_items_in_batch"] = out["num_items_in_batch"] - self.accelerator.gather(removed).sum()
        return out


# -- role rewards --------------------------------------------------------------------------------
@contextmanager
def evaluating(model: Any) -> Iterator[None]:
    """`model` (if any) in eval mode for the duration, then back in its previous mode."""
    if model is None:
        yield
        return
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


_PASSAGES_HEAD = "Retrieved passages:\n"
_PASSAGES_TAIL = P.ANALYSIS_USER.split("{passages}", 1)[1].split("{format}", 1)[0]


def shown_passages(prompt: list[dict[str, Any]]) -> str:
    """The retrieved passages or facts an Analysis-Answer prompt showed (its last user message between
    "Retrieved passages:" and the format instructions; the whole message if those are missing)."""
    text = next((m["content"] for m in reversed(prompt) if m["role"] == "user"), "")
    if _PASSAGES_HEAD in text:
        text = text.split(_PASSAGES_HEAD, 1)[1]
    return text.rsplit(_PASSAGES_TAIL, 1)[0]


class RoleRewards:
    """The reward functions of the roles (TRL signature: completions plus the dataset columns) over one
    open store and the rollouts' corpus/graph. `executor` (the base chat model) and `executor_roles`
    (role -> chat model) play the non-plan roles when a plan runs; `model` (the policy behind them, if
    any) is put in eval mode meanwhile."""

    def __init__(self, config: MAPGRPOConfig, store: Any, corpus: str | None, graph: str | None,
                 executor: Any, model: Any = None, executor_roles: dict[str, Any] | None = None) -> None:
        self.config, self.store, self.executor, self.model = config, store, executor, model
        self.executor_roles = {k: v for k, v in (executor_roles or {}).items() if k != "plan"}
        self.settings = {"corpus": corpus, "graph": graph, **config.rollout.context,
                         "max_new_tokens": config.rollout.max_new_tokens}
        self.graph = build_graph("opera")
        self.cache: dict[tuple[str, str], float] = {}
        self.searches: dict[str, list[tuple[str, str]]] = {}  # query -> retrieved (id, text) (read-only store)
        self.executions = 0  # OPERA runs made for plan execution scores

    def context(self, **settings: Any) -> Any:
        return make_context("opera", store=self.store, **(self.settings | settings))

    def execution(self, question: str, answers: list[str], plan: str) -> float:
        """F1 of the answer OPERA reaches with `plan` as the Plan agent's reply; TrainingError if the policy
        playing the other roles failed on its device or dtype (the F1 would be a 0 that says nothing of `plan`)."""
        key = (question, plan)
        if self.config.execution_cache and key in self.cache:
            return self.cache[key]
        ctx = self.context(llm=self.executor, role_llms=self.executor_roles | {"plan": FakeChatModel(responses=[plan])})
        with evaluating(self.model):
            result = self.graph.invoke({"question": question}, context=ctx)
        check_policy_faults([self.executor, *self.executor_roles.values()])
        self.executions += 1
        self.cache[key] = score(result.get("answer") or "", answers)[1]
        return self.cache[key]

    def search(self, query: str) -> list[tuple[str, str]]:
        if query not in self.searches:
            ctx = self.context()
            self.searches[query] = [(h.id, h.text) for h in retrieve_contexts(ctx, query, ctx.top_k)]
        return self.searches[query]

    def plan(self, completions: list, question: list[str], answers: list[list[str]], chain: list[str],
             log_metric: Any = None, **_: Any) -> list[float]:
        texts = [completion_text(c) for c in completions]
        executions = [self.execution(q, a, t) for q, a, t in zip(question, answers, texts)]
        if log_metric:
            log_metric("plan/execution", sum(executions) / len(executions))
        return [plan_reward(t, e, chain_from_json(json.loads(c)), config=self.config.plan_reward)
                for t, e, c in zip(texts, executions, chain)]

    def analysis(self, prompts: list, completions: list, answers: list[list[str]], shown_ids: list[list[str]],
                 step: list[int], steps: list[int], chain: list[str], **_: Any) -> list[float]:
        """Scored against what the analysis was shown: the passages of every attempt of its sub-goal so far."""
        rewards = []
        for prompt, c, a, ids, i, n, hops in zip(prompts, completions, answers, shown_ids, step, steps, chain):
            gold = analysis_gold(i, n, chain_from_json(json.loads(hops)), a, ids, shown_passages(prompt))
            rewards.append(analysis_reward(completion_text(c), gold, self.config.analysis_reward))
        return rewards

    def rewrite(self, completions: list, query: list[str], supporting_ids: list[list[str]], step: list[int],
                steps: list[int], chain: list[str], log_metric: Any = None, **_: Any) -> list[float]:
        k = self.context().top_k
        rewards, scores = [], []
        for c, before_query, support, i, n, hops in zip(completions, query, supporting_ids, step, steps, chain):
            text = completion_text(c)
            gold = chain_from_json(json.loads(hops)) or [Hop(passage_ids=(pid,)) for pid in support]
            evidence = [gold[i - 1]] if per_hop(gold, n) and 1 <= i <= n else gold
            retrieved = self.search(parse_rewrite(text) or before_query)  # OPERA keeps the last query on an empty one
            scores.append(evidence_ndcg(retrieved, evidence, k))
            rewards.append(rewrite_reward(text, scores[-1], self.config.rewrite_reward))
        if log_metric:
            log_metric("rewrite/ndcg", sum(scores) / len(scores))
        return rewards


def without_log(summary: dict[str, Any]) -> dict[str, Any]:
    """A role's summary as its checkpoint keeps it: the step log is in log.jsonl."""
    return {k: v for k, v in summary.items() if k != "log"}


# -- the trainer ---------------------------------------------------------------------------------
def environment(records: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """The corpus and graph the rollouts searched."""
    trace = next((r["trace"] for r in records if r.get("trace")), None) or {}
    return trace.get("corpus"), trace.get("graph")


class MAPGRPOTrainer:
    def __init__(self, config: MAPGRPOConfig) -> None:
        check_config(config)
        check_disjoint(config.rollout, config.dev)
        self.config = config
        self.model, self.tokenizer = load_model(config.model)
        if config.model.lora:
            add_role_adapters(self.model)

    def role_models(self, temperature: float, folder: Path) -> tuple[Any, dict[str, Any]]:
        """(the base model, {role: chat model}) of the policy as trained so far. Served by llama.cpp when
        `serves_with_llamacpp`, each role's adapter written to `folder/<role>.gguf`; else by transformers; with
        `model.rollout_llm` server or openai:, as `serving.served_policy` says."""
        cfg, new = self.config, self.config.rollout.max_new_tokens
        adapters = {role: role if cfg.model.lora else None for role in OPERA_ROLES} | {"answer": None}
        served = served_policy(self.model, cfg.model, folder, adapters, temperature, new)
        if served is not None:
            return served["answer"], served
        seed = cfg.model.seed if temperature > 0 else None
        if not serves_with_llamacpp(self.model, cfg.model):
            return role_models(self.model, self.tokenizer, temperature, new, seed)
        base = llamacpp_policy(cfg.model.name, None, temperature, new, seed=seed)
        return base, {role: policy_chat_model(self.model, self.tokenizer, cfg.model, folder, temperature, new, role)
                      for role in OPERA_ROLES} | {"answer": base}

    def _grpo_trainer(self, role: str, stage: Path, args: GRPOConfig, **kwargs: Any) -> ExpertGRPOTrainer:
        """The GRPO trainer of `role`'s stage, on that role's adapter only. The KL reference (beta > 0) is the
        policy entering the stage: with LoRA, TRL adds a "ref" adapter copied from the one it knows as
        "default", so the role's config stands in for "default" while the trainer is built and its weights
        are copied into "ref"; with full fine-tuning TRL loads the reference from config._name_or_path,
        so the current model is saved and named there meanwhile."""
        def build() -> ExpertGRPOTrainer:
            return ExpertGRPOTrainer(self.model, args=args, processing_class=self.tokenizer, **kwargs)

        if self.config.model.lora:
            self.model.set_adapter(role)  # the only trainable adapter of this stage: earlier roles stay frozen
            if args.beta == 0:
                return build()
            self.model.peft_config["default"] = self.model.peft_config[role]
            try:
                trainer = build()
            finally:
                del self.model.peft_config["default"]
            with torch.no_grad():
                for name, param in self.model.named_parameters():
                    if f".{role}." in name:
                        self.model.get_parameter(name.replace(f".{role}.", ".ref.")).copy_(param)
            self.model.set_adapter(role)
            return trainer
        if args.beta == 0:
            return build()
        path, name = stage / "reference", self.model.config._name_or_path
        on_main_process(lambda: self.model.save_pretrained(path))
        self.model.config._name_or_path = str(path)
        try:
            return build()
        finally:
            self.model.config._name_or_path = name
            barrier()  # every process has loaded the reference
            on_main_process(lambda: shutil.rmtree(path))

    def dev(self, name: str) -> dict[str, Any]:
        """Dev metrics of OPERA with every role as trained so far (greedy), compared with the untrained run
        (`dev.dev_run`), logged as event `dev`."""
        cfg = self.config
        metrics = dev_run(cfg.rollout, cfg.dev, cfg.model, self.model, cfg.output_dir, name,
                          lambda folder: self.role_models(0.0, folder))
        if metrics:
            write_log(Path(cfg.output_dir) / LOG, {"event": "dev", "after": name, **metrics})
        return metrics

    def train_role(self, role: str) -> dict[str, Any]:
        cfg, out = self.config, Path(self.config.output_dir)
        stage = out / role
        base, roles = self.role_models(cfg.rollout.temperature, stage / "rollouts")
        records = rollouts(cfg.rollout, base, stage / "rollouts", roles, concurrency=cfg.model.rollout_concurrency)
        experts = load_expert(cfg.expert, role, cfg.expert_score, cfg.expert_min_score) \
            if cfg.expert and role in cfg.inject_roles else {}
        rows, expert_texts = stage_rows(role_rows(records)[role], experts, GoldChains(records, cfg.rollout))
        rows, held = split_heldout(rows, records, cfg.heldout)
        held_keys = {prompt_key(r["prompt"]) for r in held}
        expert_texts = {k: v for k, v in expert_texts.items() if k not in held_keys}  # never injected in a held group
        args = grpo_args(cfg, stage / "grpo", heldout=bool(held), expert_slot=bool(expert_texts))
        info = {"role": role, "event": "rollouts", "records": len(records),
                "rollout_f1": sum(r.get("f1") or 0.0 for r in records) / max(1, len(records)),
                "prompts": len(rows), "expert_prompts": len(expert_texts), "heldout_prompts": len(held),
                "prompts_per_step": args.per_device_train_batch_size * args.gradient_accumulation_steps
                * args.world_size // args.num_generations}
        write_log(out / LOG, info)
        needed = args.generation_batch_size // args.num_generations  # TRL drops a batch with fewer prompts
        if len(rows) < needed:
            write_log(out / LOG, {"role": role, "event": "skipped",
                                  "reason": f"{len(rows)} prompts; one GRPO step takes {needed}"})
            return info | {"steps": 0, "log": []}
        corpus, graph = environment(records)
        log = jsonl_log(out / LOG, role=role)
        with open_store(cfg.rollout.store, read_only=True) as store:
            policy = cfg.executor == "policy"
            executor, executor_roles = self.role_models(0.0, stage / "executor") if policy else (cfg.executor, {})
            rewards = RoleRewards(cfg, store, corpus, graph, executor, self.model if policy else None, executor_roles)
            trainer = self._grpo_trainer(role, stage, args, reward_funcs=[getattr(rewards, role)], callbacks=[log],
                                         train_dataset=Dataset.from_list(rows), experts=expert_texts,
                                         expert_gradient=cfg.expert_gradient,
                                         eval_dataset=Dataset.from_list(held) if held else None)
            state = {"role": role, "roles": cfg.roles, "args": cfg.grpo, "rollout": asdict(cfg.rollout)}
            result = train_resuming(trainer, state, out / LOG,  # a stopped role resumes at its last step
                                    first=trainer.evaluate if held else None)  # held-back curve: the role before
        if "ref" in getattr(self.model, "peft_config", {}):  # TRL's frozen copy of the adapter: not trained on
            self.model.delete_adapter("ref")
        return info | {"steps": result.global_step, "train_loss": result.training_loss,
                       "plan_executions": rewards.executions, "log": log.entries}

    def role_state(self, position: int) -> dict[str, Any]:
        """What the checkpoint of the role at `position` holds: the roles trained so far, in order, with these
        GRPO arguments and rollout settings (as JSON reads them back)."""
        cfg = self.config
        return json.loads(json.dumps({"order": list(cfg.roles[:position + 1]), "args": cfg.grpo,
                                      "rollout": asdict(cfg.rollout)}, default=str))

    def resume(self) -> dict[str, dict[str, Any]]:
        """{role: summary} of the roles an earlier run of this order finished (`<role>/checkpoint`, saved after each
        role: the longest run of this order's first roles), the last one's weights (every role's adapter) loaded;
        {} if none. A run stopped after a role, or during a later role's dev run, trains no role twice."""
        out, done = Path(self.config.output_dir), []
        for position, role in enumerate(self.config.roles):
            found = saved_checkpoints(out, role, {"role": str, "state": dict, "summary": dict})
            if not found or found[0][0].get("state") != self.role_state(position):
                break
            done.append(found[0])
        if done:
            load_checkpoint(self.model, done[-1][1])
            write_log(out / LOG, {"event": "resumed", "after_role": done[-1][0]["role"]})
        return {state["role"]: state["summary"] for state, _ in done}

    def train(self) -> dict[str, Any]:
        """Train the roles in order; returns {"roles": {role: summary}, "dev": {stage: metrics}, "final": path}.
        With LoRA, `final` holds one adapter folder per role (`final/plan`, ...)."""
        out = Path(self.config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        dev = untrained_runs(self.config.dev, self.dev)
        summary: dict[str, Any] = {"roles": self.resume()}
        for position, role in enumerate(self.config.roles):
            if role not in summary["roles"]:
                summary["roles"][role] = self.train_role(role)
                save_checkpoint(self.model, out / role, {"role": role, "state": self.role_state(position),
                                                         "summary": without_log(summary["roles"][role])})
            dev[role] = self.dev(role)
        if self.config.dev.guards_off:
            dev[GUARDS_OFF] = self.dev(GUARDS_OFF)
        final = save_policy(self.model, self.tokenizer, out / "final")
        write_log(out / LOG, {"event": "saved", "final": final})
        publish_final(self.config.dev, self.model, out, adapters=list(self.config.roles) or None)
        return summary | {"dev": dev if self.config.dev.path else {}, "final": final,
                          "curve": plot_curve(out, "MAPGRPO")}
