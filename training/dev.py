"""The dev slice: greedy runs of the policy on held-out questions, before training (kept in a cache keyed by what
it depends on) and after each iteration, role or stage, each compared with the untrained run question by question
(`dev_metrics`), and published as records to commit (`DevConfig.records`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mhqa_graph import paths
from mhqa_graph.errors import DevSliceError
from mhqa_graph.eval.diagnostics import chain_json
from mhqa_graph.eval.health import behaviour
from mhqa_graph.eval.paired import cluster_key, paired_comparison
from mhqa_graph.eval.records import SUFFIX
from mhqa_graph.eval.report import RESULTS, read_records
from mhqa_graph.ingest.datasets import QAItem
from mhqa_graph.paths import expand_user_path

from .checkpoints import save_weights
from .configs import DevConfig, ModelConfig, RolloutConfig
from .devices import on_main_process
from .logs import copy_log
from .policy import policy_chat_model, policy_identity, serves_with_llamacpp
from .rollouts import question_ids, rollouts

UNTRAINED = "untrained"  # the dev run of the policy before training


GUARDS_OFF = "final_guards_none"  # the dev run of the trained policy with guards "none" (`dev.guards_off`)
UNTRAINED_GUARDS_OFF = "untrained_guards_none"  # the untrained policy with guards "none": the 2x2's fourth cell
GUARDS_NONE = (UNTRAINED_GUARDS_OFF, GUARDS_OFF)  # the dev runs asked with guards "none", every question asked
KEY_SUFFIX = ".key.json"  # beside an untrained run's published records: the key they were made under


def dev_rollout(rollout: RolloutConfig, dev: DevConfig) -> RolloutConfig:
    """The rollout settings of the dev evaluation: the dev slice, one greedy sample per question."""
    return dataclasses.replace(rollout, path=dev.path, start=dev.start, limit=dev.limit, samples=1, temperature=0.0)


def with_llm_cache(run: RolloutConfig, dev: DevConfig) -> RolloutConfig:
    """`run` with `dev.llm_cache` among its agent settings: the eval runs read and fill it, and the run folders
    and keys do not count it (a cache changes no answer)."""
    return dataclasses.replace(run, context={**run.context, "llm_cache": dev.llm_cache}) if dev.llm_cache else run


def check_disjoint(rollout: RolloutConfig, dev: DevConfig) -> None:
    """DevSliceError (an InvalidInput) when the dev slice holds fewer than `dev.min_questions` questions, or
    shares a question (by id, text or gold path: `shared_questions`) with the training slice."""
    from mhqa_graph.eval.runner import load_questions

    if not dev.path:
        return
    held = load_questions(rollout.dataset, dev.path, dev.limit, dev.start)
    if len(held) < dev.min_questions:
        raise DevSliceError(f"the dev slice ({dev.path} from #{dev.start}) holds {len(held)} question(s); at least "
                            f"{dev.min_questions} are needed for a dev F1 whose interval says something "
                            "(dev.limit, or dev.min_questions for a test)")
    train = load_questions(rollout.dataset, rollout.path, rollout.limit, rollout.start)
    if shared := shared_questions(held, train):
        raise DevSliceError(f"the training slice ({rollout.path} from #{rollout.start}) and the dev slice ({dev.path} "
                            f"from #{dev.start}) share {len(shared)} question(s) by id, text or gold path, "
                            f"e.g. {shared[0]!r}")


def shared_questions(held: list[QAItem], other: list[QAItem]) -> list[str]:
    """The ids of `other`'s questions that are also in `held`: by id, by text (case and spacing aside) or by gold
    path (the chain `load_questions` reads, keyed as the bootstrap clusters it: `eval.paired.cluster_key`), so a
    paraphrase of a held question counts (PathQuestion asks each path in about three)."""
    def norm(text: str) -> str:
        return " ".join(text.lower().split())

    def path(q: QAItem) -> str:
        return cluster_key({"id": q.id, "chain": chain_json(q.chain)})

    ids, texts, chains = {q.id for q in held}, {norm(q.question) for q in held}, {path(q) for q in held}
    return [q.id for q in other if q.id in ids or norm(q.question) in texts or path(q) in chains]


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


def untrained_key(rollout: RolloutConfig, dev: DevConfig, config: ModelConfig, model: Any) -> dict[str, Any]:
    """What the untrained policy's dev run depends on: the policy (`policy_identity`) and who serves it, the
    agent, the dev file (path and content hash: a copy or a touch keeps the key) and store, the question slice,
    the decoding settings and agent settings, and the guards the agent runs."""
    from mhqa_graph.graphs.guards import selected

    run = dev_rollout(rollout, dev)
    data = expand_user_path(run.path).resolve()
    return {"policy": policy_identity(config),
            "backend": ("llamacpp" if serves_with_llamacpp(model, config) else "transformers")
            if config.rollout_llm == "in_process" else config.rollout_llm.partition("?")[0],  # server | openai:...
            "agent": run.agent, "dataset": run.dataset, "file": str(data),
            "file_sha256": paths.file_sha256(data) if data.is_file() else None, "store": run.store,
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


def finished_records(rollout: RolloutConfig, folder: Path) -> list[dict[str, Any]] | None:
    """The records of `rollout`'s questions in the one-sample run `folder`, None unless every question has one."""
    return _every_question(rollout, read_records(folder / "sample0" / RESULTS))


