"""bench/serving.py reads the recorded transcripts' model calls, by agent, in recorded order."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("bench_serving", Path(__file__).parents[1] / "bench" / "serving.py")
serving = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(serving)


def test_calls_come_by_agent_in_file_and_recorded_order(tmp_path):
    call = {"messages": [{"role": "user", "content": "q"}], "stop": [], "output": "a", "output_tokens": 1}
    for name, agent, keys in (("b-omne.json", "omne", "xy"), ("a-omne.json", "omne", "z"), ("rag.json", "rag", "r")):
        (tmp_path / name).write_text(json.dumps({"meta": {"agent": agent},
                                                 "llm": {k: call | {"output": k} for k in keys}}), encoding="utf-8")
    (tmp_path / "raw.json").write_text(json.dumps({"meta": {}, "replies": []}), encoding="utf-8")
    calls = serving.transcript_calls(tmp_path, set())
    assert {a: [c["output"] for c in cs] for a, cs in calls.items()} == {"omne": ["z", "x", "y"], "rag": ["r"]}
    assert list(serving.transcript_calls(tmp_path, {"rag"})) == ["rag"]
    recorded = serving.transcript_calls(serving.RECORDED, set())
    assert set(recorded) == {"direct", "rag", "opera", "mujica", "omne"}
