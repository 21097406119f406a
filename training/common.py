"""What the trainers share: the model to train (LoRA or full), configs from YAML, rollouts through the
agent graphs with the model under training.

    model, tokenizer = load_model(ModelConfig(name="qwen2.5-coder-0.5b", lora=True))
    llm = chat_model_for(model, tokenizer, temperature=0.7)          # the agents' `llm`, current weights
    records = rollouts(RolloutConfig(agent="mujica", dataset="2wiki", path=...), llm, "runs/mygo/iter1")
    metrics = policy_dev(rollout, DevConfig(path=...), model, tokenizer, "runs/mygo", "iter1", config)

Every trainer config has a `dev` slice of held-out questions; `check_disjoint` refuses one that shares a
question with the training slice or holds fewer than `dev.min_questions`. The untrained policy's dev run is
kept in a cache shared by the runs of the same slice (`untrained_folder`), and every later dev run is
compared with it question by question (`dev_metrics`: ΔF1 with its paired-bootstrap interval, better/worse
and a sign test, beside the behaviour rates of `eval.health.behaviour`). The policy is a chat pack, a local
folder or a Hugging Face Hub id, placed on this process's GPU if there is one (training/devices.py); under
several processes, rollouts, dev runs, checkpoints and log lines are the main process's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import shutil
import typing
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mhqa_graph.errors import DevSliceError, InvalidInput, ModelError, ModelNotFound, ModelNotInstalled, TrainingError
from mhqa_graph.eval.health import behaviour
from mhqa_graph.eval.paired import paired_comparison
from mhqa_graph.eval.report import RESULTS, carry_over, read_records
from mhqa_graph.models.chat import TransformersChatModel, model_device

from .devices import is_main_process, on_main_process, policy_device, policy_dtype, world_size
from .lora_gguf import supports, write_lora_gguf
from .serving import check_rollout_llm, served_policy

LOG = "log.jsonl"  # every trainer's JSON-lines log in its output_dir; curve.png beside it plots it
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class ModelConfig:
    """The policy: a chat pack name, a transformers folder, a Hugging Face Hub id, or "tiny" (a random tiny
    Qwen2, for tests)."""

    name: str = "qwen2.5-coder-0.5b"
    lora: bool = True  # False: full fine-tuning
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    dtype: str = "auto"  # auto: bfloat16 on a GPU that has it, else float32 (fastest on CPUs); or float32, ...
    seed: int = 0
    inference: str = "auto"  # rollouts and dev runs: llamacpp | transformers | auto (llamacpp when it can serve)
    # where rollouts and dev runs generate (training/serving.py): in_process (as `inference` says) | server
    # (llama-server over the pack's GGUF with the current adapter) | openai:<url>#<model> (a running server)
    rollout_llm: str = "in_process"
    rollout_concurrency: int = 1  # questions in flight in rollouts and dev runs; server: its slots
    rollout_load_adapter: bool = False  # openai: load the adapter before each phase (vLLM /v1/load_lora_adapter)

    def __post_init__(self) -> None:
        check_rollout_llm(self)


@dataclass
class RolloutConfig:
    """Which questions the policy answers, with which agent, over which store."""

    agent: str = "mujica"
    dataset: str = "2wiki"  # hotpotqa | 2wiki | musique | pathquestion
    path: str = ""  # the benchmark file
    store: str | None = None  # store URI; the dataset's corpus/KG is ingested once
    limit: int | None = None  # questions (None = all)
    start: int = 0  # skip the first N questions: keeps train and dev slices disjoint
    samples: int = 1  # trajectories per question
    temperature: float = 0.7
    max_new_tokens: int = 256
    context: dict[str, Any] = field(default_factory=dict)  # more agent settings: top_k, max_rounds, ...


@dataclass
class DevConfig:
    """Held-out questions (same dataset, agent and store as the rollouts) that the trainer answers
    greedily before training and after each iteration or stage; no `path`: no dev evaluation."""

    path: str = ""
    start: int = 0
    limit: int | None = 100
    min_questions: int = 100  # a smaller slice raises DevSliceError (tests set it lower)
    cache: str | None = None  # the untrained policy's dev runs, one folder per key; None: <output_dir>/../untrained
    guards_off: bool = False  # also run the trained policy with guards "none" (GUARDS_OFF), against the untrained
    # policy with its guards on: does training teach what the guards patch?
    records: str = ""  # a folder to commit (docs/runs/<run>): each dev run's compact per-question records as
    # <name>.jsonl.gz (mhqa_graph.eval.records), the trainer's log.jsonl and the policy's settings and seed
    # (model.json); `python training/runs.py <folder>` tables them


UNTRAINED = "untrained"  # the dev run of the policy before training
GUARDS_OFF = "final_guards_none"  # the dev run of the trained policy with guards "none" (`dev.guards_off`)


def dev_rollout(rollout: RolloutConfig, dev: DevConfig) -> RolloutConfig:
    """The rollout settings of the dev evaluation: the dev slice, one greedy sample per question."""
    return dataclasses.replace(rollout, path=dev.path, start=dev.start, limit=dev.limit, samples=1, temperature=0.0)


def check_disjoint(rollout: RolloutConfig, dev: DevConfig) -> None:
    """DevSliceError (an InvalidInput) when the dev slice holds fewer than `dev.min_questions` questions, or
    shares a question (by id or by text) with the training slice."""
    from mhqa_graph.eval.runner import load_questions

    if not dev.path:
        return
    held = load_questions(rollout.dataset, dev.path, dev.limit, dev.start)
    if len(held) < dev.min_questions:
        raise DevSliceError(f"the dev slice ({dev.path} from #{dev.start}) holds {len(held)} question(s); at least "
                            f"{dev.min_questions} are needed for a dev F1 whose interval says something "
                            "(dev.limit, or dev.min_questions for a test)")
    train = load_questions(rollout.dataset, rollout.path, rollout.limit, rollout.start)

    def norm(text: str) -> str:
        return " ".join(text.lower().split())

    ids, texts = {q.id for q in held}, {norm(q.question) for q in held}
    shared = [q.id for q in train if q.id in ids or norm(q.question) in texts]
    if shared:
        raise DevSliceError(f"the training slice ({rollout.path} from #{rollout.start}) and the dev slice ({dev.path} "
                            f"from #{dev.start}) share {len(shared)} question(s), e.g. {shared[0]!r}")


def dev_metrics(records: list[dict[str, Any]], untrained: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Mean dev F1 and EM, LLM calls per question and the behaviour rates (`eval.health.behaviour`: well-formed
    runs, tool calls, workers consulted, answer length, "unknown" answers), each key prefixed `dev_`. Against
    the `untrained` policy's records of the same questions (`eval.paired.paired_comparison`): `dev_df1`, the
    mean ΔF1 in points, its 95% paired-bootstrap interval `dev_df1_low`..`dev_df1_high`, `dev_better`,
    `dev_worse`, the sign test's `dev_sign_p` and `dev_paired`, the questions compared."""
    n = max(1, len(records))
    metrics = {"f1": sum(r.get("f1") or 0.0 for r in records) / n, "em": sum(r.get("em") or 0.0 for r in records) / n,
               "llm_calls": sum(r.get("llm_calls") or 0 for r in records) / n, "questions": len(records),
               **behaviour(records), **(paired_comparison(untrained, records) if untrained else {})}
    return {f"dev_{k}": v for k, v in metrics.items()}