def committed_records(rollout: RolloutConfig, dev: DevConfig, name: str,
                      key: dict[str, Any]) -> tuple[list[dict[str, Any]], Path] | None:
    """(records, file) of the untrained run `name` that a run on another machine committed, in `dev.records` or in
    another run's records folder beside it (`docs/runs/<run>/`), if their key (`<name>.key.json`, the checkout's
    own path left out) is `key` and they answer every question."""
    if not dev.records:
        return None
    from mhqa_graph.eval.records import load

    own = Path(dev.records)
    for key_file in (own / f"{name}{KEY_SUFFIX}", *sorted(own.parent.glob(f"*/{name}{KEY_SUFFIX}"))):
        if key_file.is_file() and _portable(json.loads(key_file.read_text(encoding="utf-8"))) == _portable(key):
            file = key_file.parent / f"{name}{SUFFIX}"
            if (records := _every_question(rollout, load(file))) is not None:
                return records, file
    return None


def _copy_records(source: Path, target: Path, name: str) -> None:
    """Run `name`'s committed records and key, from one run's records folder into another's."""
    target.mkdir(parents=True, exist_ok=True)
    for end in (SUFFIX, KEY_SUFFIX):
        shutil.copyfile(source / f"{name}{end}", target / f"{name}{end}")


def _portable(key: dict[str, Any]) -> dict[str, Any]:
    """An untrained key as JSON, without the dev file's absolute path (its content hash stays)."""
    return {k: v for k, v in json.loads(json.dumps(key, default=str)).items() if k != "file"}


