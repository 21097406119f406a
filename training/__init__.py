"""Trainers, installed as `mhqa_graph.training`: MyGO (Mujica), MAPGRPO (OPERA) and Omne's three stages.

    from mhqa_graph.training import train
    summary = train("mygo", "configs/train/mygo.yaml")      # what `mhqa train mygo --config ...` runs
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from mhqa_graph.errors import InvalidInput, ModelNotInstalled

# method -> (module, config class, trainer class)
TRAINERS: dict[str, tuple[str, str, str]] = {
    "mygo": ("mygo", "MyGOConfig", "MyGOTrainer"),
    "mapgrpo": ("mapgrpo", "MAPGRPOConfig", "MAPGRPOTrainer"),
    "omne": ("omne", "OmneConfig", "OmneTrainer"),
}


def train(method: str, config_path: str | Path, output_dir: str | None = None,
          teacher: str | None = None) -> dict[str, Any]:
    """Run `method` with the YAML config at `config_path` (optionally writing to `output_dir`). `teacher` is a
    model spec whose trajectories warm the policy up: for Omne they make the SFT data and stage 1 warm-starts on
    them; for MyGO they make the warm-up before iteration 1."""
    if teacher is not None and method not in ("omne", "mygo"):
        raise InvalidInput(f"a teacher is an Omne or MyGO setting; {method} has none")
    if method not in TRAINERS:
        raise InvalidInput(f"unknown training method {method!r}; choose one of {', '.join(TRAINERS)}")
    name, config_cls, trainer_cls = TRAINERS[method]
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ImportError as exc:
        raise ModelNotInstalled(f"training needs the train extra ({exc}); pip install 'mhqa-graph[train]'") from None
    from .configs import load_config

    config = load_config(getattr(module, config_cls), config_path)
    if output_dir:
        config.output_dir = output_dir
    if teacher is not None and method == "omne":
        config.teacher, config.warm_start = teacher, True
    elif teacher is not None:
        config.warmup_teacher, config.warmup_run = teacher, None
    return getattr(module, trainer_cls)(config).train()
