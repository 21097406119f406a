"""One short step of each training method on the tiny random model (training/tiny.py, or a model folder given
with --model), on this process's GPU, each with its seconds, seconds per step and peak memory:
MyGO (a warm-up SFT on a scripted model's answers, one iteration of rollouts and SFT, dev runs), MAPGRPO (one
GRPO step of the plan role, whose reward executes plans, and one of the analysis role) and Omne (one GRPO
step of stage 1 and one SFT step of stage 2). Each checks that the policy sits on the GPU in the dtype `auto`
gives and that no rollout failed on its device. Run by scripts/gpu_check.sh, alone or under
`accelerate launch` (then each process uses its own GPU and the main one rolls out).

    python scripts/gpu_check.py OUT_DIR [--allow-cpu] [--model FOLDER] [--methods mygo,mapgrpo,omne]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tiny datasets and scripted models of the trainer tests

import torch  # noqa: E402
from mhqa_graph.training.configs import DevConfig, ModelConfig, RolloutConfig, load_config  # noqa: E402
from mhqa_graph.training.devices import (  # noqa: E402
    is_main_process,
    on_main_process,
    policy_device,
    policy_dtype,
    world_size,
)
from test_eval import scripted, write_dataset  # noqa: E402
from test_mygo import YES  # noqa: E402
from test_omne_training import TINY_GRPO, TINY_SFT, YAML, wiki_row  # noqa: E402

from mhqa_graph.eval import environment_name, prepare, run_eval  # noqa: E402
from mhqa_graph.export import weighted_message  # noqa: E402
from mhqa_graph.models.chat import model_device  # noqa: E402
from mhqa_graph.store import open_store  # noqa: E402

CPU_ONLY = ("use_cpu", "bf16")  # the trainer tests pin these; here they follow the device
MODEL = {"name": "tiny"}  # the policy of every step: the tiny random model, or a model folder (--model)


def measured(run: Any, steps: Any) -> dict:
    """`run()`'s result with its seconds, seconds per optimizer step (`steps(result)`) and the peak memory: of
    the GPU (torch's allocator) on CUDA, of the process (max RSS) on the CPU."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - started
    n = max(1, int(steps(result) or 0))
    peak = (torch.cuda.max_memory_allocated() if torch.cuda.is_available()
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return result | {"seconds": round(seconds, 1), "seconds_per_step": round(seconds / n, 2),
                     "peak_memory_gib": round(peak / 2**30, 2),
                     "peak_memory_of": "gpu" if torch.cuda.is_available() else "process"}


def check_policy(model: object, where: str, allow_cpu: bool) -> None:
    device, dtype = model_device(model), model.get_input_embeddings().weight.dtype
    if device != policy_device() or dtype != policy_dtype("auto"):
        raise SystemExit(f"{where}: the policy is on {device} in {dtype}, not on {policy_device()} in "
                         f"{policy_dtype('auto')}")
    if device.type != "cuda" and not allow_cpu:
        raise SystemExit(f"{where}: the policy is on {device}, not on a GPU")


def no_failed_calls(folder: Path) -> int:
    """How many rollout records under `folder` there are; SystemExit if one holds a device error."""
    records = [json.loads(line) for path in folder.rglob("results.jsonl") for line in path.read_text().splitlines()]
    bad = [r["error"] for r in records if "DeviceError" in str(r.get("error"))]
    if bad:
        raise SystemExit(f"{folder}: {len(bad)} rollout(s) failed on the device: {bad[0]}")
    return len(records)


def mygo(out: Path, data: Path, store: str, allow_cpu: bool) -> dict:
    from mhqa_graph.training.mygo import MyGOConfig, MyGOTrainer

    rollout = RolloutConfig(agent="rag", dataset="hotpotqa", path=str(data), store=store, limit=3, samples=2,
                            temperature=0.0, max_new_tokens=12)
    warm = out / "warm"
    on_main_process(lambda: run_eval("rag", "hotpotqa", str(data), None, store, warm, progress=False,
                                     context_overrides={"llm": scripted(YES)}))
    sft = {"learning_rate": 1e-2, "max_length": 512, "num_train_epochs": 20, "gradient_accumulation_steps": 1}
    dev = DevConfig(path=str(data), start=3, limit=2, min_questions=2)
    config = MyGOConfig(model=ModelConfig(name=MODEL["name"]), rollout=rollout, dev=dev, iterations=1,
                        warmup_run=str(warm), sft=sft, output_dir=str(out / "run"))
    trainer = MyGOTrainer(config)
    check_policy(trainer.model, "MyGO, loaded", allow_cpu)
    summary = trainer.train()
    check_policy(trainer.model, "MyGO, trained", allow_cpu)
    return {"iterations": [{k: r.get(k) for k in ("iteration", "kept", "sft_rows", "loss", "dev_f1")}
                           for r in summary["iterations"]], "records": no_failed_calls(out / "run")}


def mapgrpo(out: Path, data: Path, store: str, allow_cpu: bool) -> dict:
    from mhqa_graph.training.mapgrpo import MAPGRPOConfig, MAPGRPOTrainer

    rollout = RolloutConfig(agent="opera", dataset="hotpotqa", path=str(data), store=store, limit=2,
                            max_new_tokens=12, context={"max_rounds": 2, "max_rewrites": 1})
    config = MAPGRPOConfig(model=ModelConfig(name=MODEL["name"], lora_r=4), rollout=rollout, roles=["plan", "analysis"],
                           grpo={"num_generations": 2, "beta": 0.04, "per_device_train_batch_size": 2, "max_steps": 1,
                                 "learning_rate": 0.05, "max_completion_length": 12},
                           dev=DevConfig(path=str(data), start=3, limit=1, min_questions=1),
                           output_dir=str(out / "run"))
    trainer = MAPGRPOTrainer(config)
    check_policy(trainer.model, "MAPGRPO, loaded", allow_cpu)
    summary = trainer.train()
    check_policy(trainer.model, "MAPGRPO, trained", allow_cpu)
    return {"roles": {r: {"steps": v["steps"], "plan_executions": v.get("plan_executions")}
                      for r, v in summary["roles"].items()}, "records": no_failed_calls(out / "run")}


def omne(out: Path, allow_cpu: bool) -> dict:
    from mhqa_graph.training.omne import OmneConfig, OmneTrainer

    wiki = out / "dev_evidences.json"
    out.mkdir(parents=True, exist_ok=True)
    on_main_process(lambda: wiki.write_text(json.dumps([wiki_row(str(i)) for i in range(1, 5)])))
    sft_data = out / "sft.jsonl"
    on_main_process(lambda: sft_data.write_text("".join(json.dumps({"messages": [  # rows as `mhqa export sft` writes
        weighted_message("user", f"Who is the father of Ann {i}?"),
        weighted_message("assistant", f"<think>It is known.</think><answer>Bob {i}</answer>")]}) + "\n"
        for i in range(1, 5))))
    base = load_config(OmneConfig, YAML)
    rollout = dataclasses.replace(base.rollout, path=str(wiki), store=f"embedded://{out}/s?embedder=hash", limit=2,
                                  start=0, max_new_tokens=24)
    grpo = {k: v for k, v in TINY_GRPO.items() if k not in CPU_ONLY} | {"max_completion_length": 256}
    sft = {k: v for k, v in TINY_SFT.items() if k not in CPU_ONLY} | {"max_steps": 1}
    config = dataclasses.replace(base, model=ModelConfig(name=MODEL["name"]), rollout=rollout, stages=[1, 2],
                                 dev=DevConfig(path=str(wiki), start=2, limit=1, min_questions=1),
                                 output_dir=str(out / "run"),
                                 grpo=grpo, grpo_stage3={}, sft=sft, sft_data=str(sft_data), sft_min_reward=None,
                                 episode_reserve=32)
    trainer = OmneTrainer(config)
    check_policy(trainer.model, "Omne, loaded", allow_cpu)
    summary = trainer.train()
    check_policy(trainer.model, "Omne, trained", allow_cpu)
    return {"steps": {s["stage"]: s["steps"] for s in summary["stages"]}, "records": no_failed_calls(out / "run")}


def _steps(result: Any, counted: bool = False) -> int:
    """The optimizer steps a method's result reports: every number under a "steps" key, at any depth, summed."""
    if isinstance(result, dict):
        return sum(_steps(v, counted or k == "steps") for k, v in result.items())
    if isinstance(result, list):
        return sum(_steps(v, counted) for v in result)
    return int(result) if counted and isinstance(result, int) and not isinstance(result, bool) else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--allow-cpu", action="store_true", help="run on the CPU too (to check this script)")
    parser.add_argument("--model", default="tiny", help="the policy: tiny (a random 2-layer model, default) or a "
                        "transformers model folder, to measure a real model's memory and step time")
    parser.add_argument("--methods", default="mygo,mapgrpo,omne",
                        help="which methods' steps to run, comma-separated (default: all three)")
    args = parser.parse_args()
    MODEL["name"] = args.model
    torch.manual_seed(0)

    def hotpot() -> tuple[Path, str]:
        args.out.mkdir(parents=True, exist_ok=True)
        data = write_dataset(args.out / "tiny.jsonl")
        store = f"embedded://{args.out}/hotpot?embedder=hash"
        with open_store(store) as opened:
            prepare(opened, "hotpotqa", data, environment_name("hotpotqa", data))
        return data, store

    data, store = on_main_process(hotpot, share=True)
    results: dict[str, Any] = {"device": str(policy_device()), "dtype": str(policy_dtype("auto")), "model": args.model}
    steps = {"mygo": lambda: mygo(args.out / "mygo", data, store, args.allow_cpu),
             "mapgrpo": lambda: mapgrpo(args.out / "mapgrpo", data, store, args.allow_cpu),
             "omne": lambda: omne(args.out / "omne", args.allow_cpu)}
    chosen = args.methods.split(",")
    if unknown := set(chosen) - set(steps):
        parser.error(f"--methods: no method {', '.join(sorted(unknown))} (there are {', '.join(steps)})")
    steps = {name: step for name, step in steps.items() if name in chosen}
    for name, step in steps.items():  # each printed when it ends: a method that fails keeps the others' figures
        try:
            results[name] = measured(step, _steps)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported, and the exit status says it failed
            if world_size() > 1:  # the other processes would wait for this one at the next step's barrier
                raise
            results[name] = {"error": f"{type(exc).__name__}: {str(exc)[-600:]}"}
        if is_main_process():
            print(f"gpu_check {name}: {json.dumps(results[name], default=str)}", flush=True)
    if is_main_process():
        (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
        print(json.dumps(results, indent=2, default=str))
    if any("error" in results[name] for name in steps):
        raise SystemExit(1)

if __name__ == "__main__":
    main()
