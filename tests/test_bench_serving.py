"""bench/serving.py reads the recorded transcripts' model calls, by agent, in recorded order."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("bench_serving", Path(__file__).parents[1] / "bench" / "serving.py")
serving = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(serving)


@pytest.fixture
def repeat():
    """bench/repeat.py, loaded afresh for each test."""
    spec = importlib.util.spec_from_file_location("bench_repeat", Path(__file__).parents[1] / "bench" / "repeat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_prefix_reuse_counts_the_previous_prompt_or_the_best_of_the_recent_ones():
    a, b = "SYSTEM-A question one", "SYSTEM-B question one"
    # a b a: the previous prompt shares only "SYSTEM-" with the third; two slots hold the first, all of it
    total, previous, recent = serving.reuse([a, b, a], slots=2)
    assert total == 3 * len(a)
    assert previous == len(a) + (len(b) - 7) + (len(a) - 7)
    assert recent == len(a) + (len(b) - 7) + 0
    assert serving.reuse([a, b, a], slots=1)[2] == previous


def test_runs_reuse_reads_the_traced_prompts_of_each_run(tmp_path, capsys):
    def record(*prompts):
        return {"trace": {"llm_calls": [{"messages": [{"role": "user", "content": p}]} for p in prompts]}}
    (tmp_path / "opera").mkdir()
    (tmp_path / "opera" / "results.jsonl").write_text(
        "\n".join(json.dumps(r) for r in (record("plan X", "answer X"), record("plan Y"))), encoding="utf-8")
    serving.runs_reuse(tmp_path, slots=40)
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("| opera | 2 | 3 |")


def test_the_eval_speed_row_compares_the_questions_both_runs_answered():
    def record(latency, prompt, cached, prediction, f1):
        return {"latency": latency, "tokens": {"input": prompt, "cached": cached}, "prediction": prediction, "f1": f1}

    off = {"a": record(10, 1000, 100, "x", 1.0), "b": record(30, 3000, 300, "y", 0.0), "c": record(99, 1, 0, "z", 1)}
    on = {"a": record(5, 1000, 700, "x", 1.0), "b": record(15, 3000, 2400, "w", 0.5)}
    row = serving.speed_row(off, on)
    assert row["n"] == 2 and row["same"] == 1  # "c" is in one run only
    assert (row["sec_off"], row["sec_on"], row["sec_ratio"]) == (20, 10, 0.5)
    assert (row["pre_off"], row["pre_on"], row["pre_ratio"]) == (1800, 450, 0.25)
    assert (row["f1_off"], row["f1_on"]) == (50, 75)
    assert serving.speed_row(off, {}) is None


def test_backends_and_threads_rows_are_per_call_ratios_and_recorded(tmp_path, capsys, monkeypatch):
    """`--backends`: the longest calls, seconds per call through each backend and their ratio; `--threads`: the
    worker rounds with one thread and with one per core; each row written with `--record`."""
    calls = [{"messages": [{"role": "user", "content": "x" * n}], "stop": [], "output_tokens": 10} for n in (5, 50, 9)]
    monkeypatch.setattr(serving, "transcript_calls", lambda folder, only: {"opera": calls})
    seen = {}

    def replay(spec, asked):
        seen[spec] = [len(c["messages"][0]["content"]) for c in asked]
        return {"seconds": 4.0 if spec.startswith("llamacpp:") else 10.0, "prompt": 100, "prefilled": 100,
                "replies": ["a", "b"] if spec.startswith("llamacpp:") else ["a", "c"]}

    monkeypatch.setattr(serving, "replay", replay)
    args = serving.argparse.Namespace(backends="pack", calls=2, recorded=tmp_path, record=tmp_path / "b.json")
    serving.backends(args)
    assert seen == {"llamacpp:pack?threads=1": [50, 9], "pack": [50, 9]}  # the 2 longest, longest first
    row = json.loads((tmp_path / "b.json").read_text())
    assert (row["s_llamacpp"], row["s_transformers"], row["ratio"], row["same_replies"]) == (2.0, 5.0, 2.5, 1)
    assert capsys.readouterr().out.strip().endswith("| 2.0 | 5.0 | 2.5x | 1/2 |")

    workers = [{"messages": [{"role": "system", "content": serving.WORKER_SYSTEM}]}] * 2
    monkeypatch.setattr(serving, "transcript_calls", lambda folder, only: {"mujica": workers})
    monkeypatch.setattr(serving.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(serving, "replay_rounds", lambda spec, rounds: {"seconds": 3.0 if "threads=1" in spec else 6.0})
    args = serving.argparse.Namespace(llm="llamacpp:m", load=1, recorded=tmp_path, record=tmp_path / "t.json")
    serving.threads(args, "?")
    row = json.loads((tmp_path / "t.json").read_text())
    assert (row["cores"], row["load"], row["s_1_thread"], row["s_2_threads"], row["ratio"]) == (2, 1, 3.0, 6.0, 2.0)


def test_repeat_compares_each_run_with_the_first_and_counts_the_calls_the_cache_answered(tmp_path, repeat):
    """bench/repeat.py's table, from run folders written here (no model)."""
    runs = {"first": [("q1", "Paris", 3, 0), ("q2", "Rome", 2, 0)],
            "again": [("q0", "Oslo", 1, 0), ("q1", "Paris", 3, 0), ("q2", "Milan", 2, 0)],  # q0: a warming question
            "cached": [("q1", "Paris", 3, 3), ("q2", "Rome", 2, 2)]}
    for name, rows in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.jsonl").write_text("".join(json.dumps(
            {"id": i, "prediction": p, "llm_calls": n, "llm_calls_cached": c, "latency": 1.0, "em": 1.0, "f1": 1.0})
            + "\n" for i, p, n, c in rows), encoding="utf-8")
    table = repeat.rows(argparse.Namespace(out=tmp_path))
    assert [(r["run"], r["questions"], r["same"], r["model_calls"], r["llm_calls_cached"]) for r in table] == [
        ("first", 2, 2, 5, 0), ("again", 2, 1, 5, 0), ("cached", 2, 2, 0, 5)]