def policy_identity(config: ModelConfig) -> dict[str, Any]:
    """What the untrained policy is, for the untrained-run cache: a chat pack by its pinned checksum, a folder by
    its files' sizes and modification times, a Hub id by the snapshot its cache holds, "tiny" by its seed; with
    the dtype. LoRA settings are left out: a fresh adapter (B = 0) leaves the base model's outputs unchanged."""
    from mhqa_graph.models.packs import PACKS

    identity: dict[str, Any] = {"name": config.name, "dtype": str(policy_dtype(config.dtype, policy_device()))}
    if config.name == "tiny":
        return identity | {"seed": config.seed}
    if config.name in PACKS:
        return identity | {"sha256": PACKS[config.name].sha256}
    folder = Path(config.name).expanduser()
    if folder.is_dir():
        return identity | {"path": str(folder.resolve()), "files": {
            str(f.relative_to(folder)): [f.stat().st_size, f.stat().st_mtime_ns]
            for f in sorted(folder.rglob("*")) if f.is_file()}}
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(config.name, "config.json")
    except Exception:  # not a Hub id the cache knows: the name alone
        cached = None
    return identity | {"snapshot": Path(cached).parent.name if isinstance(cached, str) else None}


def untrained_key(rollout: RolloutConfig, dev: DevConfig, config: ModelConfig, model: Any) -> dict[str, Any]:
    """What the untrained policy's dev run depends on: the policy (`policy_identity`) and who serves it, the
    agent, the dev file (path and content hash: a copy or a touch keeps the key) and store, the question slice,
    the decoding settings and agent settings, and the guards the agent runs."""
    from mhqa_graph.graphs.guards import selected

    from mhqa_graph.models.packs import file_sha256

    run = dev_rollout(rollout, dev)
    data = Path(run.path).expanduser().resolve()
    return {"policy": policy_identity(config),
            "backend": ("llamacpp" if serves_with_llamacpp(model, config) else "transformers")
            if config.rollout_llm == "in_process" else config.rollout_llm.partition("?")[0],  # server | openai:...
            "agent": run.agent, "dataset": run.dataset, "file": str(data),
            "file_sha256": file_sha256(data) if data.is_file() else None, "store": run.store,
            "start": run.start, "limit": run.limit, "temperature": run.temperature,
            "max_new_tokens": run.max_new_tokens, "context": json.loads(json.dumps(run.context, default=str)),
            "guards": sorted(selected(run.context.get("guards"), run.agent))}


