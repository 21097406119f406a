"""A trainer's log.jsonl read back as dev points and per-step series, and drawn."""

from __future__ import annotations

import json

from mhqa_graph.training.curve import dev_points, plot_log, read_log, step_series

LOG = [
    {"event": "dev", "after": "untrained", "dev_f1": 0.2, "dev_em": 0.1, "dev_tool_rate": 0.5},
    {"stage": 2, "step": 1, "loss": 1.5, "learning_rate": 1e-4},
    {"stage": 2, "step": 2, "loss": 1.1},
    {"event": "dev", "after": "stage2", "dev_f1": 0.3, "dev_em": 0.2, "dev_tool_rate": 0.9},
    {"stage": 3, "step": 1, "reward": 0.4, "episodes/format": 0.5, "rewards/omne/mean": 0.4},
    {"role": "plan", "step": 1, "rewards/plan/mean": 0.7, "rewards/plan/std": 0.1},
    {"phase": "iter1", "step": 1, "loss": 0.8},
    {"iteration": 1, "tau": 0.3, "loss": 0.9, "dev_f1": 0.35, "dev_em": 0.3},
    {"event": "dev", "after": "untrained", "dev_f1": 0.25, "dev_em": 0.1},  # a rerun's line wins
]


def test_dev_points_and_step_series(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in LOG) + "\n")
    entries = read_log(path)
    assert [(p, m["dev_f1"]) for p, m in dev_points(entries)] == [("untrained", 0.25), ("stage2", 0.3),
                                                                  ("iter1", 0.35)]
    series = step_series(entries)
    assert series == {"stage2 loss": [(1, 1.5), (2, 1.1)], "stage3 reward": [(1, 0.4)],
                      "stage3 episodes/format": [(1, 0.5)], "stage3 rewards/omne/mean": [(1, 0.4)],
                      "plan rewards/plan/mean": [(1, 0.7)], "iter1 loss": [(1, 0.8)]}
    png = plot_log(path, tmp_path / "out" / "curve.png", "Omne")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path.write_text(json.dumps(LOG[0]) + "\n")  # dev lines only: one panel
    assert plot_log(path, tmp_path / "dev.png").is_file()
