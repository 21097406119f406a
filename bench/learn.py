"""A real MyGO learning run on this CPU: LoRA on an offline pack, Mujica over a KG, dev F1 before/after.

    python bench/learn.py                                   # qwen2.5-coder-0.5b, PathQuestion PQ-2H, 60 min
    python bench/learn.py --train 8 --dev 8 --budget-min 10 # a quick look

Training questions are the first `--train` of the file; the dev slice starts at `--dev-start` (far from the
training slice: PathQuestion lists a question's paraphrases together, so nearby rows share answers). The
dev slice is answered greedily before training and after every iteration. A new iteration starts only if
the time so far suggests it finishes within `--budget-min`. Writes summary.json and curve.png to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mhqa_graph.training.configs import ModelConfig, RolloutConfig
from mhqa_graph.training.mygo import MyGOConfig, MyGOTrainer
from mhqa_graph.training.policy import policy_chat_model
from mhqa_graph.training.rollouts import rollouts

from mhqa_graph.plots import pyplot, save_png

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--agent", default="mujica")
    ap.add_argument("--dataset", default="pathquestion")
    ap.add_argument("--file", default=str(DATA / "pathquestion" / "PQ-2H.txt"))
    ap.add_argument("--store", default=None, help="store URI (default: embedded store in --out)")
    ap.add_argument("--train", type=int, default=40, help="training questions (the first N)")
    ap.add_argument("--dev", type=int, default=40, help="dev questions")
    ap.add_argument("--dev-start", type=int, default=1000, help="index of the first dev question")
    ap.add_argument("--samples", type=int, default=2, help="trajectories per training question")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--budget-min", type=float, default=60.0)
    ap.add_argument("--out", default="bench/out/learn")
    args = ap.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = args.store or f"embedded://{out.resolve()}/kb"
    rollout = RolloutConfig(agent=args.agent, dataset=args.dataset, path=args.file, store=store, limit=args.train,
                            samples=args.samples, temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    dev = RolloutConfig(agent=args.agent, dataset=args.dataset, path=args.file, store=store, limit=args.dev,
                        start=args.dev_start, samples=1, temperature=0.0, max_new_tokens=args.max_new_tokens)
    config = MyGOConfig(model=ModelConfig(name=args.model, lora=True), rollout=rollout, iterations=args.iterations,
                        output_dir=str(out / "mygo"),
                        sft={"learning_rate": args.lr, "num_train_epochs": args.epochs, "max_length": 3072})
    started = time.perf_counter()
    trainer = MyGOTrainer(config)

    def dev_eval(k: int) -> dict:
        t = time.perf_counter()
        llm = policy_chat_model(trainer.model, trainer.tokenizer, config.model, out / f"dev{k}", 0.0,
                                args.max_new_tokens)
        records = rollouts(dev, llm, out / f"dev{k}")
        n = len(records)
        row = {"iteration": k, "dev_f1": sum(r["f1"] for r in records) / n, "dev_em": sum(r["em"] for r in records) / n,
               "dev_calls": sum(r["llm_calls"] for r in records) / n, "dev_s": round(time.perf_counter() - t, 1)}
        print(json.dumps(row), flush=True)
        return row

    curve = [dev_eval(0)]
    for k in range(1, args.iterations + 1):
        elapsed = time.perf_counter() - started
        if k > 1:
            per_iteration = (elapsed - curve[0]["dev_s"]) / (k - 1)
            if elapsed + per_iteration > args.budget_min * 60:
                print(f"stopping before iteration {k}: {elapsed / 60:.1f} min used, "
                      f"~{per_iteration / 60:.1f} per iteration")
                break
        row = trainer.iteration(k)
        print(json.dumps(row), flush=True)
        curve.append(row | dev_eval(k))
    minutes = (time.perf_counter() - started) / 60
    summary = {"args": vars(args), "minutes": round(minutes, 1), "curve": curve,
               "dev_f1_before": curve[0]["dev_f1"], "dev_f1_after": curve[-1]["dev_f1"]}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(curve, out / "curve.png", f"MyGO, {args.agent}, {args.model} LoRA, {Path(args.file).name}")
    print(f"dev F1 {100 * summary['dev_f1_before']:.1f} -> {100 * summary['dev_f1_after']:.1f} "
          f"in {minutes:.1f} min; {out / 'curve.png'}")


def plot(curve: list[dict], path: Path, title: str) -> None:
    fig, ax = pyplot().subplots(figsize=(6, 4))
    its = [r["iteration"] for r in curve]
    ax.plot(its, [100 * r["dev_f1"] for r in curve], "o-", label="dev F1 (greedy)")
    ax.plot(its, [100 * r["dev_em"] for r in curve], "s--", label="dev EM")
    trained = [r for r in curve if "mean_reward" in r]
    ax.plot([r["iteration"] for r in trained], [100 * r["mean_reward"] for r in trained], "^:",
            label="train reward (sampled F1)")
    ax.plot([r["iteration"] for r in trained], [100 * r["tau"] for r in trained], "v:", label="τ")
    ax.set_xlabel("MyGO iteration")
    ax.set_ylabel("score (%)")
    ax.set_xticks(its)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    save_png(fig, path, dpi=120)


if __name__ == "__main__":
    main()