def json_digest(value: Any) -> str:
    """16 hex digits of the SHA-256 of `value` as JSON with sorted keys: a short name for settings or data."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


def untrained_folder(key: dict[str, Any], dev: DevConfig, output_dir: str | Path) -> Path:
    """The untrained policy's dev run for `key` (`untrained_key`): `<cache>/<agent>-<hash of the key>`, the
    cache being `dev.cache` or `<output_dir>/../untrained`."""
    cache = Path(dev.cache) if dev.cache else Path(output_dir).parent / UNTRAINED
    return cache / f"{key['agent']}-{json_digest(key)}"


def question_ids(rollout: RolloutConfig) -> list[str]:
    """The ids of `rollout`'s questions, in order."""
    from mhqa_graph.eval.runner import load_questions

    return [q.id for q in load_questions(rollout.dataset, rollout.path, rollout.limit, rollout.start)]


def finished_records(rollout: RolloutConfig, folder: Path) -> list[dict[str, Any]] | None:
    """The records of `rollout`'s questions in the one-sample run `folder`, None unless every question has one."""
    wanted = question_ids(rollout)
    records = {r["id"]: r for r in read_records(folder / "sample0" / RESULTS)}
    return [records[i] | {"sample": 0} for i in wanted] if all(i in records for i in wanted) else None


Llms = Callable[[Path], tuple[Any, dict[str, Any] | None]]  # a run folder -> (llm, role_llms) of the policy


