"""MyGO for Mujica: sample with the current model, keep what clears a rising threshold, SFT, repeat.

Iteration k:
1. rollouts: the agent (Mujica by default) answers the training questions `rollout.samples` times at
   `rollout.temperature` with the model under training (the same graph as inference);
2. reward = F1 (or EM) of each final answer; τ_k = max(τ_{k-1}, mean reward of the batch), from τ_0;
3. keep the trajectories with reward >= τ_k (and > 0: a wrong answer is never a target), deduplicated;
   when Mujica's `min_worker_rounds` (in `rollout.context`) is > 0, only those in which the planner
   consulted workers that many rounds (read from the trace: runs of LLM calls with role "worker"), so a
   planner answering alone is never the target;
4. plain SFT (MLE on the agent's own tokens only; prompts and retrieved text get no loss) on them;
5. the adapter (or model), τ and the iteration's metrics are saved to `output_dir/iter{k}/checkpoint`, then the
   dev run is made and the iteration's line logged. A rerun resumes after the last saved iteration, first making
   its dev run and line if they are missing; rollouts and dev runs, being eval runs, resume too, and a stopped
   SFT resumes at its last step. With `dev.records` the iteration's rollouts are published there
   (`iter{k}_rollouts/`) before its SFT, and read back by a run on another machine that resumes from the same
   weights.
An optional warm-up SFT on high-scoring trajectories comes first (checkpoint `iter0`), as in the paper (which
fine-tunes on trajectories with EM 1 before MyGO): those of an eval run (`warmup_run`) or of a stronger model's
rollouts of the training questions (`warmup_teacher`, a model spec, rolled out once into
`output_dir/warmup_rollouts/teacher-<spec>-<hash>` and resumable). Each iteration logs τ, mean reward,
kept fraction and loss to `output_dir/log.jsonl`, and with `dev.path` the dev metrics (F1, LLM calls per
question, worker dispatch rate and the other behaviour rates) before training and after each iteration, the
later ones with ΔF1 against the untrained run and its interval.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mhqa_graph.errors import InvalidInput
from mhqa_graph.export import mygo_rows, read_records, reward_of
from mhqa_graph.paths import file_sha256

from .checkpoints import (
    CHECKPOINT,
    STEP_SAVES,
    load_checkpoint,
    publish_checkpoint,
    restore_checkpoint,
    save_checkpoint,
    saved_checkpoints,
    train_resuming,
)
from .configs import DevConfig, ModelConfig, RolloutConfig
from .dev import (
    GUARDS_OFF,
    UNTRAINED,
    UNTRAINED_GUARDS_OFF,
    check_disjoint,
    json_digest,
    policy_dev,
    publish_final,
    untrained_runs,
)
from .devices import on_main_process, precision_args
from .logs import LOG, copy_log, jsonl_log, plot_curve, read_log, write_log
from .policy import load_model, policy_chat_model, policy_identity, save_policy
from .rewards import keep, next_tau
from .rollouts import MADE_WITH, publish_rollouts, read_json, restore_rollouts, rollouts, teacher_rollouts

SFT_DEFAULTS: dict[str, Any] = {"learning_rate": 1e-4, "num_train_epochs": 1, "per_device_train_batch_size": 1,
                                "gradient_accumulation_steps": 4, "max_length": 2048, "logging_steps": 1,
                                "report_to": [], **STEP_SAVES,
                                "gradient_checkpointing": False}  # use_cpu and bf16: from the device (devices.py)


@dataclass
class MyGOConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    dev: DevConfig = field(default_factory=DevConfig)  # held-out questions answered before and after each iteration
    iterations: int = 2
    tau_0: float = 0.0
    reward: str = "f1"  # f1 | em
    warmup_run: str | None = None  # an eval run folder (e.g. a stronger model's) for warm-up SFT
    warmup_teacher: str | None = None  # or a model spec whose rollouts of the training questions make it
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
        if self.warmup_run and self.warmup_teacher:
            raise InvalidInput("warm up from warmup_run or warmup_teacher, not both")


def worker_rounds(record: dict[str, Any]) -> int:
    """The rounds in which the planner consulted workers: runs of consecutive LLM calls with role "worker"
    in the record's trace."""
    roles = [c.get("role") for c in (record.get("trace") or {}).get("llm_calls") or []]
    return sum(role == "worker" and (i == 0 or roles[i - 1] != "worker") for i, role in enumerate(roles))


def kept(records: list[dict[str, Any]], tau: float, reward: str = "f1",
         min_worker_rounds: int = 0) -> list[dict[str, Any]]:
    """The trajectories that finished with 0 < reward >= τ and at least `min_worker_rounds` worker rounds."""
    return [r for r in keep(records, tau, key=reward) if r[reward] > 0 and not r.get("failed")
            and worker_rounds(r) >= min_worker_rounds]


def sft_rows(records: list[dict[str, Any]], reward: str = "f1") -> list[dict[str, Any]]:
    """The chats of `records`, deduplicated, every agent token weighted 1.0 (plain MLE)."""
    return mygo_rows(records, reward, min_reward=0.0, think_weight=1.0)


