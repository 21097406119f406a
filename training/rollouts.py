"""Rollouts: the agent graphs run over a slice of questions with the policy as their model, records written as
`mhqa eval` writes them; a device fault stops training instead of being scored 0."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mhqa_graph.errors import TrainingError
from mhqa_graph.eval.report import RESULTS, read_records

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

    def run() -> None:
        for j, out in enumerate(folders):
            sample_llm = llm.make(j) if isinstance(llm, PerSample) else llm
            overrides = {**config.context, "llm": sample_llm, "max_new_tokens": config.max_new_tokens,
                         **({"role_llms": role_llms} if role_llms else {})}
            run_eval(config.agent, config.dataset, config.path, sample_llm, config.store, out, limit=config.limit,
                     start=config.start, concurrency=concurrency, context_overrides=overrides, progress=False,
                     force_new=force_new)
            check_policy_faults([sample_llm, *(role_llms or {}).values()], out)

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