def dev_run(rollout: RolloutConfig, dev: DevConfig, config: ModelConfig, model: Any, output_dir: str | Path,
            name: str, llms: Llms, alike: str | None = None) -> dict[str, Any]:
    """`dev_metrics` of a greedy run over the dev slice, the policy served by `llms(folder)`; {} without a dev
    slice. The `untrained` run is kept in `untrained_folder`: a finished one is read back without asking the
    model, an interrupted one resumes, and another key (policy, slice, settings) gets a folder of its own; its
    metrics carry `dev_run` (the folder) and `dev_reused`. Every other `name` is a resumable run in
    `output_dir/dev/<name>`, compared with the untrained run's records when there is one. `GUARDS_OFF` runs
    with guards "none"; `alike` names the dev run of the same weights with guards on, whose records on which no
    guard fired it takes over instead of asking again (`report.carry_over`), counted in `dev_carried`."""
    if not dev.path:
        return {}
    run = dev_rollout(rollout, dev)
    key = untrained_key(rollout, dev, config, model)
    cached = untrained_folder(key, dev, output_dir)
    if name == UNTRAINED:
        records = finished_records(run, cached)
        reused = records is not None
        if records is None:
            on_main_process(lambda: (cached.mkdir(parents=True, exist_ok=True),
                                     (cached / "key.json").write_text(json.dumps(key, indent=2), encoding="utf-8")))
            llm, roles = llms(cached)
            records = rollouts(run, llm, cached, roles, concurrency=config.rollout_concurrency)
        on_main_process(lambda: publish(dev, name, cached, output_dir, config))
        return dev_metrics(records) | {"dev_run": str(cached), "dev_reused": reused}
    folder = Path(output_dir) / "dev" / name
    if name == GUARDS_OFF:
        run = dataclasses.replace(run, context={**run.context, "guards": "none"})
        if alike:
            on_main_process(lambda: carry_over(Path(output_dir) / "dev" / alike / "sample0", folder / "sample0",
                                               question_ids(run), None, alike))
    llm, roles = llms(folder)
    records = rollouts(run, llm, folder, roles, concurrency=config.rollout_concurrency)
    on_main_process(lambda: publish(dev, name, folder, output_dir, config))
    carried = {"dev_carried": sum(bool(r.get("carried")) for r in records)} if name == GUARDS_OFF else {}
    return dev_metrics(records, read_records(cached / "sample0" / RESULTS) or None) | carried


def publish(dev: DevConfig, name: str, folder: Path, output_dir: str | Path, config: ModelConfig) -> None:
    """With `dev.records`, the dev run `name` (its records in `folder`) as files to commit there: its compact
    per-question records, the log so far and the policy's settings, seed included."""
    if not dev.records:
        return
    from mhqa_graph.eval.records import SUFFIX, save

    out = Path(dev.records)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{name}{SUFFIX}"
    target.unlink(missing_ok=True)  # this run's records only, not a merge with an earlier run's
    save(folder / "sample0", target)
    if (log := Path(output_dir) / LOG).is_file():
        shutil.copyfile(log, out / LOG)
    (out / "model.json").write_text(json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True) + "\n",
                                    encoding="utf-8")


def policy_dev(rollout: RolloutConfig, dev: DevConfig, model: Any, tokenizer: Any, output_dir: str | Path, name: str,
               config: ModelConfig, alike: str | None = None) -> dict[str, Any]:
    """`dev_run` of an in-memory policy, served greedily as `policy_chat_model` does."""
    return dev_run(rollout, dev, config, model, output_dir, name, lambda folder: (
        policy_chat_model(model, tokenizer, config, folder, 0.0, rollout.max_new_tokens), None), alike)


def serves_with_llamacpp(model: Any, config: ModelConfig) -> bool:
    """Whether `policy_chat_model` serves `model` with llama.cpp: always for `inference: llamacpp` (InvalidInput
    if it can't), for "auto" when the policy is a LoRA adapter over a chat pack on the CPU and llama-cpp-python
    is in (a policy on a GPU generates there)."""
    from mhqa_graph.models.packs import PACKS

    if config.inference not in ("auto", "llamacpp", "transformers"):
        raise InvalidInput(f"model.inference must be auto, llamacpp or transformers, got {config.inference!r}")
    possible = (config.lora and config.name in PACKS and supports(model)
                and importlib.util.find_spec("llama_cpp") is not None)
    if config.inference == "llamacpp" and not possible:
        raise InvalidInput("model.inference: llamacpp needs a LoRA policy over a chat pack and "
                           "llama-cpp-python (pip install 'mhqa-graph[llamacpp]')")
    on_cpu = getattr(model_device(model), "type", "cpu") == "cpu"
    return possible and (config.inference == "llamacpp" or (config.inference == "auto" and on_cpu))