def test_repeat_against_a_committed_eval_takes_run_1_from_its_records_for_the_asked_questions(tmp_path, repeat,
                                                                                              monkeypatch):
    """`--against`: run 1 is the committed eval's records of the asked questions (not asked again); a committed eval
    that lacks one of them is an error, not a shorter comparison."""
    import gzip
    from types import SimpleNamespace

    committed = tmp_path / "auto.jsonl.gz"
    with gzip.open(committed, "wt", encoding="utf-8") as f:
        for i, p in (("q0", "Oslo"), ("q1", "Paris"), ("q2", "Rome")):
            f.write(json.dumps({"id": i, "prediction": p, "llm_calls": 2, "llm_calls_cached": 0, "latency": 1.0})
                    + "\n")
    monkeypatch.setattr(repeat, "load_questions", lambda dataset, path, limit, start: [
        SimpleNamespace(id=f"q{n}") for n in range(start, start + limit)])
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "results.jsonl").write_text("".join(json.dumps(
        {"id": i, "prediction": p, "llm_calls": 2, "llm_calls_cached": 0, "latency": 1.0}) + "\n"
        for i, p in (("q1", "Paris"), ("q2", "Milan"))), encoding="utf-8")
    args = argparse.Namespace(out=tmp_path, against=committed, env="pq2h", data=tmp_path, start=1, limit=2)
    table = repeat.rows(args)
    assert [(r["run"], r["questions"], r["same"]) for r in table] == [("first", 2, 2), ("again", 2, 1)]
    with pytest.raises(SystemExit, match="answers 2 of the 3 questions"):
        repeat.first_run(argparse.Namespace(**{**vars(args), "start": 1, "limit": 3}))


