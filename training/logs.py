"""Every trainer's JSON-lines log (`log.jsonl` in its output_dir) and the curve drawn from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .devices import is_main_process, on_main_process

LOG = "log.jsonl"  # every trainer's JSON-lines log in its output_dir; curve.png beside it plots it


def plot_curve(out_dir: str | Path, title: str) -> str:
    """`out_dir/curve.png` of `out_dir/log.jsonl`, drawn by the main process; returns its path."""
    from .curve import plot_log

    out_dir = Path(out_dir)
    return str(on_main_process(lambda: plot_log(out_dir / LOG, out_dir / "curve.png", title), share=True))


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a trainer's log.jsonl ([] without one); a line cut short by a stopped run is left out (a
    resumed run appends after it)."""
    path = Path(path)
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


def write_log(path: Path, entry: dict[str, Any]) -> None:
    """Append `entry` as one JSON line to a trainer's log.jsonl (the main process's only)."""
    if not is_main_process():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, ensure_ascii=False, default=float) + "\n")


def copy_log(output_dir: str | Path, records: str | Path) -> None:
    """The trainer's log.jsonl in `output_dir`, as it stands, into the run's records folder `records` (by the
    caller's main process)."""
    import shutil

    if (log := Path(output_dir) / LOG).is_file():
        Path(records).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, Path(records) / LOG)


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