def policy_chat_model(model: Any, tokenizer: Any, config: ModelConfig, folder: str | Path,
                      temperature: float = 0.0, max_new_tokens: int = 256, adapter: str | None = None) -> Any:
    """The policy with its current weights as the agents' chat model, for rollouts and dev runs. Served by
    llama.cpp when `serves_with_llamacpp`: the LoRA `adapter` (default: the active one) is written to
    `folder/<adapter>.gguf` and applied over the pack's GGUF (about 10x faster generation on the CPU); else
    by transformers. With `config.rollout_llm` server or openai:, as `serving.served_policy` says."""
    served = served_policy(model, config, folder, {"policy": adapter or getattr(model, "active_adapter", None)},
                           temperature, max_new_tokens)
    if served is not None:
        return served["policy"]
    seed = config.seed if temperature > 0 else None  # sampled calls: seed + n, reproducible
    if not serves_with_llamacpp(model, config):
        return chat_model_for(model, tokenizer, temperature, max_new_tokens, seed=seed)
    path = Path(folder) / f"{adapter or 'adapter'}.gguf"
    on_main_process(lambda: write_lora_gguf(model, path, adapter))
    return llamacpp_policy(config.name, path, temperature, max_new_tokens, seed=seed)


def llamacpp_policy(pack: str, adapter: Path | None, temperature: float, max_new_tokens: int,
                    seed: int | None = None) -> Any:
    """llama.cpp over `pack`'s GGUF with the LoRA `adapter` file (None: the base model); `seed` seeds sampled
    calls (call n: seed + n)."""
    from mhqa_graph.models.factory import load_chat_model

    spec = f"llamacpp:{pack}" + (f"?lora={adapter}" if adapter else "")
    return load_chat_model(spec, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                           model_name=f"{pack}+{adapter.stem}" if adapter else pack)


def hub_offline() -> bool:
    """Whether the Hugging Face Hub may not be asked (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set)."""
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
                                           for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def policy_source(name: str) -> tuple[str, bool]:
    """Where the policy `name` loads from, and whether from local files only: a chat pack's converted folder
    or a local folder; else a Hugging Face Hub id, downloaded into the HF cache (only the cache when
    `hub_offline`). ModelNotFound when `name` can be none of these."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from mhqa_graph.models.packs import PACKS, pack_path

    if name in PACKS:
        return str(pack_path(name)), True
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser()), True
    try:
        validate_repo_id(name)
    except HFValidationError:
        chat = ", ".join(n for n, p in PACKS.items() if p.kind == "chat")
        raise ModelNotFound(f"model {name!r} is neither a chat pack ({chat}), a model folder, nor a Hugging Face "
                            "Hub id (owner/name)") from None
    return name, hub_offline()


def master_dtype(config: ModelConfig, dtype: Any) -> Any:
    """The dtype the trained weights are kept in. A LoRA adapter trains in float32 over a base in `dtype`; full
    fine-tuning keeps float32 master weights (updates of 1e-6 vanish in bfloat16's 8 bits of mantissa), with
    bf16 autocast on a GPU that has it (`devices.precision_args`). A full fine-tuning asked in a half dtype by
    name is refused: `auto` gives float32 masters."""
    import torch

    if config.lora or dtype == torch.float32:
        return dtype
    if config.dtype != "auto":
        raise InvalidInput(f"model.dtype {config.dtype} with lora: false would update {config.dtype} weights "
                           "directly, losing small updates; use dtype auto or float32 (bf16 autocast still applies)")
    return torch.float32


def load_model(config: ModelConfig) -> tuple[Any, Any]:
    """(model, tokenizer) ready to train, on this process's device (`devices.policy_device`) in `config.dtype`:
    wrapped in a PEFT LoRA adapter when `config.lora`."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelNotInstalled(f"training needs torch and transformers ({exc}); "
                                "pip install 'mhqa-graph[train]'") from None
    device = policy_device()
    dtype = master_dtype(config, policy_dtype(config.dtype, device))
    if config.name == "tiny":
        from .tiny import tiny_model_and_tokenizer

        model, tokenizer = tiny_model_and_tokenizer(seed=config.seed)
        model = model.to(device=device, dtype=dtype)
    else:
        source, local = policy_source(config.name)
        torch.manual_seed(config.seed)
        placed = {} if device.type == "cpu" else {"device_map": {"": device}}
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=local, **placed)
        except OSError as exc:
            if Path(source).is_dir():
                raise ModelError(f"cannot load the policy from {source}: {exc}") from exc
            hub = "has no copy in the local cache (HF_HUB_OFFLINE is set)" if local else "gave none"
            raise ModelNotFound(f"model {config.name!r} is not a chat pack or a model folder, and the Hugging Face "
                                f"Hub {hub}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if config.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha,
                                                 lora_dropout=config.lora_dropout, task_type="CAUSAL_LM",
                                                 target_modules=list(config.target_modules)))
    return model, tokenizer


