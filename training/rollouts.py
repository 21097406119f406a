"""Rollouts: the agent graphs run over a slice of questions with the policy as their model, records written as
`mhqa eval` writes them; a device fault stops training instead of being scored 0."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mhqa_graph.errors import TrainingError
from mhqa_graph.eval import records as compact_records
from mhqa_graph.eval.report import RESULTS, read_records
from mhqa_graph.eval.runner import MANIFEST

from .configs import RolloutConfig
from .devices import on_main_process, world_size

SAMPLE_SEEDS = 1_000_000  # sample j of a PerSample model seeds its calls from seed + j·SAMPLE_SEEDS


@dataclass(frozen=True)
class PerSample:
    """A chat model for each sample: `make(j)` gives sample j's, made when that sample is rolled out (a teacher
    whose calls are seeded per sample, so the samples differ and each one can be made on its own)."""

    make: Callable[[int], Any]


def rollouts(config: RolloutConfig, llm: Any, out_dir: str | Path, role_llms: dict[str, Any] | None = None,
             force_new: bool = False, concurrency: int = 1) -> list[dict[str, Any]]:
    """Run the agent `config.samples` times over the questions with `llm` (a chat model or spec for every sample,
    or a `PerSample`), `concurrency` questions in flight, and return the eval records (each with its trace, em, f1
    and `sample`). Sample j is the resumable eval run `out_dir/sample{j}`, so an interrupted rollout continues where
    it stopped; RunMismatch if it holds a run with another model spec or settings. `force_new` starts every sample
    folder afresh."""
    from mhqa_graph.eval import run_eval

    model = getattr(llm, "_model", None)
    if model is not None:
        model.eval()
    folders = [Path(out_dir) / f"sample{j}" for j in range(config.samples)]
    settings = rollout_settings(config, role_llms)

    def run() -> None:
        for j, out in enumerate(folders):
            if isinstance(llm, PerSample) and not force_new and finished(config, settings, out):
                continue  # made earlier or restored: its model is not even loaded (a teacher's server not started)
            sample_llm = llm.make(j) if isinstance(llm, PerSample) else llm
            overrides = {**settings, "llm": sample_llm}
            run_eval(config.agent, config.dataset, config.path, sample_llm, config.store, out, limit=config.limit,
                     start=config.start, concurrency=concurrency, context_overrides=overrides, progress=False,
                     force_new=force_new)
            check_policy_faults([sample_llm, *(role_llms or {}).values()], out)

    on_main_process(run)  # under several processes the main one rolls out, the others read its records
    return [r | {"sample": j} for j, out in enumerate(folders) for r in read_records(out / RESULTS)]


def question_ids(rollout: RolloutConfig) -> list[str]:
    """The ids of `rollout`'s questions, in order."""
    from mhqa_graph.eval.runner import load_questions

    return [q.id for q in load_questions(rollout.dataset, rollout.path, rollout.limit, rollout.start)]


def rollout_settings(config: RolloutConfig, role_llms: dict[str, Any] | None = None) -> dict[str, Any]:
    """The agent settings `rollouts` gives every sample besides its model (`config.context`, the token budget and
    the role models)."""
    roles = {"role_llms": role_llms} if role_llms else {}
    return {**config.context, "max_new_tokens": config.max_new_tokens, **roles}


def rollout_manifest(config: RolloutConfig, settings: dict[str, Any]) -> dict[str, Any]:
    """The run.json of a sample of `config`'s rollouts with these `settings`, without its model's entry."""
    from mhqa_graph.eval.runner import run_manifest

    manifest = run_manifest(config.agent, config.dataset, config.path, "-",
                            {k: v for k, v in settings.items() if v is not None})
    return {k: v for k, v in manifest.items() if k != "llm"}


def _is_run(manifest: dict[str, Any], expected: dict[str, Any]) -> bool:
    return all(manifest.get(k) == v for k, v in expected.items())


def finished(config: RolloutConfig, settings: dict[str, Any], out: Path) -> bool:
    """Whether the run folder `out` is a run of `config` with these agent `settings` (its model aside) that holds a
    record of every question of the slice."""
    if not (out / MANIFEST).is_file() or not (out / RESULTS).is_file():
        return False
    if not _is_run(json.loads((out / MANIFEST).read_text(encoding="utf-8")), rollout_manifest(config, settings)):
        return False
    done = {r["id"] for r in read_records(out / RESULTS)}
    return all(i in done for i in question_ids(config))


def teacher_sampling(spec: str, rollout: RolloutConfig, seed: int) -> dict[str, Any]:
    """What a teacher's rollouts are made with: its spec, temperature and (when it samples) seed."""
    return {"teacher": spec, "temperature": rollout.temperature, **({"seed": seed} if rollout.temperature > 0 else {})}


