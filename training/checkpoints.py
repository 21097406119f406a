"""Checkpoints: the weights and state of a finished stage, and TRL's step checkpoints, so that a stopped run resumes
where it stopped (`train_resuming`)."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mhqa_graph.errors import CheckpointError, shown
from mhqa_graph.paths import read_json_object

from .devices import is_main_process, on_main_process
from .logs import LOG, copy_log, write_log

CHECKPOINT, STATE = "checkpoint", "state.json"
PUBLISHED = "checkpoint"  # in a run's records folder: its newest stage checkpoint, `<stage>/` inside
StateTypes = dict[str, type | tuple[type, ...]]  # a state's keys and the types their values must have


def save_weights(model: Any, path: Path, **kwargs: Any) -> None:
    """`model.save_pretrained(path, **kwargs)` without the blank model card PEFT writes beside an adapter, so that a
    folder to commit holds the weights and their config only."""
    model.save_pretrained(path, **kwargs)
    (path / "README.md").unlink(missing_ok=True)


def save_checkpoint(model: Any, folder: Path, state: dict[str, Any]) -> None:
    """The weights (or LoRA adapter) and `state` in `folder/checkpoint`, by the main process: where a rerun
    resumes."""
    path = folder / CHECKPOINT

    def save() -> None:
        save_weights(model, path)
        (path / STATE).write_text(json.dumps(state), encoding="utf-8")

    on_main_process(save)


def saved_checkpoints(out: Path, pattern: str, types: StateTypes | None = None) -> list[tuple[dict[str, Any], Path]]:
    """(state, checkpoint folder) of every checkpoint under `out` whose folder matches `pattern` (a glob), each state
    checked against `types` (`read_state`)."""
    return [(read_state(p, types), p.parent) for p in out.glob(f"{pattern}/{CHECKPOINT}/{STATE}")]


def read_state(path: Path, types: StateTypes | None = None) -> dict[str, Any]:
    """The state.json at `path`; CheckpointError when it is a symbolic link, not a JSON object, or holds a key of
    `types` missing or of another type (a bool is no int, a number must be finite)."""
    refuse_links(path)
    state = read_json_object(path, "a checkpoint's state", CheckpointError,
                             "remove its checkpoint, and its stage is trained again")
    for key, kind in (types or {}).items():
        kinds, value = kind if isinstance(kind, tuple) else (kind,), state.get(key)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds) \
                or (isinstance(value, float) and not math.isfinite(value)):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise CheckpointError(f"{path}: {key} must be {names}, got {shown(value)}; remove its checkpoint, and its "
                                  "stage is trained again")
    return state


def refuse_links(path: Path) -> None:
    """CheckpointError naming the first symbolic link at or under `path`: a checkpoint's files are copied and loaded,
    never followed out of it (a committed link could point anywhere on the machine that restores it)."""
    found = [path] if path.is_symlink() else [Path(root) / name for root, dirs, files in os.walk(path)
                                                for name in (*dirs, *files) if (Path(root) / name).is_symlink()]
    if found:
        raise CheckpointError(f"{found[0]} is a symbolic link; a checkpoint's files are not followed out of it: "
                              "remove the link")


def publish_checkpoint(folder: Path, records: str | None) -> None:
    """The LoRA checkpoint `save_checkpoint` wrote in `folder`, with the log so far, copied to the run's records
    folder (`dev.records`) as `checkpoint/<folder name>/`, replacing an older stage's (the new one is complete before
    the old one goes): files to commit, from which a run on another machine resumes (`restore_checkpoint`). Full
    weights are too large to commit and are not published."""
    if not records:
        return

    def publish() -> None:
        source, target = folder / CHECKPOINT, Path(records) / PUBLISHED
        if not (source / "adapter_config.json").is_file():
            return
        staged = target.with_name(target.name + ".tmp")
        shutil.rmtree(staged, ignore_errors=True)
        shutil.copytree(source, staged / folder.name)
        shutil.rmtree(target, ignore_errors=True)
        staged.rename(target)
        copy_log(folder.parent, records)

    on_main_process(publish)


def restore_checkpoint(records: str | None, out: Path) -> None:
    """The checkpoint `publish_checkpoint` committed in `records`, copied (by the main process) to
    `out/<stage>/checkpoint` where this machine has none of that stage, with the committed log where the local one is
    missing or an earlier part of it (a local log that is not is kept, with a warning), so that a run stopped on
    another machine resumes after the stage it committed. CheckpointError for a symbolic link among the committed
    files."""
    if not records:
        return

    def restore() -> None:
        log, local = Path(records) / LOG, out / LOG
        for path in (Path(records) / PUBLISHED, log):
            refuse_links(path)
        for state in sorted(Path(records).glob(f"{PUBLISHED}/*/{STATE}")):
            source, target = state.parent, out / state.parent.name / CHECKPOINT
            if target.exists():
                continue
            shutil.copytree(source, target, symlinks=True)  # none: a link put there since is copied, not followed
            if log.is_file() and (not local.is_file() or log.read_bytes().startswith(local.read_bytes())):
                shutil.copyfile(log, local)
            elif log.is_file():
                import warnings

                message = f"{local} is not the start of the committed {log}: kept, and published over it later"
                warnings.warn(message, stacklevel=2)
                write_log(local, {"event": "log_kept", "message": message})
            write_log(local, {"event": "restored", "checkpoint": str(source)})

    on_main_process(restore)


def load_checkpoint(model: Any, path: Path) -> None:
    """Load the weights `save_checkpoint` saved in the checkpoint folder `path` into `model`: each of its LoRA
    adapters (PEFT's layout: "default" at the root, another in a folder of its name), or the whole model."""
    from safetensors.torch import load_file

    if hasattr(model, "peft_config"):
        from peft import set_peft_model_state_dict

        for name in model.peft_config:
            folder = path if name == "default" else path / name
            set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")), adapter_name=name)
    else:
        model.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)


STEP_SAVES = {"save_strategy": "steps", "save_steps": 1, "save_total_limit": 1}  # TRL arguments: a step
# checkpoint after every step, the newest kept, so that `train_resuming` resumes a stopped stage at its last step


def train_resuming(trainer: Any, state: dict[str, Any], log: Path, first: Callable[[], Any] | None = None) -> Any:
    """`trainer.train()` (its TrainOutput), resumed from the newest step checkpoint (`checkpoint-<step>`, saved
    by the TRL arguments' `save_steps`) in its output_dir that a run of the same `state` (stage, order,
    arguments) left there when it was stopped; a step checkpoint of another state is removed with a warning.
    `first` runs before a stage that starts afresh only. Each step checkpoint gets `state` beside it; they are
    all removed once the stage has trained to its end. A resumed stage's `training_loss` is the mean loss of all its
    logged steps (the checkpoint's log history and the steps since), as in a run that was never stopped."""
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
    if last:  # a resumed train() reports the loss of its own steps; the stage's is that of every logged step
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        result = result._replace(training_loss=sum(losses) / len(losses)) if losses else result
    return result


def _step_state(checkpoint: Path) -> dict[str, Any] | None:
    try:
        return json.loads((checkpoint / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _remove_step_checkpoints(folder: Path) -> None:
    for path in folder.glob("checkpoint-*"):
        shutil.rmtree(path, ignore_errors=True)
