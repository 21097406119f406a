"""A committed adapter on another dev slice: the untrained policy and the policy with the adapter, each answered as
the learning run's dev runs are (its config's agent, settings, store, serving and guards; greedy), with compact
records that `training/runs.py` tables. Use it to measure a run's adapter on questions no decision looked at: a
slice that shares a question with the training slice or the run's own dev slice, by id, text or gold path (a
paraphrase counts), is refused.

    python training/evaluate.py omne configs/train/learn/omne-templates-pq2h.yaml \\
        mhqa_graph/adapters/omne-pq2h --start 102 --limit 100 --name stage1 --records <folder to commit>
    python training/runs.py <folder to commit>

One adapter (MyGO's, Omne's); MAPGRPO's role adapters are not served this way. The untrained run is cached (and
resumed) as a trainer's is, in `dev.cache` (default: `runs/learn/untrained` beside the run); the adapter's run
resumes from `<out>/dev/<name>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import shutil
from pathlib import Path
from typing import Any

from mhqa_graph.training import TRAINERS
from mhqa_graph.training.configs import ModelConfig, load_config
from mhqa_graph.training.dev import UNTRAINED, check_disjoint, policy_dev, shared_questions
from mhqa_graph.training.logs import LOG, write_log
from mhqa_graph.training.policy import load_model

from mhqa_graph.errors import DevSliceError, InvalidInput
from mhqa_graph.eval.runner import load_questions
from mhqa_graph.models.adapters import WEIGHTS


def load_adapter(model: Any, folder: Path, config: ModelConfig) -> None:
    """The PEFT adapter saved in `folder` into `model`'s "default" adapter, which `config` made: InvalidInput
    unless the two agree on rank, alpha and target modules and every weight of one has its place in the other."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    saved = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    ours = {"r": config.lora_r, "lora_alpha": config.lora_alpha, "target_modules": sorted(config.target_modules)}
    theirs = {"r": saved.get("r"), "lora_alpha": saved.get("lora_alpha"),
              "target_modules": sorted(saved.get("target_modules") or [])}
    if ours != theirs or saved.get("use_rslora") or saved.get("use_dora"):
        raise InvalidInput(f"{folder} holds an adapter of {theirs}; the config's model makes {ours}")
    weights = load_file(str(folder / WEIGHTS))
    loaded = set_peft_model_state_dict(model, weights)
    lora = {k for k in loaded.missing_keys if "lora_" in k}
    if loaded.unexpected_keys or lora:
        raise InvalidInput(f"{folder} does not fit the config's policy: {len(loaded.unexpected_keys)} of its weights "
                           f"have no place in it and {len(lora)} of its LoRA weights are not in the folder")


def evaluate(method: str, config_path: Path, adapter: Path, start: int, limit: int, name: str, records: Path,
             out: Path | None = None, only: str | None = None) -> dict[str, dict[str, Any]]:
    """Dev metrics of the untrained policy and of `adapter` on questions `start`..`start+limit` of the config's dev
    file, their records in `records`, the runs under `out` (default: the config's output_dir + "-eval"). `only`
    ("untrained" or "adapter") makes one of the two runs, e.g. each in its own process."""
    if method not in TRAINERS or method == "mapgrpo":
        raise InvalidInput(f"evaluate serves one adapter: mygo or omne, got {method!r}")
    if name == UNTRAINED:
        raise InvalidInput(f"--name {UNTRAINED!r} is the run without the adapter; name the adapter's run otherwise")
    if not (adapter / WEIGHTS).is_file():
        raise InvalidInput(f"{adapter} holds no PEFT adapter ({WEIGHTS})")
    module, config_cls, _ = TRAINERS[method]
    config = load_config(getattr(importlib.import_module(f"mhqa_graph.training.{module}"), config_cls), config_path)
    if not config.model.lora:
        raise InvalidInput(f"{config_path} trains the full model (model.lora: false): there is no adapter to load")
    out = out or Path(f"{config.output_dir}-eval")
    dev = dataclasses.replace(config.dev, start=start, limit=limit, records=str(records))
    check_disjoint(config.rollout, dev)
    if config.dev.path:  # the run's own dev slice (its questions, their gold paths) is where its decisions were read
        used = load_questions(config.rollout.dataset, config.dev.path, config.dev.limit, config.dev.start)
        if shared := shared_questions(used, load_questions(config.rollout.dataset, dev.path, limit, start)):
            raise DevSliceError(f"questions {start}-{start + limit - 1} share {len(shared)} with the run's own dev "
                                f"slice (from #{config.dev.start}) by id, text or gold path, e.g. {shared[0]!r}: pick "
                                "questions it did not see, nor paraphrases of them")
    out.mkdir(parents=True, exist_ok=True)
    write_log(out / LOG, {"event": "evaluate", "config": str(config_path), "adapter": str(adapter), "start": start,
                          "limit": limit})
    model, tokenizer = load_model(config.model)
    metrics = {}
    for run in {None: (UNTRAINED, name), UNTRAINED: (UNTRAINED,), "adapter": (name,)}[only]:
        if run == name:
            load_adapter(model, adapter, config.model)
        metrics[run] = policy_dev(config.rollout, dev, model, tokenizer, out, run, config.model)
        write_log(out / LOG, {"event": "dev", "after": run, **metrics[run]})
    shutil.copyfile(out / LOG, records / LOG)  # with this run's dev line
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("method", choices=["mygo", "omne"], help="the trainer whose config this is")
    parser.add_argument("config", type=Path, help="the learning run's config (its agent, settings and dev file)")
    parser.add_argument("adapter", type=Path, help="a PEFT adapter folder (a run's docs/runs/<run>/adapter)")
    parser.add_argument("--start", type=int, required=True, help="the slice's first question of the dev file")
    parser.add_argument("--limit", type=int, default=100, help="its questions (at least dev.min_questions)")
    parser.add_argument("--name", required=True, help="the adapter's run, e.g. stage1 or iter1")
    parser.add_argument("--records", type=Path, required=True, help="the folder to commit the records in")
    parser.add_argument("--out", type=Path, help="the run folders (default: the config's output_dir + '-eval')")
    parser.add_argument("--only", choices=[UNTRAINED, "adapter"], help="make one of the two runs")
    args = parser.parse_args(argv)
    for run, values in evaluate(args.method, args.config, args.adapter, args.start, args.limit, args.name,
                                args.records, args.out, args.only).items():
        print(run, {k: values[k] for k in ("dev_f1", "dev_em", "dev_llm_calls", "dev_df1", "dev_df1_low",
                                           "dev_df1_high") if k in values})


if __name__ == "__main__":
    main()