def teacher_folder(spec: str, rollout: RolloutConfig, seed: int) -> str:
    """The folder name of a teacher's rollouts: its spec made path-safe (cut short) and a hash of the whole spec,
    the sampling temperature and the seed, so two teachers, or one sampled otherwise, never share a folder."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", spec)[:40].strip("-.")
    made_with = teacher_sampling(spec, rollout, seed)
    key = "\n".join([spec, *(f"{k}={v}" for k, v in made_with.items() if k != "teacher")])
    return f"teacher-{slug}-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:10]}"


def teacher_models(spec: str, rollout: RolloutConfig, seed: int) -> PerSample:
    """A teacher's chat models, sampling as the policy's rollouts do: at `rollout.temperature`, sample j's call n
    seeded with seed + j·SAMPLE_SEEDS + n (greedy and unseeded at temperature 0)."""
    from mhqa_graph.models.factory import load_chat_model

    def make(j: int) -> Any:
        return load_chat_model(spec, temperature=rollout.temperature, max_new_tokens=rollout.max_new_tokens,
                               seed=seed + j * SAMPLE_SEEDS if rollout.temperature > 0 else None)

    return PerSample(make)


def teacher_rollouts(config: RolloutConfig, teacher: str, seed: int, out_dir: Path, committed: Path | None,
                     concurrency: int = 1, force_new: bool = False) -> list[dict[str, Any]]:
    """`rollouts` of a teacher (`teacher_models`) into `out_dir/teacher_folder(...)`. With `committed` (a run's
    `dev.records`), they are first read back from `committed/<that folder>` where this machine has fewer
    (`restore_rollouts`), and published there when done, so a run resumed elsewhere does not make them again."""
    folder = out_dir / teacher_folder(teacher, config, seed)
    shared = committed / folder.name if committed else None
    if shared and not force_new:
        on_main_process(lambda: restore_rollouts(shared, folder, config))
    records = rollouts(config, teacher_models(teacher, config, seed), folder, concurrency=concurrency,
                       force_new=force_new)
    if shared:
        on_main_process(lambda: publish_rollouts(folder, shared, config, teacher_sampling(teacher, config, seed)))
    return records


MADE_WITH = "made_with.json"  # beside published rollouts: the model and sampling they were made with


def read_json(path: Path) -> Any:
    """The JSON value in `path`, None where there is no such file."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def publish_rollouts(folder: Path, committed: Path, config: RolloutConfig, made_with: dict[str, Any]) -> None:
    """Each of `config`'s sample runs in `folder` as files to commit in `committed`: `sample<j>.jsonl.gz`, its
    records in full (the SFT reads their traces) sorted by id and gzip'd without a timestamp, and
    `sample<j>.run.json`, what it is a run of; `made_with.json` names the model (a run.json names its class only).
    A run on another machine reads them back with `restore_rollouts`."""
    samples = [folder / f"sample{j}" for j in range(config.samples)]
    made = [s for s in samples if (s / RESULTS).is_file() and (s / MANIFEST).is_file()]
    for sample in made:
        compact_records.write(committed / f"{sample.name}{compact_records.SUFFIX}", read_records(sample / RESULTS))
        shutil.copyfile(sample / MANIFEST, committed / f"{sample.name}.{MANIFEST}")
    if made:
        (committed / MADE_WITH).write_text(json.dumps(made_with, indent=2) + "\n", encoding="utf-8")


def restore_rollouts(committed: Path, folder: Path, config: RolloutConfig) -> None:
    """The sample runs `publish_rollouts` wrote to `committed`, merged into `folder` where they add questions (to
    none, or to a run stopped earlier; a question this machine answered keeps its answer), so that a run on another
    machine resumes from them. Only runs of `config` are read back: the same agent, dataset, settings and questions
    file (by its bytes; another place is fine), and a local run of other settings is left as it is."""
    expected = rollout_manifest(config, rollout_settings(config))
    for j in range(config.samples):
        name, target = f"sample{j}", folder / f"sample{j}"
        file, manifest_file = committed / f"{name}{compact_records.SUFFIX}", committed / f"{name}.{MANIFEST}"
        if not (file.is_file() and manifest_file.is_file()):
            continue
        manifest = json.loads(manifest_file.read_text(encoding="utf-8")) | {"file": expected["file"]}
        local = read_json(target / MANIFEST)
        if not _is_run(manifest, expected) or (local and not _is_run(local, expected)):
            continue  # another run's: this one makes its own (and publishes them over these)
        records = read_records(target / RESULTS) if (target / RESULTS).is_file() else []
        merged = {r["id"]: r for r in compact_records.load(file)} | {r["id"]: r for r in records}
        if len(merged) == len(records):
            continue
        target.mkdir(parents=True, exist_ok=True)
        (target / MANIFEST).write_text(json.dumps(manifest, ensure_ascii=False, indent=2), encoding="utf-8")
        tmp = target / f"{RESULTS}.tmp"
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in merged.values()), encoding="utf-8")
        os.replace(tmp, target / RESULTS)


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
