"""A trainer's `log.jsonl` as a PNG: dev metrics after each phase, and the per-step training metrics.

    plot_log("runs/learn/mygo-pq2h/log.jsonl", "runs/learn/mygo-pq2h/curve.png")

Left: dev F1 and EM (%) and the share of questions where the agent acted (Omne's tool rate, Mujica's worker
rate) for each dev line (`untrained`, `iter1`, `stage2`, `plan`, ...). Right: the per-step metrics that
say whether a phase learnt (`loss`, `reward`, `rewards/*/mean`, `episodes/format`), one line per phase.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STEP_METRICS = ("loss", "reward", "episodes/format", "episodes/result")  # plus every rewards/<name>/mean


def read_log(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def dev_points(entries: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(phase, metrics) of every dev evaluation in the order of first appearance; a later line for the same
    phase (a resumed run's) replaces the metrics."""
    points: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if "dev_f1" not in entry:
            continue
        phase = entry.get("after") or (f"iter{entry['iteration']}" if "iteration" in entry else "dev")
        points[phase] = entry
    return list(points.items())


def step_series(entries: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """'<phase> <metric>' -> [(step, value)] of the per-step training metrics."""
    series: dict[str, list[tuple[int, float]]] = {}
    for entry in entries:
        if "step" not in entry or "event" in entry:
            continue
        phase = entry.get("role") or entry.get("phase") or (f"stage{entry['stage']}" if "stage" in entry else "")
        for key, value in entry.items():
            wanted = key in STEP_METRICS or (key.startswith("rewards/") and key.endswith("/mean"))
            if wanted and isinstance(value, (int, float)):
                series.setdefault(f"{phase} {key}".strip(), []).append((entry["step"], float(value)))
    return series


def plot_log(log: str | Path, out: str | Path, title: str = "") -> Path:
    """Write the PNG of `log` (see the module docstring) to `out`."""
    from mhqa_graph.plots import pyplot, save_png

    entries = read_log(log)
    series = step_series(entries)
    fig, axes = pyplot().subplots(1, 2 if series else 1, figsize=(12 if series else 6, 4.5), squeeze=False)
    dev_ax = axes[0][0]
    points = dev_points(entries)
    phases = [p for p, _ in points]
    for key, label in (("dev_f1", "dev F1"), ("dev_em", "dev EM"), ("dev_tool_rate", "tool-call rate"),
                       ("dev_worker_rate", "worker rate")):
        values = [m.get(key) for _, m in points]
        if any(v for v in values if v is not None):
            dev_ax.plot(phases, [100 * (v or 0.0) for v in values], marker="o", label=label)
    dev_ax.set_ylim(0, 100)
    dev_ax.set_ylabel("%")
    dev_ax.set_title("dev slice after each phase")
    if points:
        dev_ax.legend(fontsize="small")
    if series:
        step_ax = axes[0][1]
        for name, values in series.items():
            step_ax.plot([s for s, _ in values], [v for _, v in values], marker=".", label=name)
        step_ax.set_xlabel("step")
        step_ax.set_title("training metrics per step")
        step_ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return save_png(fig, out)