def _every_question(rollout: RolloutConfig, found: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    wanted, records = question_ids(rollout), {r["id"]: r for r in found}
    return [records[i] | {"sample": 0} for i in wanted] if all(i in records for i in wanted) else None


Llms = Callable[[Path], tuple[Any, dict[str, Any] | None]]  # a run folder -> (llm, role_llms) of the policy


def dev_run(rollout: RolloutConfig, dev: DevConfig, config: ModelConfig, model: Any, output_dir: str | Path,
            name: str, llms: Llms) -> dict[str, Any]:
    """`dev_metrics` of a greedy run over the dev slice, the policy served by `llms(folder)`; {} without a dev
    slice. The untrained runs (`UNTRAINED`, `UNTRAINED_GUARDS_OFF`) are kept in `untrained_folder`: a finished
    one is read back without asking the model (or, where this machine has none, the compact records a run of the
    same key committed in `dev.records` or in another run's records folder beside it, copied into `dev.records`),
    an interrupted one resumes, and another key (policy, slice, settings, guards) gets a folder of its own; their
    metrics carry `dev_run` (where they were read) and `dev_reused`.
    Every other `name` is a resumable run in `output_dir/dev/<name>`. The runs in `GUARDS_NONE` run with guards
    "none" and ask every question. Each run is compared with the untrained run with guards on, when there is
    one."""
    if not dev.path:
        return {}
    key = untrained_key(rollout, dev, config, model)
    base_folder, base_key, base_run = untrained_folder(key, dev, output_dir), key, dev_rollout(rollout, dev)
    if name in GUARDS_NONE:
        rollout = dataclasses.replace(rollout, context={**rollout.context, "guards": "none"})
        key = untrained_key(rollout, dev, config, model)
    run = with_llm_cache(dev_rollout(rollout, dev), dev)

    def untrained_records() -> list[dict[str, Any]] | None:  # the untrained run with guards on, to compare with
        if (records := finished_records(base_run, base_folder)) is not None:
            return records
        found = committed_records(base_run, dev, UNTRAINED, base_key)
        return found[0] if found else None

    if name in (UNTRAINED, UNTRAINED_GUARDS_OFF):
        cached = untrained_folder(key, dev, output_dir)
        records = finished_records(run, cached)
        source, reused = str(cached), records is not None
        if records is None and (found := committed_records(run, dev, name, key)) is not None:
            records, committed = found
            source, reused = str(committed), True
            if committed.parent != Path(dev.records):  # another run's: this run's folder gets them too
                on_main_process(lambda: _copy_records(committed.parent, Path(dev.records), name))
        else:
            if records is None:
                on_main_process(lambda: (cached.mkdir(parents=True, exist_ok=True), (cached / "key.json").write_text(
                    json.dumps(key, indent=2), encoding="utf-8")))
                llm, roles = llms(cached)
                records = rollouts(run, llm, cached, roles, concurrency=config.rollout_concurrency)
            on_main_process(lambda: publish(dev, name, cached, output_dir, config, key))
        against = untrained_records() if name == UNTRAINED_GUARDS_OFF else None
        return dev_metrics(records, against) | {"dev_run": source, "dev_reused": reused}
    folder = Path(output_dir) / "dev" / name
    llm, roles = llms(folder)
    records = rollouts(run, llm, folder, roles, concurrency=config.rollout_concurrency)
    on_main_process(lambda: publish(dev, name, folder, output_dir, config))
    return dev_metrics(records, untrained_records())


def publish(dev: DevConfig, name: str, folder: Path, output_dir: str | Path, config: ModelConfig,
            key: dict[str, Any] | None = None) -> None:
    """With `dev.records`, the dev run `name` (its records in `folder`) as files to commit there: its compact
    per-question records, the log so far and the policy's settings, seed included; for an untrained run also its
    `key`, under which a run on another machine reads the records back instead of asking the model again."""
    if not dev.records:
        return
    from mhqa_graph.eval.records import save

    out = Path(dev.records)
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{name}{SUFFIX}"
    target.unlink(missing_ok=True)  # this run's records only, not a merge with an earlier run's
    save(folder / "sample0", target)
    if key is not None:
        (out / f"{name}{KEY_SUFFIX}").write_text(json.dumps(key, indent=2, sort_keys=True, default=str) + "\n",
                                                encoding="utf-8")
    copy_log(output_dir, out)
    if dev.llm_cache:  # the replies in the file itself, ready to commit
        from mhqa_graph.models.call_cache import call_cache

        call_cache(dev.llm_cache).checkpoint()
    (out / "model.json").write_text(json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True) + "\n",
                                    encoding="utf-8")


def policy_dev(rollout: RolloutConfig, dev: DevConfig, model: Any, tokenizer: Any, output_dir: str | Path, name: str,
               config: ModelConfig) -> dict[str, Any]:
    """`dev_run` of an in-memory policy, served greedily as `policy_chat_model` does."""
    return dev_run(rollout, dev, config, model, output_dir, name, lambda folder: (
        policy_chat_model(model, tokenizer, config, folder, 0.0, rollout.max_new_tokens), None))


def untrained_runs(dev: DevConfig, run: Callable[[str], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The dev runs of the policy before training, made by `run(name)`: `UNTRAINED`, and with `dev.guards_off` also
    `UNTRAINED_GUARDS_OFF`, so that the 2x2 (untrained/trained x guards on/off) has every cell asked."""
    names = (UNTRAINED, UNTRAINED_GUARDS_OFF) if dev.guards_off else (UNTRAINED,)
    return {name: run(name) for name in names}


def publish_final(dev: DevConfig, model: Any, output_dir: str | Path, adapters: list[str] | None = None) -> None:
    """With `dev.records`, what a finished run adds there for others to evaluate or continue: its LoRA adapter
    (`adapter/`, small; full weights are not copied), or only the named `adapters` of several (MAPGRPO's trained
    roles: an untrained role's adapter is the base model's), and the log to its end."""
    if not dev.records:
        return
    out = Path(dev.records)

    def write() -> None:
        out.mkdir(parents=True, exist_ok=True)
        if getattr(model, "peft_config", None):
            save_weights(model, out / "adapter", **({"selected_adapters": adapters} if adapters else {}))
        copy_log(output_dir, out)

    on_main_process(write)
