"""The trainers' configs: the model to train (`ModelConfig`), the rollouts (`RolloutConfig`) and the dev slice
(`DevConfig`), each read from YAML with its unknown keys refused (`load_config`)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mhqa_graph.errors import InvalidInput

from .serving import check_rollout_llm

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
    guards_off: bool = False  # also run the untrained and the trained policy with guards "none" (every question
    # asked): the 2x2 of untrained/trained x guards on/off. Does training teach what the guards patch?
    records: str = ""  # a folder to commit (docs/runs/<run>): each dev run's compact per-question records as
    # <name>.jsonl.gz (mhqa_graph.eval.records; an untrained run's with its key, <name>.key.json, read back on a
    # machine without the runs/ cache), the trainer's log.jsonl and the policy's settings and seed (model.json);
    # `python training/runs.py <folder>` tables them
    llm_cache: str | None = None  # a call cache file (SQLite, `mhqa eval --llm-cache`) that every dev run reads and
    # fills: their calls are greedy, so committed beside the records it lets a dev run stopped on one machine replay
    # its finished calls on another instead of asking the model again; it changes no answer and no key


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
