"""MAPGRPO (OPERA, arXiv 2508.16438): multi-agent progressive GRPO, one OPERA role at a time.

For each role in order (plan, then analysis-answer, then rewrite):
1. roll out OPERA (graphs/opera.py, the inference graph) with the model under training as every role's
   `llm`, over `rollout`'s questions; `role_rows` turns the traces into the role's prompts and signals;
2. train the role with TRL's GRPO on those prompts (group size `grpo.num_generations`, KL `grpo.beta`)
   and the role's reward (training/rewards.py):
   - plan: λ1·logic + λ2·structure + λ3·execution, execution = F1 of the answer OPERA reaches when it
     runs with the completion as its plan (the other roles played by `executor`: the current policy,
     greedy, or a model spec);
   - analysis: α·sufficiency + β·accuracy + γ·format (accuracy against the question's gold answers);
   - rewrite: ω1·retrieval gain + ω2·format; the gain compares the gold supporting passages found by
     the sub-goal's query and by the rewritten one (as OPERA parses it), both searched at the context's
     top_k in the read-only store, so it measures the query alone;
3. high-score sample selection: `expert` is a `mhqa export --format roles` folder (e.g. a stronger
   model's run). For every prompt with an expert row (best `expert_score` >= `expert_min_score`), one
   member of its group is replaced by the expert completion, scored by the same reward, so the group's
   advantages include it. The expert rows' prompts join the role's training prompts.

Progressive: the next role's rollouts run with the weights the earlier roles' training left. With LoRA
there is one adapter for all roles, trained on through the stages: the OPERA graph serves every role
from one `llm`, so one adapter is what inference uses (per-role adapters would need adapter switching
inside one graph run), and the final adapter carries all roles. With beta > 0 the KL reference is the
policy that entered the stage (TRL copies a PEFT adapter as "ref"; a fully fine-tuned model is saved
and reloaded as the reference), so each stage stays close to what the earlier stages built.

    trainer = MAPGRPOTrainer(load_config(MAPGRPOConfig, "configs/train/mapgrpo.yaml"))
    summary = trainer.train()     # output_dir/log.jsonl, output_dir/final
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, load_from_disk
from mhqa_graph.graphs import build_graph, make_context
from mhqa_graph.graphs.opera import parse_rewrite, retrieve_contexts
from trl import GRPOConfig, GRPOTrainer

from mhqa_graph.errors import InvalidInput
from mhqa_graph.eval.scoring import score
from mhqa_graph.export import OPERA_ROLES, role_rows
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel

from .common import ModelConfig, RolloutConfig, chat_model_for, jsonl_log, load_model, rollouts, write_log
from .rewards import (
    AnalysisRewardConfig,
    PlanRewardConfig,
    RewriteRewardConfig,
    analysis_reward,
    ndcg,
    plan_reward,
    recall,
    rewrite_reward,
)

LOG = "log.jsonl"


@dataclass
class MAPGRPOConfig:
    """The policy, the OPERA rollouts of each stage, the roles in order, GRPO arguments and the role rewards."""

    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=lambda: RolloutConfig(agent="opera"))
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
    output_dir: str = "runs/mapgrpo"


def grpo_args(config: MAPGRPOConfig, output_dir: str | Path) -> GRPOConfig:
    """GRPOConfig from `config.grpo` over CPU-friendly defaults; bad arguments raise InvalidInput."""
    defaults = dict(use_cpu=not torch.cuda.is_available(), bf16=False, report_to=[], save_strategy="no",
                    logging_steps=1, disable_tqdm=True, gradient_checkpointing=False, seed=config.model.seed)
    try:
        return GRPOConfig(**(defaults | config.grpo | {"output_dir": str(output_dir)}))
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
    if not isinstance(config.grpo, dict):
        raise InvalidInput(f"grpo must be a mapping of GRPOConfig arguments, got {type(config.grpo).__name__}")
    args = grpo_args(config, Path(config.output_dir) / "grpo")  # GRPOConfig checks num_generations >= 2
    if args.beta < 0:
        raise InvalidInput(f"grpo.beta (the KL coefficient) must be >= 0, got {args.beta}")
    for name in ("plan_reward", "analysis_reward", "rewrite_reward"):
        weights = {k: v for k, v in asdict(getattr(config, name)).items() if k not in ("metric", "max_subgoals")}
        if any(not isinstance(v, (int, float)) or v < 0 for v in weights.values()):
            raise InvalidInput(f"{name}: weights must be non-negative numbers, got {weights}")
    if config.rewrite_reward.metric not in ("recall", "ndcg"):
        raise InvalidInput(f"rewrite_reward.metric must be recall or ndcg, got {config.rewrite_reward.metric!r}")
    if not isinstance(config.executor, str) or not config.executor:
        raise InvalidInput("executor must be 'policy' or a chat model spec")
    if config.expert and not Path(config.expert).is_dir():
        raise InvalidInput(f"expert: {config.expert} is not a roles export folder")


# -- prompts and expert samples ------------------------------------------------------------------
def prompt_key(prompt: list[dict[str, Any]]) -> str:
    return json.dumps([[m["role"], m["content"]] for m in prompt], ensure_ascii=False)


def completion_text(completion: Any) -> str:
    """The text of a completion: a string or a chat [{"role": "assistant", "content": ...}]."""
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)


def training_row(row: dict[str, Any]) -> dict[str, Any]:
    """The columns GRPO and the role rewards need from a role row (plan rows have no query/retrieved ids)."""
    return {"prompt": [{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
            "id": str(row.get("id", "")), "question": str(row.get("question", "")),
            "answers": [str(a) for a in row.get("answers") or []],
            "supporting_ids": [str(i) for i in row.get("supporting_ids") or []],
            "retrieved_ids": [str(i) for i in row.get("retrieved_ids") or []], "query": str(row.get("query") or "")}


def load_expert(path: str | Path, role: str, score_key: str = "reward",
                min_score: float = 0.0) -> dict[str, dict[str, Any]]:
    """prompt key -> {row (its training columns), expert (the completion text), score} of the best-scoring
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
        key = prompt_key(row["prompt"])
        if key not in best or value > best[key]["score"]:
            best[key] = {"row": training_row(row), "expert": completion_text(row["completion"]),
                         "score": float(value)}
    return best