def test_a_replay_asks_through_a_fresh_store_of_the_records_environment_only(tmp_path, repeat, monkeypatch, capsys):
    """What else a store holds changes its ranking, and so the prompts: `--replay` builds a store of its own, afresh,
    unless `--store` names one (no model: the eval is replaced by records written here)."""
    record = tmp_path / "rec.json"
    record.write_text(json.dumps({"env": "pq2h", "agent": "auto", "llm": "llamacpp:m", "start": 1, "limit": 1,
                                  "predictions": {"q1": "Paris"}}), encoding="utf-8")
    record.with_suffix(".calls.sqlite").write_bytes(b"")
    stores = []

    def eval_run(args, out, start, limit, concurrency, cache, ids=None):
        stores.append(args.store)
        out.mkdir(parents=True)
        (out / "results.jsonl").write_text(json.dumps({"id": "q1", "prediction": "Paris", "llm_calls": 2,
                                                       "llm_calls_cached": 2}) + "\n", encoding="utf-8")

    monkeypatch.setattr(repeat, "eval_run", eval_run)
    stale = tmp_path / "out" / "replay" / "rec.store"
    stale.mkdir(parents=True)
    (stale / "left.txt").write_text("from an earlier replay")
    repeat.replay(argparse.Namespace(replay=record, out=tmp_path / "out", store=None))
    assert stores == [f"embedded://{stale}"] and not stale.exists()  # removed: the eval builds it afresh
    assert "| auto on pq2h | 1 | 1/1 | 2 | 2 |" in capsys.readouterr().out
    repeat.replay(argparse.Namespace(replay=record, out=tmp_path / "out2", store="embedded:///given"))
    assert stores[-1] == "embedded:///given"


def test_repeat_shows_a_committed_record_as_the_table_it_printed(tmp_path, repeat):
    """`--show` (docs/benchmarks.md's generated blocks): the table of a `--record` file, no run."""
    record = tmp_path / "rec.json"
    record.write_text(json.dumps({"env": "pq2h", "agent": "auto", "llm": "llamacpp:m", "start": 240, "limit": 2,
                                  "against": "bench/results/x.jsonl.gz", "rows": [
                                      {"run": "again", "questions": 2, "same": 1, "llm_calls": 5,
                                       "llm_calls_cached": 0, "model_calls": 5, "seconds": 3.5}]}), encoding="utf-8")
    shown = repeat.reports(argparse.Namespace(show=record))
    assert shown.splitlines()[0] == "`auto` on pq2h 240..241, `llamacpp:m`, against `bench/results/x.jsonl.gz`"
    assert shown.splitlines()[-1] == "| again | 2 | 1/2 | 5 | 0 | 5 | 3.5 |"


def test_repeat_against_checks_that_the_committed_eval_is_of_the_asked_run(tmp_path, repeat):
    """`--against` names its run by its path (RESULTS/<llm>/<env>/<agent>.jsonl.gz): another agent, environment or
    model is an error, as is a missing call cache, never a comparison of two different runs."""
    committed = tmp_path / "llamacpp_m_threads_1" / "pq2h" / "auto.jsonl.gz"
    committed.parent.mkdir(parents=True)
    args = argparse.Namespace(against=committed, llm="llamacpp:m?threads=1", env="pq2h", agent="auto")
    with pytest.raises(SystemExit, match="no call cache"):
        repeat.committed_cache(args)
    (tmp_path / "llamacpp_m_threads_1" / "calls").mkdir()
    (tmp_path / "llamacpp_m_threads_1" / "calls" / "calls.sqlite").write_bytes(b"")
    assert repeat.committed_cache(args) == tmp_path / "llamacpp_m_threads_1" / "calls" / "calls.sqlite"
    with pytest.raises(SystemExit, match="not of --agent rag"):
        repeat.committed_cache(argparse.Namespace(**{**vars(args), "agent": "rag"}))
    plain = tmp_path / "llamacpp_m" / "pq2h" / "auto.jsonl.gz"  # bench/agents.py names its folder without ?threads=1
    (plain.parents[1] / "calls").mkdir(parents=True)
    (plain.parents[1] / "calls" / "calls.sqlite").write_bytes(b"")
    assert repeat.committed_cache(argparse.Namespace(**{**vars(args), "against": plain})).parent.parent.name == \
        "llamacpp_m"