STATE_TYPES = {"iteration": int, "tau": (int, float), "row": (dict, type(None))}  # of an iteration's checkpoint


class MyGOTrainer:
    """Runs MyGO iterations on one model (LoRA adapter or full weights) and saves it to `output_dir/final`."""

    def __init__(self, config: MyGOConfig, model: Any = None, tokenizer: Any = None) -> None:
        check_disjoint(config.rollout, config.dev)
        self.config = config
        self.out = Path(config.output_dir)
        if model is None:
            model, tokenizer = load_model(config.model)
        self.model, self.tokenizer = model, tokenizer
        self.tau = config.tau_0
        self.saved_row: dict[str, Any] = {}  # the metrics of the iteration `resume` loaded

    @property
    def min_worker_rounds(self) -> int:
        return int(self.config.rollout.context.get("min_worker_rounds") or 0)

    def sft(self, rows: list[dict[str, Any]], out_dir: Path, phase: str) -> float:
        """One plain-SFT pass over `rows`, its steps logged with `phase`; returns the mean training loss. A pass
        stopped midway resumes at its last step when the same rows and arguments come again."""
        from datasets import Dataset

        from .weighted_sft import WeightedSFTConfig, WeightedSFTTrainer

        defaults = SFT_DEFAULTS | precision_args(self.config.sft)
        args = WeightedSFTConfig(output_dir=str(out_dir), think_weight=1.0, **(defaults | self.config.sft))
        dataset = Dataset.from_list([{"messages": r["messages"]} for r in rows])
        log = jsonl_log(self.out / LOG, phase=phase)
        trainer = WeightedSFTTrainer(model=self.model, args=args, train_dataset=dataset,
                                     processing_class=self.tokenizer, callbacks=[log])
        state = {"phase": phase, "rows": json_digest(rows), "args": self.config.sft}
        return float(train_resuming(trainer, state, self.out / LOG).training_loss)

    def save(self, k: int, row: dict[str, Any] | None = None) -> None:
        """The weights, τ and the metrics `row` of iteration `k` (0: the warm-up), in `iter{k}/checkpoint` (by the
        main process), and a LoRA adapter's published with the run's records (`publish_checkpoint`)."""
        save_checkpoint(self.model, self.out / f"iter{k}", {"iteration": k, "tau": self.tau, "row": row})
        publish_checkpoint(self.out / f"iter{k}", self.config.dev.records)

    def resume(self) -> int:
        """Load the last saved checkpoint, here or committed with the run's records (weights, τ and its metrics,
        kept in `saved_row`); returns its iteration, -1 if there is none."""
        restore_checkpoint(self.config.dev.records, self.out)
        saved = saved_checkpoints(self.out, "iter*", STATE_TYPES)
        if not saved:
            return -1
        state, path = max(saved, key=lambda found: found[0]["iteration"])
        k = state["iteration"]
        load_checkpoint(self.model, path)
        self.tau = state["tau"]
        self.saved_row = state.get("row") or {"iteration": k}
        write_log(self.out / LOG, {"event": "resumed", "after_iteration": k, "tau": self.tau})
        return k

    def log_lines(self) -> list[dict[str, Any]]:
        return read_log(self.out / LOG)

    def logged(self, k: int) -> bool:
        """Whether log.jsonl holds iteration `k`'s line (written after its dev run)."""
        return any(line.get("iteration") == k for line in self.log_lines())

    def logged_dev(self, name: str) -> bool:
        """Whether log.jsonl holds the dev line of the run `name` (the untrained ones)."""
        return any(line.get("event") == "dev" and line.get("after") == name for line in self.log_lines())

    def finish(self, row: dict[str, Any]) -> dict[str, Any]:
        """Iteration metrics `row` with the dev metrics of the saved weights after it, logged and returned."""
        row = row | self.dev(f"iter{row['iteration']}")
        write_log(self.out / LOG, row)
        if self.config.dev.records:  # the committed log holds the row, so a resume elsewhere does not redo its dev run
            on_main_process(lambda: copy_log(self.out, str(self.config.dev.records)))
        return row

    def dev(self, name: str) -> dict[str, Any]:
        """Dev metrics of the current weights (greedy), a resumable run in `dev/<name>` compared with the untrained
        run (`dev.dev_run`); {} without a dev slice."""
        cfg = self.config
        return policy_dev(cfg.rollout, cfg.dev, self.model, self.tokenizer, self.out, name, cfg.model)

    def rollout_policy(self, k: int) -> dict[str, Any]:
        """What iteration `k`'s rollouts are sampled from: the weights saved after iteration k - 1 (their files'
        sha256) or, with none saved, the untrained policy; and the sampling settings."""
        cfg = self.config
        files = sorted((self.out / f"iter{k - 1}" / CHECKPOINT).glob("*.safetensors"))
        weights = {f.name: file_sha256(f) for f in files} if files else {"untrained": policy_identity(cfg.model)}
        return {"after_iteration": k - 1, "weights": weights, "temperature": cfg.rollout.temperature,
                "max_new_tokens": cfg.rollout.max_new_tokens, "seed": cfg.model.seed}

    def iteration(self, k: int) -> dict[str, Any]:
        """Rollouts, τ, keep, SFT, checkpoint; the iteration's metrics, also appended to log.jsonl."""
        cfg = self.config
        started = time.perf_counter()
        folder = self.out / f"iter{k}" / "rollouts"
        committed = Path(cfg.dev.records) / f"iter{k}_rollouts" if cfg.dev.records else None
        made_with = self.rollout_policy(k)
        if committed and read_json(committed / MADE_WITH) == made_with:  # made by these weights on another machine
            on_main_process(lambda: restore_rollouts(committed, folder, cfg.rollout))
        llm = policy_chat_model(self.model, self.tokenizer, cfg.model, folder, cfg.rollout.temperature,
                                cfg.rollout.max_new_tokens)
        records = rollouts(cfg.rollout, llm, folder, concurrency=cfg.model.rollout_concurrency)
        if committed:  # before the SFT, which takes longer: a run stopped in it does not sample them again
            on_main_process(lambda: publish_rollouts(folder, committed, cfg.rollout, made_with))
        rewards = [reward_of(r, cfg.reward) for r in records]
        self.tau = next_tau(self.tau, rewards)
        good = kept(records, self.tau, cfg.reward, self.min_worker_rounds)
        rows = sft_rows(good, cfg.reward)
        rollout_s = time.perf_counter() - started
        loss = self.sft(rows, self.out / f"iter{k}" / "sft", f"iter{k}") if rows else None
        sft_s = time.perf_counter() - started - rollout_s
        row = {"iteration": k, "tau": self.tau, "mean_reward": sum(rewards) / len(rewards),
               "trajectories": len(records), "kept": len(good), "kept_fraction": len(good) / len(records),
               "with_workers": sum(worker_rounds(r) >= max(1, self.min_worker_rounds) for r in records),
               "sft_rows": len(rows), "loss": loss, "failures": sum(bool(r.get("failed")) for r in records),
               "rollout_s": round(rollout_s, 1), "sft_s": round(sft_s, 1)}
        self.save(k, row)
        return self.finish(row)

    def warmup_records(self) -> list[dict[str, Any]]:
        """The warm-up's eval records: `warmup_run`'s, or the teacher's rollouts of the training questions."""
        cfg = self.config
        if cfg.warmup_run:
            return read_records(cfg.warmup_run)
        committed = Path(cfg.dev.records) / "warmup_rollouts" if cfg.dev.records else None
        return teacher_rollouts(cfg.rollout, str(cfg.warmup_teacher), cfg.model.seed, self.out / "warmup_rollouts",
                                committed, concurrency=cfg.model.rollout_concurrency)  # a served teacher uses slots

    def train(self) -> dict[str, Any]:
        cfg = self.config
        self.out.mkdir(parents=True, exist_ok=True)
        on_main_process(lambda: (self.out / "config.json").write_text(json.dumps(asdict(cfg), indent=2),
                                                                      encoding="utf-8"))
        history = []
        before = untrained_runs(cfg.dev, self.dev)  # before resuming: finished runs are read back from the cache
        untrained = before[UNTRAINED]
        done = self.resume()
        for name, metrics in before.items():  # once per run, a resumed one included
            if metrics and not self.logged_dev(name):
                write_log(self.out / LOG, {"event": "dev", "after": name, **metrics})
        if done >= 0 and not self.logged(done):  # stopped after the checkpoint, before its dev run ended
            history.append(self.finish(self.saved_row))
        if (cfg.warmup_run or cfg.warmup_teacher) and done < 0:
            rows = sft_rows(kept(self.warmup_records(), cfg.warmup_min_reward, cfg.reward, self.min_worker_rounds),
                            cfg.reward)
            if not rows:
                raise InvalidInput(f"the warm-up trajectories ({cfg.warmup_run or cfg.warmup_teacher}) have none "
                                   f"with {cfg.reward} >= {cfg.warmup_min_reward}")
            row = {"iteration": 0, "warmup_rows": len(rows), "loss": self.sft(rows, self.out / "warmup", "warmup")}
            self.save(0, row)
            history.append(self.finish(row))
        history += [self.iteration(k) for k in range(max(1, done + 1), cfg.iterations + 1)]
        final = save_policy(self.model, self.tokenizer, self.out / "final")
        guards_off = self.dev(GUARDS_OFF) if cfg.dev.guards_off else {}
        if guards_off:
            write_log(self.out / LOG, {"event": "dev", "after": GUARDS_OFF, **guards_off})
        publish_final(cfg.dev, self.model, self.out)
        return {"iterations": history, "tau": self.tau, "dev_untrained": untrained, "final": final,
                **({"dev_untrained_guards_none": before[UNTRAINED_GUARDS_OFF]} if cfg.dev.guards_off else {}),
                "curve": plot_curve(self.out, "MyGO")} | ({"dev_guards_none": guards_off} if guards_off else {})
