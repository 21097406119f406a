"""A trainer's `log.jsonl` as a PNG: dev metrics after each phase, their change against the untrained policy,
and the per-step training metrics.

    plot_log("runs/learn/mygo-pq2h/log.jsonl", "runs/learn/mygo-pq2h/curve.png")

Left: dev F1 and EM (%) and the behaviour rates (well-formed runs, Omne's tool-call and successful-call rates,
Mujica's worker rate, "unknown" answers) for each dev line (`untrained`, `iter1`, `stage2`, `plan`, ...).
Middle: each trained line's ΔF1 against the untrained policy on the same questions, with its 95% paired-bootstrap
interval, the questions better / worse and the sign test's p. Right: the per-step metrics that say whether a
phase learnt (`loss`, `reward`, `rewards/*/mean`, `episodes/format`), one line per phase, and MAPGRPO's role
reward on held-back prompts (`held-back ...`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .logs import read_log

STEP_METRICS = ("loss", "reward", "episodes/format", "episodes/result")  # plus every rewards/<name>/mean
HELD_BACK = "eval_"  # TRL's prefix of the metrics of an evaluation on held-back prompts
DEV_LINES = (("dev_f1", "dev F1"), ("dev_em", "dev EM"), ("dev_well_formed", "well-formed"),
             ("dev_tool_rate", "tool-call rate"), ("dev_acted_rate", "successful-call rate"),
             ("dev_worker_rate", "worker rate"), ("dev_unknown_rate", '"unknown" answers'))


def dev_points(entries: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(phase, metrics) of every dev evaluation in the order of first appearance; a later line for the same
    phase (a resumed run's) replaces the metrics. `dev_unknown_rate` is added: "unknown" answers per question."""
    points: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if "dev_f1" not in entry:
            continue
        phase = entry.get("after") or (f"iter{entry['iteration']}" if "iteration" in entry else "dev")
        unknown = entry.get("dev_unknown")
        points[phase] = entry | ({"dev_unknown_rate": unknown / entry["dev_questions"]}
                                 if unknown is not None and entry.get("dev_questions") else {})
    return list(points.items())


def step_series(entries: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """'<phase> <metric>' -> [(step, value)] of the per-step training metrics, by step; those of an evaluation on
    held-back prompts are '<phase> held-back <metric>'. A later entry for the same step (a phase that a resumed
    run did again) replaces the earlier."""
    series: dict[str, dict[int, float]] = {}
    for entry in entries:
        if "step" not in entry or "event" in entry:
            continue
        phase = entry.get("role") or entry.get("phase") or (f"stage{entry['stage']}" if "stage" in entry else "")
        for key, value in entry.items():
            metric = key.removeprefix(HELD_BACK)
            held = metric != key
            wanted = metric in STEP_METRICS or (metric.startswith("rewards/") and metric.endswith("/mean"))
            if wanted and isinstance(value, (int, float)) and not (held and metric == "loss"):
                name = f"{phase} held-back {metric}" if held else f"{phase} {key}"
                series.setdefault(name.strip(), {})[entry["step"]] = float(value)
    return {name: sorted(points.items()) for name, points in series.items()}


def plot_delta(ax: Any, points: list[tuple[str, dict[str, Any]]]) -> None:
    """ΔF1 against the untrained policy with its interval, per dev line compared with it."""
    compared = [(p, m) for p, m in points if m.get("dev_df1") is not None]
    if not compared:
        return
    for x, (_, m) in enumerate(compared):
        low, high = m.get("dev_df1_low"), m.get("dev_df1_high")
        below, above = (m["dev_df1"] - low, high - m["dev_df1"]) if low is not None and high is not None else (0, 0)
        ax.errorbar([x], [m["dev_df1"]], yerr=[[below], [above]], fmt="o", capsize=4, color="tab:blue")
        ax.annotate(f"{m['dev_df1']:+.1f}\n{m.get('dev_better', 0)}↑ {m.get('dev_worse', 0)}↓ "
                    f"p={m.get('dev_sign_p', 1.0):.2g}", (x, m["dev_df1"]), textcoords="offset points",
                    xytext=(8, 0), fontsize="small", va="center")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(compared)), [p for p, _ in compared])
    ax.set_xlim(-0.5, len(compared) - 0.3)
    ax.set_ylabel("ΔF1 (points)")
    ax.set_title(f"dev ΔF1 vs untrained [95% CI], {compared[-1][1].get('dev_paired', '?')} questions")


def plot_log(log: str | Path, out: str | Path, title: str = "") -> Path:
    """Write the PNG of `log` (see the module docstring) to `out`."""
    from mhqa_graph.plots import pyplot, save_png

    entries = read_log(log)
    series = step_series(entries)
    points = dev_points(entries)
    has_delta = any(m.get("dev_df1") is not None for _, m in points)
    panels = 1 + has_delta + bool(series)
    fig, axes = pyplot().subplots(1, panels, figsize=(6 * panels, 4.5), squeeze=False)
    dev_ax = axes[0][0]
    phases = [p for p, _ in points]
    for key, label in DEV_LINES:
        values = [m.get(key) for _, m in points]
        if any(v for v in values if v is not None):
            dev_ax.plot(phases, [100 * (v or 0.0) for v in values], marker="o", label=label)
    dev_ax.set_ylim(0, 100)
    dev_ax.set_ylabel("%")
    dev_ax.set_title("dev slice after each phase")
    if points:
        dev_ax.legend(fontsize="small")
    if has_delta:
        plot_delta(axes[0][1], points)
    if series:
        step_ax = axes[0][panels - 1]
        for name, values in series.items():
            step_ax.plot([s for s, _ in values], [v for _, v in values], marker=".", label=name,
                         linestyle="--" if " held-back " in name else "-")
        step_ax.set_xlabel("step")
        step_ax.set_title("training metrics per step")
        step_ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return save_png(fig, out)