def stage_rows(rows: list[dict[str, Any]],
               experts: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The stage's training prompts (the policy's, one per distinct prompt, then the expert-only ones) and
    the expert completion of each prompt that has one."""
    out, seen = [], set()
    for row in [training_row(r) for r in rows] + [e["row"] for e in experts.values()]:
        key = prompt_key(row["prompt"])
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out, {key: e["expert"] for key, e in experts.items()}


# -- GRPO with injected expert samples -----------------------------------------------------------
class ExpertGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose groups take one expert completion: for a prompt in `experts` (prompt key ->
    completion text), the group's last member is replaced after generation by the expert's tokens plus eos,
    all of them (max_completion_length bounds generation only: a cut would train a prefix on the reward of
    the whole). Rewards, advantages and the loss then treat it like any member."""

    def __init__(self, *args: Any, experts: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.experts = experts or {}

    def _expert_ids(self, text: str) -> list[int]:
        tok = self.processing_class
        return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    def _generate(self, prompts: list):
        out = list(super()._generate(prompts))
        _, completion_ids, _, completions, logprobs = out[:5]
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else self.num_generations_eval
        offset = self.accelerator.process_index * len(prompts)  # groups run across processes' slices
        injected = 0
        for i, prompt in enumerate(prompts):
            text = self.experts.get(prompt_key(prompt)) if (offset + i) % group == group - 1 else None
            if text is None:
                continue
            completion_ids[i] = self._expert_ids(text)
            completions[i] = [{"role": "assistant", "content": text}] if isinstance(completions[i], list) else text
            if logprobs is not None:  # no sampling logprobs for it: TRL neutralises NaN in importance sampling
                logprobs[i] = [None] * len(completion_ids[i])
            injected += 1
        self._metrics[mode]["expert/injected"].append(float(injected))
        return tuple(out)


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


class RoleRewards:
    """The reward functions of the roles (TRL signature: completions plus the dataset columns) over one
    open store and the rollouts' corpus/graph. `executor` plays the non-plan roles when a plan runs;
    `model` (the policy behind it, if any) is put in eval mode meanwhile."""

    def __init__(self, config: MAPGRPOConfig, store: Any, corpus: str | None, graph: str | None,
                 executor: Any, model: Any = None) -> None:
        self.config, self.store, self.executor, self.model = config, store, executor, model
        self.settings = {"corpus": corpus, "graph": graph, **config.rollout.context,
                         "max_new_tokens": config.rollout.max_new_tokens}
        self.graph = build_graph("opera")
        self.cache: dict[tuple[str, str], float] = {}
        self.searches: dict[str, list[str]] = {}  # query -> retrieved ids (the store is read-only)
        self.executions = 0  # OPERA runs made for plan execution scores

    def context(self, **settings: Any) -> Any:
        return make_context("opera", store=self.store, **(self.settings | settings))

    def execution(self, question: str, answers: list[str], plan: str) -> float:
        """F1 of the answer OPERA reaches with `plan` as the Plan agent's reply."""
        key = (question, plan)
        if self.config.execution_cache and key in self.cache:
            return self.cache[key]
        ctx = self.context(llm=self.executor, role_llms={"plan": FakeChatModel(responses=[plan])})
        with evaluating(self.model):
            result = self.graph.invoke({"question": question}, context=ctx)
        self.executions += 1
        self.cache[key] = score(result.get("answer") or "", answers)[1]
        return self.cache[key]

    def search(self, query: str) -> list[str]:
        if query not in self.searches:
            ctx = self.context()
            self.searches[query] = [h.id for h in retrieve_contexts(ctx, query, ctx.top_k)]
        return self.searches[query]

    def plan(self, completions: list, question: list[str], answers: list[list[str]], log_metric: Any = None,
             **_: Any) -> list[float]:
        texts = [completion_text(c) for c in completions]
        executions = [self.execution(q, a, t) for q, a, t in zip(question, answers, texts)]
        if log_metric:
            log_metric("plan/execution", sum(executions) / len(executions))
        return [plan_reward(t, e, self.config.plan_reward) for t, e in zip(texts, executions)]

    def analysis(self, completions: list, answers: list[list[str]], retrieved_ids: list[list[str]],
                 supporting_ids: list[list[str]], **_: Any) -> list[float]:
        return [analysis_reward(completion_text(c), a, r, s, self.config.analysis_reward)
                for c, a, r, s in zip(completions, answers, retrieved_ids, supporting_ids)]

    def rewrite(self, completions: list, query: list[str], supporting_ids: list[list[str]], log_metric: Any = None,
                **_: Any) -> list[float]:
        metric = {"recall": recall, "ndcg": ndcg}[self.config.rewrite_reward.metric]
        rewards, gains = [], []
        for c, before_query, gold in zip(completions, query, supporting_ids):
            text = completion_text(c)
            before = self.search(before_query)
            after = self.search(parse_rewrite(text) or before_query)  # OPERA keeps the last query on an empty one
            rewards.append(rewrite_reward(text, before, after, gold, self.config.rewrite_reward))
            gains.append(metric(after, gold) - metric(before, gold))
        if log_metric:
            log_metric("rewrite/gain", sum(gains) / len(gains))
        return rewards


# -- the trainer ---------------------------------------------------------------------------------
def environment(records: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """The corpus and graph the rollouts searched."""
    trace = next((r["trace"] for r in records if r.get("trace")), None) or {}
    return trace.get("corpus"), trace.get("graph")


class MAPGRPOTrainer:
    def __init__(self, config: MAPGRPOConfig) -> None:
        check_config(config)
        self.config = config
        self.model, self.tokenizer = load_model(config.model)

    def _grpo_trainer(self, stage: Path, args: GRPOConfig, **kwargs: Any) -> ExpertGRPOTrainer:
        """The stage's GRPO trainer. Full fine-tuning with beta > 0: TRL loads the KL reference from
        config._name_or_path, so the current model is saved and named there while the trainer is built
        (with LoRA, TRL copies the current adapter as "ref" itself)."""
        def build() -> ExpertGRPOTrainer:
            return ExpertGRPOTrainer(self.model, args=args, processing_class=self.tokenizer, **kwargs)

        if args.beta == 0 or self.config.model.lora:
            return build()
        path, name = stage / "reference", self.model.config._name_or_path
        self.model.save_pretrained(path)
        self.model.config._name_or_path = str(path)
        try:
            return build()
        finally:
            self.model.config._name_or_path = name
            shutil.rmtree(path)

    def train_role(self, role: str) -> dict[str, Any]:
        cfg, out = self.config, Path(self.config.output_dir)
        stage = out / role
        llm = chat_model_for(self.model, self.tokenizer, cfg.rollout.temperature, cfg.rollout.max_new_tokens)
        records = rollouts(cfg.rollout, llm, stage / "rollouts")
        experts = load_expert(cfg.expert, role, cfg.expert_score, cfg.expert_min_score) if cfg.expert else {}
        rows, expert_texts = stage_rows(role_rows(records)[role], experts)
        info = {"role": role, "event": "rollouts", "records": len(records),
                "rollout_f1": sum(r.get("f1") or 0.0 for r in records) / max(1, len(records)),
                "prompts": len(rows), "expert_prompts": len(expert_texts)}
        write_log(out / LOG, info)
        args = grpo_args(cfg, stage / "grpo")
        needed = args.generation_batch_size // args.num_generations  # TRL drops a batch with fewer prompts
        if len(rows) < needed:
            write_log(out / LOG, {"role": role, "event": "skipped",
                                  "reason": f"{len(rows)} prompts; one GRPO step takes {needed}"})
            return info | {"steps": 0, "log": []}
        corpus, graph = environment(records)
        log = jsonl_log(out / LOG, role=role)
        with open_store(cfg.rollout.store, read_only=True) as store:
            policy = cfg.executor == "policy"
            executor = chat_model_for(self.model, self.tokenizer, 0.0, cfg.rollout.max_new_tokens) if policy \
                else cfg.executor
            rewards = RoleRewards(cfg, store, corpus, graph, executor, self.model if policy else None)
            trainer = self._grpo_trainer(stage, args, reward_funcs=[getattr(rewards, role)], callbacks=[log],
                                         train_dataset=Dataset.from_list(rows), experts=expert_texts)
            result = trainer.train()
        if "ref" in getattr(self.model, "peft_config", {}):  # TRL's frozen copy of the adapter: not trained on
            self.model.delete_adapter("ref")
        return info | {"steps": result.global_step, "train_loss": result.training_loss,
                       "plan_executions": rewards.executions, "log": log.entries}

    def train(self) -> dict[str, Any]:
        """Train the roles in order; returns {"roles": {role: summary}, "final": path}."""
        out = Path(self.config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        summary = {"roles": {role: self.train_role(role) for role in self.config.roles}}
        final = out / "final"
        self.model.save_pretrained(final)
        self.tokenizer.save_pretrained(final)
        write_log(out / LOG, {"event": "saved", "final": str(final)})
        return summary | {"final": str(final)}
