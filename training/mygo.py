"""MyGO for Mujica: sample with the current model, keep what clears a rising threshold, SFT, repeat.

Iteration k:
1. rollouts: the agent (Mujica by default) answers the training questions `rollout.samples` times at
   `rollout.temperature` with the model under training (the same graph as inference);
2. reward = F1 (or EM) of each final answer; τ_k = max(τ_{k-1}, mean reward of the batch), from τ_0;
3. keep the trajectories with reward >= τ_k (and > 0: a wrong answer is never a target), deduplicated;
4. plain SFT (MLE on the agent's own tokens only; prompts and retrieved text get no loss) on them.
An optional warm-up SFT on high-scoring trajectories (an eval run of a stronger model) comes first.
Each iteration logs τ, mean reward, kept fraction and loss to `output_dir/log.jsonl`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mhqa_graph.errors import InvalidInput
from mhqa_graph.export import mygo_rows, read_records, reward_of

from .common import ModelConfig, RolloutConfig, chat_model_for, load_model, rollouts, write_log
from .rewards import keep, next_tau

SFT_DEFAULTS: dict[str, Any] = {"learning_rate": 1e-4, "num_train_epochs": 1, "per_device_train_batch_size": 1,
                                "gradient_accumulation_steps": 4, "max_length": 2048, "logging_steps": 1,
                                "report_to": [], "save_strategy": "no", "bf16": False,
                                "gradient_checkpointing": False}  # use_cpu: when there is no CUDA device


@dataclass
class MyGOConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    iterations: int = 2
    tau_0: float = 0.0
    reward: str = "f1"  # f1 | em
    warmup_run: str | None = None  # an eval run folder (e.g. a stronger model's) for warm-up SFT
    warmup_min_reward: float = 1.0
    sft: dict[str, Any] = field(default_factory=dict)  # WeightedSFTConfig arguments over SFT_DEFAULTS
    output_dir: str = "runs/mygo"

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise InvalidInput(f"iterations must be >= 1, got {self.iterations}")
        if self.reward not in ("f1", "em"):
            raise InvalidInput(f"reward must be f1 or em, got {self.reward!r}")
        if not 0.0 <= self.tau_0 <= 1.0:
            raise InvalidInput(f"tau_0 must be in [0, 1], got {self.tau_0}")
        if self.rollout.samples < 1:
            raise InvalidInput(f"rollout.samples must be >= 1, got {self.rollout.samples}")


def kept(records: list[dict[str, Any]], tau: float, reward: str = "f1") -> list[dict[str, Any]]:
    """The trajectories that finished with 0 < reward >= τ."""
    return [r for r in keep(records, tau, key=reward) if r[reward] > 0 and not r.get("failed")]


def sft_rows(records: list[dict[str, Any]], reward: str = "f1") -> list[dict[str, Any]]:
    """The chats of `records`, deduplicated, every agent token weighted 1.0 (plain MLE)."""
    return mygo_rows(records, reward, min_reward=0.0, think_weight=1.0)


class MyGOTrainer:
    """Runs MyGO iterations on one model (LoRA adapter or full weights) and saves it to `output_dir/final`."""

    def __init__(self, config: MyGOConfig, model: Any = None, tokenizer: Any = None) -> None:
        self.config = config
        self.out = Path(config.output_dir)
        if model is None:
            model, tokenizer = load_model(config.model)
        self.model, self.tokenizer = model, tokenizer
        self.tau = config.tau_0

    def sft(self, rows: list[dict[str, Any]], out_dir: Path) -> float:
        """One plain-SFT pass over `rows`; returns the mean training loss."""
        import torch
        from datasets import Dataset

        from .weighted_sft import WeightedSFTConfig, WeightedSFTTrainer

        defaults = SFT_DEFAULTS | {"use_cpu": not torch.cuda.is_available()}
        args = WeightedSFTConfig(output_dir=str(out_dir), think_weight=1.0, **(defaults | self.config.sft))
        dataset = Dataset.from_list([{"messages": r["messages"]} for r in rows])
        trainer = WeightedSFTTrainer(model=self.model, args=args, train_dataset=dataset,
                                     processing_class=self.tokenizer)
        return float(trainer.train().training_loss)

    def iteration(self, k: int) -> dict[str, Any]:
        """Rollouts, τ, keep, SFT; the iteration's metrics, also appended to log.jsonl."""
        cfg = self.config
        started = time.perf_counter()
        llm = chat_model_for(self.model, self.tokenizer, cfg.rollout.temperature, cfg.rollout.max_new_tokens)
        records = rollouts(cfg.rollout, llm, self.out / f"iter{k}" / "rollouts")
        rewards = [reward_of(r, cfg.reward) for r in records]
        self.tau = next_tau(self.tau, rewards)
        good = kept(records, self.tau, cfg.reward)
        rows = sft_rows(good, cfg.reward)
        rollout_s = time.perf_counter() - started
        loss = self.sft(rows, self.out / f"iter{k}" / "sft") if rows else None
        row = {"iteration": k, "tau": self.tau, "mean_reward": sum(rewards) / len(rewards),
               "trajectories": len(records), "kept": len(good), "kept_fraction": len(good) / len(records),
               "sft_rows": len(rows), "loss": loss, "failures": sum(bool(r.get("failed")) for r in records),
               "rollout_s": round(rollout_s, 1), "sft_s": round(time.perf_counter() - started - rollout_s, 1)}
        write_log(self.out / "log.jsonl", row)
        return row

    def train(self) -> dict[str, Any]:
        cfg = self.config
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.json").write_text(json.dumps(asdict(cfg), indent=2), encoding="utf-8")
        history = []
        if cfg.warmup_run:
            rows = sft_rows(kept(read_records(cfg.warmup_run), cfg.warmup_min_reward, cfg.reward), cfg.reward)
            if not rows:
                raise InvalidInput(f"warm-up run {cfg.warmup_run} has no trajectory with "
                                   f"{cfg.reward} >= {cfg.warmup_min_reward}")
            row = {"iteration": 0, "warmup_rows": len(rows), "loss": self.sft(rows, self.out / "warmup")}
            write_log(self.out / "log.jsonl", row)
            history.append(row)
        history += [self.iteration(k) for k in range(1, cfg.iterations + 1)]
        self.model.save_pretrained(self.out / "final")
        self.tokenizer.save_pretrained(self.out / "final")
        return {"iterations": history, "tau": self.tau, "final": str(self.out / "final")}
