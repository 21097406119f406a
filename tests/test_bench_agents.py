"""bench/agents.py's tables and plot, from run folders written here (no model, no eval)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from mhqa_graph.eval.report import RESULTS

SPEC = importlib.util.spec_from_file_location("bench_agents", Path(__file__).parents[1] / "bench" / "agents.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)

LLM = "fake:llm"
ROW = "who is q{n} 's spouse ?\tanswer_{n}(answer_{n}/)\tq{n}#spouse#answer_{n}#<end>#answer_{n}\n"


@pytest.fixture
def folders(tmp_path: Path) -> argparse.Namespace:
    """Six PQ-2H questions; rag answered all six (right on even ones), opera answered the first four (all right)."""
    data = tmp_path / "data" / "pathquestion"
    data.mkdir(parents=True)
    (data / "PQ-2H.txt").write_text("".join(ROW.format(n=n) for n in range(6)), encoding="utf-8")
    args = argparse.Namespace(out=tmp_path / "out", llm=LLM, data=tmp_path / "data", start=0, limit=6)
    ids = [q.id for q in bench.load_questions("pathquestion", data / "PQ-2H.txt")]
    for agent, answered, right in (("rag", ids, ids[::2]), ("opera", ids[:4], ids[:4])):
        folder = bench.run_dir(args.out, LLM, "pq2h", agent)
        folder.mkdir(parents=True)
        with (folder / RESULTS).open("w", encoding="utf-8") as f:
            for qid in answered:
                score = float(qid in right)
                f.write(json.dumps({"id": qid, "em": score, "f1": score, "latency": 2.0, "llm_calls": 3,
                                    "tokens": {"total": 10}, "health": {"acted": True, "repairs": 1}}) + "\n")
    return args


def test_a_table_covers_the_asked_range_that_every_agent_answered(folders):
    n, rows = bench.env_rows(folders, "pq2h", ["rag", "opera"])
    by_agent = {r["agent"]: r for r in rows}
    assert n == 4  # opera has not answered questions 4 and 5
    assert by_agent["rag"]["f1"] == 50.0 and by_agent["opera"]["f1"] == 100.0
    assert by_agent["opera"]["df1"] == 50.0 and by_agent["opera"]["acted"] == "4/4"
    assert by_agent["opera"]["acted_pct"] == 100.0

    folders.start, folders.limit = 1, 2  # questions 1 and 2 only: rag right on 2, opera on both
    n, rows = bench.env_rows(folders, "pq2h", ["rag", "opera"])
    assert n == 2 and {r["agent"]: r["f1"] for r in rows} == {"rag": 50.0, "opera": 100.0}

    folders.start, folders.limit = 4, 2  # only rag answered these
    assert bench.env_rows(folders, "pq2h", ["rag", "opera"]) == (0, [])


def test_report_only_writes_the_table_and_the_plot(folders, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["agents.py", "--report-only", "--env", "pq2h", "--agents", "rag,opera",
                                     "--llm", LLM, "--limit", "4", "--out", str(folders.out),
                                     "--data", str(folders.data)])
    bench.main()
    table = (folders.out / "agents.md").read_text(encoding="utf-8")
    assert "4 questions" in table and "| opera | 100.0 | 100.0 | +50.0 [+0.0, +100.0] |" in table
    assert capsys.readouterr().out.strip() == table.strip()
    assert (folders.out / "agents.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_variants_and_intervals():
    assert bench.parse_variant("omne:guards=none;guard_mode=log") == ("omne", {"guards": "none", "guard_mode": "log"})
    assert bench.parse_variant("rag") == ("rag", {})
    assert bench.split_agents("rag, opera:guards=-unecho,-options_line,omne") == [
        "rag", "opera:guards=-unecho,-options_line", "omne"]
    for bad in ("omne:tools=x", "gpt", "rag:decoding"):
        with pytest.raises(ValueError, match="bad agent"):
            bench.parse_variant(bad)
    assert bench.run_dir(Path("o"), LLM, "pq2h", "omne:guards=none").name == "omne_guards=none"
    args = argparse.Namespace(data=Path("d"), llm="llamacpp:x", store="embedded:///s", limit=4, start=100,
                              out=Path("o"))
    cmd = bench.eval_command(args, "pq2h", "omne:guards=none;decoding=prompt")
    assert "--guards=none" in cmd and "--decoding=prompt" in cmd
    assert bench.paired_interval([0.0, 0.0, 0.0]) == (0.0, 0.0) and bench.paired_interval([1.0]) is None
    low, high = bench.paired_interval([1.0, 0.0] * 20)
    assert 30 < low < 50 < high < 70


def test_a_guards_off_variant_reasks_only_where_one_of_its_guards_fired(folders):
    ids = [q.id for q in bench.load_questions("pathquestion", folders.data / "pathquestion" / "PQ-2H.txt")]
    fired = {ids[0]: {"send_back_one_hop": 1}, ids[1]: {"send_back_ungrounded": 1, "send_back_one_hop": 1},
             ids[2]: {"send_back_ungrounded": 2}}
    base = bench.run_dir(folders.out, LLM, "pq2h", "omne")
    base.mkdir(parents=True)
    with (base / RESULTS).open("w", encoding="utf-8") as f:
        for qid in ids:
            failed = qid == ids[5]
            f.write(json.dumps({"id": qid, "f1": 0.0 if failed else 1.0, "em": 0.0 if failed else 1.0,
                                "error": "Timeout" if failed else None, "latency": 2.0, "llm_calls": 3,
                                "tokens": {"total": 9}, "health": {"guards": fired.get(qid, {})}}) + "\n")

    assert bench.guards_off("omne:guards=none") == ("omne", frozenset({"send_back_one_hop", "send_back_ungrounded"}))
    assert bench.guards_off("omne:decoding=prompt;guards=-send_back_one_hop") == (
        "omne:decoding=prompt", frozenset({"send_back_one_hop"}))
    for variant in ("omne", "rag:decoding=prompt", "omne:guards=none;guard_mode=log", "omne:guards=auto",
                    "opera:guards=-send_back_one_hop"):
        assert bench.guards_off(variant) is None
    assert bench.fired_guards(folders, "pq2h", "omne") == ["send_back_one_hop", "send_back_ungrounded"]

    # none of the guards fired on questions 3 and 4; question 5 failed, so it is asked again
    assert bench.carry_over(folders, "pq2h", "omne:guards=none") == 2
    assert bench.carry_over(folders, "pq2h", "omne:guards=none") == 0  # never twice
    assert bench.carry_over(folders, "pq2h", "omne:guards=-send_back_one_hop") == 3  # and question 2
    carried = bench.read_records(bench.run_dir(folders.out, LLM, "pq2h", "omne:guards=-send_back_one_hop") / RESULTS)
    assert [r["id"] for r in carried] == ids[2:5] and {r["carried"] for r in carried} == {"omne"}
    assert bench.carry_over(folders, "pq2h", "omne:guards=none;guard_mode=log") == 0

    # the re-asked questions without the guards: 0 and 2 wrong, 1 right as before, 5 answered this time
    off = bench.run_dir(folders.out, LLM, "pq2h", "omne:guards=none")
    with (off / RESULTS).open("a", encoding="utf-8") as f:
        for qid, f1 in zip((ids[0], ids[1], ids[2], ids[5]), (0.0, 1.0, 0.0, 1.0)):
            f.write(json.dumps({"id": qid, "f1": f1, "em": f1, "latency": 1.0, "llm_calls": 2,
                                "tokens": {"total": 5}, "health": {}}) + "\n")
    n, rows = bench.env_rows(folders, "pq2h", ["omne", "omne:guards=none"])
    share = {r["agent"]: r["guards_share"] for r in rows}
    assert n == 6 and share["omne"] is None
    assert share["omne:guards=none"]["better"] == 2 and share["omne:guards=none"]["worse"] == 1
    assert share["omne:guards=none"]["reasked"] == 4 and round(share["omne:guards=none"]["df1"], 1) == 16.7
    table = bench.markdown("pq2h", n, rows, LLM)
    assert "| omne: send_back_one_hop, send_back_ungrounded | +16.7 [" in table and "| 2 / 1 | 4 | +0.67, +3 |" in table
