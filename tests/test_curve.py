"""A trainer's log.jsonl read back as dev points and per-step series, and drawn."""

from __future__ import annotations

import json

from mhqa_graph.training.curve import dev_points, plot_log, step_series
from mhqa_graph.training.logs import read_log

LOG = [
    {"event": "dev", "after": "untrained", "dev_f1": 0.2, "dev_em": 0.1, "dev_tool_rate": 0.5},
    {"stage": 2, "step": 1, "loss": 1.5, "learning_rate": 1e-4},
    {"stage": 2, "step": 2, "loss": 1.1},
    {"stage": 2, "step": 1, "loss": 1.4},  # a resumed run did the phase again: its step replaces the first
    {"event": "dev", "after": "stage2", "dev_f1": 0.3, "dev_em": 0.2, "dev_tool_rate": 0.9},
    {"stage": 3, "step": 1, "reward": 0.4, "episodes/format": 0.5, "rewards/omne/mean": 0.4},
    {"role": "plan", "step": 1, "rewards/plan/mean": 0.7, "rewards/plan/std": 0.1},
    {"phase": "iter1", "step": 1, "loss": 0.8},
    {"iteration": 1, "tau": 0.3, "loss": 0.9, "dev_f1": 0.35, "dev_em": 0.3},
    {"event": "dev", "after": "untrained", "dev_f1": 0.25, "dev_em": 0.1},  # a rerun's line wins
]


def test_dev_points_and_step_series(tmp_path):
    path = tmp_path / "log.jsonl"
    lines = [json.dumps(e) for e in LOG]
    lines.insert(3, lines[3][:20])  # a line cut short by a stopped run, the resumed run's lines after it
    path.write_text("\n".join(lines) + "\n")
    entries = read_log(path)
    assert entries == LOG and read_log(tmp_path / "none.jsonl") == []
    assert [(p, m["dev_f1"]) for p, m in dev_points(entries)] == [("untrained", 0.25), ("stage2", 0.3),
                                                                  ("iter1", 0.35)]
    series = step_series(entries)
    assert series == {"stage2 loss": [(1, 1.4), (2, 1.1)], "stage3 reward": [(1, 0.4)],
                      "stage3 episodes/format": [(1, 0.5)], "stage3 rewards/omne/mean": [(1, 0.4)],
                      "plan rewards/plan/mean": [(1, 0.7)], "iter1 loss": [(1, 0.8)]}
    png = plot_log(path, tmp_path / "out" / "curve.png", "Omne")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path.write_text(json.dumps(LOG[0]) + "\n")  # dev lines only: one panel
    assert plot_log(path, tmp_path / "dev.png").is_file()


def test_dev_delta_with_its_interval_behaviour_rates_and_the_held_back_curve(tmp_path):
    from mhqa_graph.training.curve import plot_delta

    log = [{"event": "dev", "after": "untrained", "dev_f1": 0.4, "dev_em": 0.3, "dev_well_formed": 0.8,
            "dev_tool_rate": 0.5, "dev_acted_rate": 0.2, "dev_unknown": 10, "dev_questions": 100},
           {"role": "analysis", "step": 0, "eval_loss": 0.1, "eval_reward": 0.2, "eval_rewards/analysis/mean": 0.2},
           {"role": "analysis", "step": 1, "loss": 0.3, "reward": 0.3, "rewards/analysis/mean": 0.3},
           {"role": "analysis", "step": 1, "eval_loss": 0.1, "eval_reward": 0.4, "eval_rewards/analysis/mean": 0.4},
           {"event": "dev", "after": "analysis", "dev_f1": 0.45, "dev_em": 0.3, "dev_well_formed": 0.9,
            "dev_unknown": 4, "dev_questions": 100, "dev_df1": 5.0, "dev_df1_low": -1.0, "dev_df1_high": 11.0,
            "dev_better": 20, "dev_worse": 12, "dev_sign_p": 0.22, "dev_paired": 100}]
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in log) + "\n")
    entries = read_log(path)
    points = dict(dev_points(entries))
    assert points["untrained"]["dev_unknown_rate"] == 0.1 and points["analysis"]["dev_unknown_rate"] == 0.04
    series = step_series(entries)
    assert series["analysis held-back rewards/analysis/mean"] == [(0, 0.2), (1, 0.4)]
    assert series["analysis held-back reward"] == [(0, 0.2), (1, 0.4)] and "analysis held-back loss" not in series
    assert series["analysis rewards/analysis/mean"] == [(1, 0.3)]
    from mhqa_graph.plots import pyplot

    fig, ax = pyplot().subplots()
    plot_delta(ax, list(points.items()))
    (bars,) = [c for c in ax.containers]  # one error bar: the trained line against the untrained one
    assert list(bars.lines[0].get_ydata()) == [5.0] and "p=0.22" in ax.texts[0].get_text()
    pyplot().close(fig)
    png = plot_log(path, tmp_path / "curve.png", "MAPGRPO")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