def chat_model_for(model: Any, tokenizer: Any, temperature: float = 0.0, max_new_tokens: int = 256,
                   name: str = "policy", seed: int | None = None) -> TransformersChatModel:
    """The model under training as a LangChain chat model, for the agents' `llm` / `role_llms`; `seed` seeds
    sampled calls (call n: seed + n)."""
    return TransformersChatModel.from_loaded(model, tokenizer, model_name=name, temperature=temperature,
                                             max_new_tokens=max_new_tokens, seed=seed)


def teacher_folder(spec: str) -> str:
    """The folder name of a teacher's rollouts: its spec made path-safe (cut short) and a hash of the whole
    spec, so two teachers never share a folder."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", spec)[:40].strip("-.")
    return f"teacher-{slug}-{hashlib.sha256(spec.encode('utf-8')).hexdigest()[:10]}"


def rollouts(config: RolloutConfig, llm: Any, out_dir: str | Path, role_llms: dict[str, Any] | None = None,
             force_new: bool = False, concurrency: int = 1) -> list[dict[str, Any]]:
    """Run the agent `config.samples` times over the questions with `llm` (a chat model or spec), `concurrency`
    questions in flight, and return the eval records (each with its trace, em, f1 and `sample`). Sample j is the
    resumable eval run `out_dir/sample{j}`, so an interrupted rollout continues where it stopped; RunMismatch if
    it holds a run with another model spec or settings. `force_new` starts every sample folder afresh."""
    from mhqa_graph.eval import run_eval

    model = getattr(llm, "_model", None)
    if model is not None:
        model.eval()
    overrides = {**config.context, "llm": llm, "max_new_tokens": config.max_new_tokens,
                 **({"role_llms": role_llms} if role_llms else {})}
    folders = [Path(out_dir) / f"sample{j}" for j in range(config.samples)]

    def run() -> None:
        for out in folders:
            run_eval(config.agent, config.dataset, config.path, llm, config.store, out, limit=config.limit,
                     start=config.start, concurrency=concurrency, context_overrides=overrides, progress=False,
                     force_new=force_new)
            check_policy_faults([llm, *(role_llms or {}).values()], out)

    on_main_process(run)  # under several processes the main one rolls out, the others read its records
    return [r | {"sample": j} for j, out in enumerate(folders) for r in read_records(out / RESULTS)]


def check_policy_faults(models: Iterable[Any], folder: Path | None = None) -> None:
    """TrainingError when one of `models` (chat models over the policy) failed on its device or dtype
    (`TransformersChatModel.device_fault`) or lost its server (`LlamaServerChatModel.backend_fault`): the agent
    recorded those calls as failed, their answers scored 0,
    and training on them would learn nothing true. The rollout `folder` is first moved aside to
    `<folder>.device-error` (replacing an older one), so that a rerun rolls out afresh instead of resuming it."""
    fault = next((f for m in models if (f := getattr(m, "device_fault", None) or getattr(m, "backend_fault", None))),
                 None)
    if fault is None:
        return
    kept = ""
    if folder is not None and folder.exists():
        aside = folder.with_name(folder.name + ".device-error")
        shutil.rmtree(aside, ignore_errors=True)
        folder.rename(aside)
        kept = f"; its records are in {aside}, and a rerun rolls out afresh"
    raise TrainingError(f"the policy's model failed during a rollout ({fault}); training stops "
                        f"rather than score those answers 0 and learn from them{kept}")


@contextmanager
def rollout_store(rollout: RolloutConfig) -> Iterator[Any]:
    """The rollouts' store, for what searches it during training (Omne's episodes). With one process it is
    opened for writing (the dataset's environment is ingested if missing); with several, the main process
    ingests what is missing and then every process opens it read-only (a reader takes no lock)."""
    from mhqa_graph.eval.environments import open_environment
    from mhqa_graph.store import open_store

    if world_size() == 1:
        with open_store(rollout.store) as store:
            yield store
        return

    def ingest() -> None:
        with open_environment(rollout.store, rollout.dataset, rollout.path):
            pass

    on_main_process(ingest)
    with open_store(rollout.store, read_only=True) as store:
        yield store


def plot_curve(out_dir: str | Path, title: str) -> str:
    """`out_dir/curve.png` of `out_dir/log.jsonl`, drawn by the main process; returns its path."""
    from .curve import plot_log

    out_dir = Path(out_dir)
    return str(on_main_process(lambda: plot_log(out_dir / LOG, out_dir / "curve.png", title), share=True))


def save_policy(model: Any, tokenizer: Any, path: str | Path) -> str:
    """The weights (or adapters) and the tokenizer saved to `path` by the main process; returns the path."""
    def save() -> None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)

    on_main_process(save)
    return str(path)


def publish_final(dev: DevConfig, model: Any, output_dir: str | Path) -> None:
    """With `dev.records`, what a finished run adds there for others to evaluate or continue: its LoRA adapter
    (`adapter/`, small; full weights are not copied) and the log to its end."""
    if not dev.records:
        return
    out = Path(dev.records)

    def publish() -> None:
        out.mkdir(parents=True, exist_ok=True)
        if getattr(model, "peft_config", None):
            model.save_pretrained(out / "adapter")
        if (log := Path(output_dir) / LOG).is_file():
            shutil.copyfile(log, out / LOG)

    on_main_process(publish)


CHECKPOINT, STATE = "checkpoint", "state.json"


def save_checkpoint(model: Any, folder: Path, state: dict[str, Any]) -> None:
    """The weights (or LoRA adapter) and `state` in `folder/checkpoint`, by the main process: where a rerun
    resumes."""
    path = folder / CHECKPOINT

    def save() -> None:
        model.save_pretrained(path)
        (path / STATE).write_text(json.dumps(state), encoding="utf-8")

    on_main_process(save)


def saved_checkpoints(out: Path, pattern: str) -> list[tuple[dict[str, Any], Path]]:
    """(state, checkpoint folder) of every checkpoint under `out` whose folder matches `pattern` (a glob)."""
    return [(json.loads(p.read_text(encoding="utf-8")), p.parent) for p in out.glob(f"{pattern}/{CHECKPOINT}/{STATE}")]


def load_checkpoint(model: Any, path: Path) -> None:
    """Load the weights `save_checkpoint` saved in the checkpoint folder `path` into `model`."""
    from safetensors.torch import load_file

    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(path / "adapter_model.safetensors")))
    else:
        model.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)


STEP_SAVES = {"save_strategy": "steps", "save_steps": 1, "save_total_limit": 1}  # TRL arguments: a step
# checkpoint after every step, the newest kept, so that `train_resuming` resumes a stopped stage at its last step


def train_resuming(trainer: Any, state: dict[str, Any], log: Path, first: Callable[[], Any] | None = None) -> Any:
    """`trainer.train()` (its TrainOutput), resumed from the newest step checkpoint (`checkpoint-<step>`, saved
    by the TRL arguments' `save_steps`) in its output_dir that a run of the same `state` (stage, order,
    arguments) left there when it was stopped; a step checkpoint of another state is removed with a warning.
    `first` runs before a stage that starts afresh only. Each step checkpoint gets `state` beside it; they are
    all removed once the stage has trained to its end."""
    import warnings

    from transformers import TrainerCallback
    from transformers.trainer_utils import get_last_checkpoint

    folder = Path(trainer.args.output_dir)
    last = get_last_checkpoint(str(folder)) if folder.is_dir() else None
    if last and _step_state(Path(last)) != state:
        message = f"{folder}: step checkpoints of another run (stage, order or arguments differ) removed"
        warnings.warn(message, stacklevel=2)
        write_log(log, {"event": "step_checkpoints_removed", "message": message})
        _remove_step_checkpoints(folder)
        last = None
    if last:
        write_log(log, {"event": "resumed", "stage": state.get("stage"), "from": Path(last).name})

    class StepState(TrainerCallback):
        def on_save(self, args: Any, st: Any, control: Any, **kwargs: Any) -> None:
            saved = Path(args.output_dir) / f"checkpoint-{st.global_step}"
            if is_main_process() and saved.is_dir():
                (saved / STATE).write_text(json.dumps(state, default=str), encoding="utf-8")

    trainer.add_callback(StepState())
    if first is not None and not last:
        first()
    result = trainer.train(resume_from_checkpoint=last)
    on_main_process(lambda: _remove_step_checkpoints(folder))
    return result


def _step_state(checkpoint: Path) -> dict[str, Any] | None:
    try:
        return json.loads((checkpoint / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _remove_step_checkpoints(folder: Path) -> None:
    for path in folder.glob("checkpoint-*"):
        shutil.rmtree(path, ignore_errors=True)


def write_log(path: Path, entry: dict[str, Any]) -> None:
    """Append `entry` as one JSON line to a trainer's log.jsonl (the main process's only)."""
    if not is_main_process():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, ensure_ascii=False, default=float) + "\n")


def jsonl_log(path: Path, **tags: Any) -> Any:
    """A TRL/transformers callback appending every log entry (loss, rewards, ...) with `tags` and the step
    to `path`; the entries are also kept in its `entries` list."""
    from transformers import TrainerCallback

    class JsonlLog(TrainerCallback):
        entries: list[dict[str, Any]] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            entry = {**tags, "step": state.global_step, **(logs or {})}
            self.entries.append(entry)
            write_log(path, entry)

    log = JsonlLog()
    log.entries = []
    return log


T = TypeVar("T")


def from_dict(cls: type[T], values: dict[str, Any], where: str = "config") -> T:
    """`cls(**values)` with nested dataclass fields built from dicts; unknown keys raise InvalidInput."""
    if not isinstance(values, dict):
        raise InvalidInput(f"{where} must be a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise InvalidInput(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    kwargs = {}
    for key, value in values.items():
        hint = hints.get(key)
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = from_dict(hint, value, f"{where}.{key}")
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{where}: {exc}") from None


def load_config(cls: type[T], path: str | Path) -> T:
    """A trainer config (`cls`) from a YAML file; nested sections are nested dataclasses or dicts."""
    import yaml

    try:
        values = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInput(f"cannot read config {path}: {exc}") from None
    return from_dict(cls, values, str(path))
