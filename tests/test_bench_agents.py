"""bench/agents.py, its tables (bench/tables.py) and plot, from run folders written here (no model, no eval)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from mhqa_graph.graphs.calls import REPAIR_PREFIX
from mhqa_graph.graphs.guards import GUARDS

from mhqa_graph.eval.paired import paired_interval
from mhqa_graph.eval.report import RESULTS, read_records
from mhqa_graph.eval.runner import load_questions

SPEC = importlib.util.spec_from_file_location("bench_agents", Path(__file__).parents[1] / "bench" / "agents.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)  # puts bench/ on sys.path: its modules import each other by name
import doc  # noqa: E402
import tables  # noqa: E402
import variants  # noqa: E402

LLM = "fake:llm"
ROW = "who is q{n} 's spouse ?\tanswer_{n}(answer_{n}/)\tq{n}#spouse#answer_{n}#<end>#answer_{n}\n"


@pytest.fixture
def folders(tmp_path: Path) -> argparse.Namespace:
    """Six PQ-2H questions; rag answered all six (right on even ones), opera answered the first four (all right)."""
    data = tmp_path / "data" / "pathquestion"
    data.mkdir(parents=True)
    (data / "PQ-2H.txt").write_text("".join(ROW.format(n=n) for n in range(6)), encoding="utf-8")
    args = argparse.Namespace(out=tmp_path / "out", llm=LLM, data=tmp_path / "data", start=0, limit=6,
                              results=tmp_path / "results")
    ids = [q.id for q in load_questions("pathquestion", data / "PQ-2H.txt")]
    for agent, answered, right in (("rag", ids, ids[::2]), ("opera", ids[:4], ids[:4])):
        folder = bench.run_dir(args.out, LLM, "pq2h", agent)
        folder.mkdir(parents=True)
        with (folder / RESULTS).open("w", encoding="utf-8") as f:
            for qid in answered:
                score = float(qid in right)
                f.write(json.dumps({"id": qid, "em": score, "f1": score, "latency": 2.0, "llm_calls": 3,
                                    "tokens": {"total": 10}, "health": {"acted": True, "repairs": 1}}) + "\n")
        save(args, "pq2h", agent)
    return args


def save(args: argparse.Namespace, env: str, variant: str) -> None:
    """What bench/agents.py does after each eval: the run folder's records into the records file."""
    bench.R.save(bench.run_dir(args.out, LLM, env, variant), bench.R.path_of(LLM, env, variant, args.results))


def test_a_table_covers_the_asked_range_that_every_agent_answered(folders):
    n, rows = tables.env_rows(folders, "pq2h", ["rag", "opera"])
    by_agent = {r["agent"]: r for r in rows}
    assert n == 4  # opera has not answered questions 4 and 5
    assert by_agent["rag"]["f1"] == 50.0 and by_agent["opera"]["f1"] == 100.0
    assert by_agent["opera"]["df1"] == 50.0 and by_agent["opera"]["acted"] == "4/4"
    assert by_agent["opera"]["acted_pct"] == 100.0

    folders.start, folders.limit = 1, 2  # questions 1 and 2 only: rag right on 2, opera on both
    n, rows = tables.env_rows(folders, "pq2h", ["rag", "opera"])
    assert n == 2 and {r["agent"]: r["f1"] for r in rows} == {"rag": 50.0, "opera": 100.0}

    folders.start, folders.limit = 4, 2  # only rag answered these
    assert tables.env_rows(folders, "pq2h", ["rag", "opera"]) == (0, [])


def test_report_only_writes_the_table_and_the_plot(folders, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["agents.py", "--report-only", "--env", "pq2h", "--agents", "rag,opera",
                                     "--llm", LLM, "--limit", "4", "--out", str(folders.out),
                                     "--data", str(folders.data), "--results", str(folders.results)])
    bench.main()
    table = (folders.out / "agents.md").read_text(encoding="utf-8")
    assert "4 questions" in table and "| opera | 100.0 | 100.0 | +50.0 [+0.0, +100.0] |" in table
    assert capsys.readouterr().out.strip() == table.strip()
    assert (folders.out / "agents.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_variants_and_intervals():
    assert variants.parse_variant("omne:guards=none;guard_mode=log") == ("omne", {"guards": "none",
                                                                                 "guard_mode": "log"})
    assert variants.parse_variant("rag") == ("rag", {})
    assert variants.split_agents("rag, opera:guards=-unecho,-options_line,omne") == [
        "rag", "opera:guards=-unecho,-options_line", "omne"]
    for bad in ("omne:tools=x", "gpt", "rag:decoding"):
        with pytest.raises(ValueError, match="bad agent"):
            variants.parse_variant(bad)
    assert bench.run_dir(Path("o"), LLM, "pq2h", "omne:guards=none").name == "omne_guards=none"
    args = argparse.Namespace(data=Path("d"), llm="llamacpp:x", store="embedded:///s", limit=4, start=100,
                              out=Path("o"))
    cmd = bench.eval_command(args, "pq2h", "omne:guards=none;decoding=prompt")
    assert "--guards=none" in cmd and "--decoding=prompt" in cmd
    assert paired_interval([0.0, 0.0, 0.0]) == (0.0, 0.0) and paired_interval([1.0]) is None
    low, high = paired_interval([1.0, 0.0] * 20)
    assert 30 < low < 50 < high < 70


def test_a_guards_off_variant_reasks_only_where_one_of_its_guards_fired(folders):
    ids = [q.id for q in load_questions("pathquestion", folders.data / "pathquestion" / "PQ-2H.txt")]
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
    save(folders, "pq2h", "omne")

    assert variants.guards_off("omne:guards=none") == ("omne", frozenset({"send_back_one_hop", "send_back_ungrounded"}))
    assert variants.guards_off("omne:decoding=prompt;guards=-send_back_one_hop") == (
        "omne:decoding=prompt", frozenset({"send_back_one_hop"}))
    for variant in ("omne", "rag:decoding=prompt", "omne:guards=none;guard_mode=log", "omne:guards=auto",
                    "opera:guards=-send_back_one_hop"):
        assert variants.guards_off(variant) is None
    assert bench.fired_guards(folders, "pq2h", "omne") == ["send_back_one_hop", "send_back_ungrounded"]

    # none of the guards fired on questions 3 and 4; question 5 failed, so it is asked again
    assert bench.carry_over(folders, "pq2h", "omne:guards=none") == 2
    assert bench.carry_over(folders, "pq2h", "omne:guards=none") == 0  # never twice
    assert bench.carry_over(folders, "pq2h", "omne:guards=-send_back_one_hop") == 3  # and question 2
    carried = read_records(bench.run_dir(folders.out, LLM, "pq2h", "omne:guards=-send_back_one_hop") / RESULTS)
    assert [r["id"] for r in carried] == ids[2:5] and {r["carried"] for r in carried} == {"omne"}
    assert bench.carry_over(folders, "pq2h", "omne:guards=none;guard_mode=log") == 0

    # the re-asked questions without the guards: 0 and 2 wrong, 1 right as before, 5 answered this time
    off = bench.run_dir(folders.out, LLM, "pq2h", "omne:guards=none")
    with (off / RESULTS).open("a", encoding="utf-8") as f:
        for qid, f1 in zip((ids[0], ids[1], ids[2], ids[5]), (0.0, 1.0, 0.0, 1.0)):
            f.write(json.dumps({"id": qid, "f1": f1, "em": f1, "latency": 1.0, "llm_calls": 2,
                                "tokens": {"total": 5}, "health": {}}) + "\n")
    save(folders, "pq2h", "omne:guards=none")
    n, rows = tables.env_rows(folders, "pq2h", ["omne", "omne:guards=none"])
    share = {r["agent"]: r["guards_share"] for r in rows}
    assert n == 6 and share["omne"] is None
    assert share["omne:guards=none"]["better"] == 2 and share["omne:guards=none"]["worse"] == 1
    assert share["omne:guards=none"]["reasked"] == 4 and round(share["omne:guards=none"]["df1"], 1) == 16.7
    table = tables.markdown("pq2h", n, rows, LLM)
    assert "| omne: send_back_one_hop, send_back_ungrounded | +16.7 [" in table and "| 2 / 1 | 4 | +0.67, +3 |" in table


# -- --summary: the cross-environment tables, from synthetic run folders ----------------------------------------
IDS = {env: [f"{env}-{n}" for n in range(4)] for env in ("pq2h", "pq3h", "hotpot")}


def record(qid: str, f1: float, *, calls: int = 2, guards: dict | None = None, carried: str | None = None,
           malformed: bool = False, repaired: int = 0) -> dict:
    """An eval record; `repaired` of its model calls answer a format repair."""
    asks = [REPAIR_PREFIX + ": give the answer." if n < repaired else "question" for n in range(calls)]
    return {"id": qid, "f1": f1, "em": f1, "latency": 3.0, "llm_calls": calls, "tokens": {"input": 8, "total": 10},
            "health": {"guards": guards or {}, "malformed": malformed},
            "trace": {"llm_calls": [{"messages": [{"role": "user", "content": a}]} for a in asks]}} | (
        {"carried": carried} if carried else {})


def write_run(args: argparse.Namespace, env: str, variant: str, records: list[dict]) -> None:
    """The committed records of one variant, as bench/records.py keeps them."""
    bench.R.write(bench.R.path_of(LLM, env, variant, args.results), [bench.R.compact(r) for r in records])


def scored(env: str, f1s: list[float], **extra) -> list[dict]:
    return [record(qid, f1, **extra) for qid, f1 in zip(IDS[env], f1s)]


@pytest.fixture
def summary_args(tmp_path: Path, monkeypatch) -> argparse.Namespace:
    monkeypatch.setattr(tables, "asked_ids", lambda args, env: set(IDS[env][args.start:args.start + args.limit]))
    return argparse.Namespace(out=tmp_path / "out", llm=LLM, start=0, limit=4, results=tmp_path / "results")


def test_the_matrix_gives_f1_and_the_paired_interval_against_rag_or_says_what_is_missing(summary_args):
    write_run(summary_args, "pq2h", "rag", scored("pq2h", [1, 0, 0, 0]))
    write_run(summary_args, "pq2h", "opera", scored("pq2h", [1, 1, 0, 0]))
    write_run(summary_args, "pq2h", "omne", scored("pq2h", [1, 1]))  # stopped after two questions
    write_run(summary_args, "pq3h", "rag", scored("pq3h", [0, 0, 0, 0]))
    # opera's default run was made when date_comparison was on by default; it fired on question 0 (and turned it
    # wrong): that question comes from the run without it, as today's default would have run it
    pq3h = scored("pq3h", [0, 1, 1, 1])
    pq3h[0]["health"]["guards"] = {"date_comparison": 1}
    write_run(summary_args, "pq3h", "opera", pq3h)
    write_run(summary_args, "pq3h", "opera:guards=-date_comparison", [record("pq3h-0", 1.0)] + [
        r | {"carried": "opera"} for r in pq3h[1:]])
    write_run(summary_args, "pq3h", "opera:guards=none", [record("pq3h-0", 0.5)])  # turns default guards off too
    write_run(summary_args, "hotpot", "rag", scored("hotpot", [1, 1, 0, 0]))
    by_env = tables.summary_envs(summary_args, ["pq2h", "pq3h", "hotpot"], list(variants.AGENTS))
    table = tables.matrix_table(by_env, ["rag", "opera", "mujica", "omne"])

    assert "| pq2h | 4 (4) | 25.0 | 50.0 (+25.0 [+0.0, +75.0]) | not run | 2 of 4 |" in table
    assert "| pq3h | 4 (4) | 0.0 | 100.0 (+100.0 [+100.0, +100.0]) | not run | not run |" in table
    assert "| hotpot | 4 (4) | 50.0 | not run | not run | - |" in table  # omne needs a knowledge graph
    assert "- opera on pq3h: 1 of 4 questions from `opera:guards=-date_comparison`" in table
    assert by_env["pq2h"]["cells"]["omne"]["k"] == 2 and "df1" not in by_env["pq2h"]["cells"]["omne"]

    # without the run that turned that guard alone off, that question is left out of opera's default records
    bench.R.path_of(LLM, "pq3h", "opera:guards=-date_comparison", summary_args.results).unlink()
    by_env = tables.summary_envs(summary_args, ["pq3h"], ["rag", "opera"])
    assert "| pq3h | 4 (4) | 0.0 | 3 of 4 |" in tables.matrix_table(by_env, ["rag", "opera"])

    summary_args.start, summary_args.limit = 2, 2  # the asked range decides what complete means
    by_env = tables.summary_envs(summary_args, ["pq2h"], ["rag", "opera", "omne"])
    table = tables.matrix_table(by_env, ["rag", "opera", "omne"])
    assert "| pq2h | 2 (2) | 0.0 | 0.0 (+0.0 [+0.0, +0.0]) | not run |" in table


def test_the_guard_table_pools_a_paired_bootstrap_over_the_questions_of_every_environment(summary_args):
    sent_back = {"send_back_ungrounded": 1}
    write_run(summary_args, "pq2h", "omne", scored("pq2h", [1, 1, 0, 1], guards=sent_back))
    write_run(summary_args, "pq2h", "omne:guards=none", scored("pq2h", [0, 1, 0, 1], calls=1))
    write_run(summary_args, "pq3h", "omne", scored("pq3h", [1, 0, 1, 1], guards=sent_back))
    write_run(summary_args, "pq3h", "omne:guards=none", scored("pq3h", [1, 1, 0, 1], calls=1))
    write_run(summary_args, "pq2h", "opera", scored("pq2h", [1, 1, 1, 1]))  # options_line never fired here
    opera = scored("pq3h", [1, 0, 0, 0])
    opera[0]["health"]["guards"] = {"options_line": 1}
    write_run(summary_args, "pq3h", "opera", opera)
    write_run(summary_args, "pq3h", "opera:guards=-options_line", [record("pq3h-0", 0.0)] + [
        r | {"carried": "opera"} for r in opera[1:]])
    write_run(summary_args, "pq2h", "mujica", scored("pq2h", [1, 1, 0, 0]))
    write_run(summary_args, "pq2h", "mujica:guards=-date_comparison", scored("pq2h", [1, 0, 0, 0]))
    table = tables.guards_table(tables.summary_envs(summary_args, ["pq2h", "pq3h"], ["rag"]))

    lines = table.splitlines()
    assert lines[0].startswith("| guards off | pq2h | pq3h | pooled: share [95% CI], better / worse, questions |")
    assert [line.split(" |")[0] for line in lines[2:]] == [
        "| opera: options_line", "| mujica: date_comparison", "| omne: all"]
    # the per-question differences of both environments resampled together: 1, 0, 0, 0 and 0, -1, 1, 0
    assert lines[4] == ("| omne: all | +25.0 (1/0, 4 re-asked) | +0.0 (1/1, 4 re-asked) | "
                        "+12.5 [-25.0, +50.0], 2 / 1, 8 | +1.00, +0 |")
    # on pq2h none of opera's options_line fired: 0 on each of its questions, none asked again
    assert lines[2] == ("| opera: options_line | did not fire | +25.0 (1/0, 1 re-asked) | "
                        "+12.5 [+0.0, +37.5], 1 / 0, 8 | +0.00, +0 |")
    assert lines[3].startswith("| mujica: date_comparison | +25.0 (1/0, 4 re-asked) | not run | +25.0 [")
    assert lines[3].endswith(", 1 / 0, 4 | +0.00, +0 |")  # pq3h has no mujica runs: left out of the pool

    # a guards-off run still going: its environment says how far it is and stays out of the pool
    bench.R.path_of(LLM, "pq3h", "omne:guards=none", summary_args.results).unlink()
    write_run(summary_args, "pq3h", "omne:guards=none", scored("pq3h", [1, 1]))
    table = tables.guards_table(tables.summary_envs(summary_args, ["pq2h", "pq3h"], ["rag"]))
    assert "| omne: all | +25.0 (1/0, 4 re-asked) | 2 of 4 | +25.0 [+0.0, +75.0], 1 / 0, 4 | +1.00, +0 |" in table

    # a guard named off against the default run, even one today's default set leaves out
    assert variants.guards_off("opera:guards=-date_comparison") == ("opera", frozenset({"date_comparison"}))
    assert variants.guards_off("opera:guards=none")[1] == frozenset(
        n for n, g in GUARDS.items() if "opera" in g.agents)


def test_targets_say_met_or_missed_and_by_how_much(summary_args):
    write_run(summary_args, "pq2h", "rag", scored("pq2h", [0, 0, 0, 0], calls=1))
    write_run(summary_args, "pq2h", "omne", scored("pq2h", [1, 0, 0, 0]))  # +25
    write_run(summary_args, "pq2h", "opera", [r | {"trace": {"plan": [{"id": "1"}]}} for r in
                                              scored("pq2h", [0, 0, 0, 0.4])])  # +10, one sub-goal each
    why = [["NoProgress"], ["NoProgress"], ["NoProgress", "RoundCap"], None]  # the last from before `forced_by`
    write_run(summary_args, "pq2h", "mujica", [r | {"health": {"forced": 1} | ({"forced_by": w} if w else {})}
                                               for r, w in zip(scored("pq2h", [0, 0, 0, 0]), why)])
    rag_stage = [{"stage": "rag", "calls": 1, "seconds": 1.5}]  # its own rag stage: half its 3 s
    escalated = {"decisions": [{"stage": "rag", "action": "escalate"}, {"stage": "omne", "action": "answer"}],
                 "stages": rag_stage}
    write_run(summary_args, "pq2h", "auto", [r | {"route": escalated if i else {"decisions": [{"action": "stop"}],
                                                                                "stages": rag_stage}}
                                             for i, r in enumerate(scored("pq2h", [1, 0, 0, 0.6]))])  # +40: above omne
    write_run(summary_args, "hotpot", "rag", scored("hotpot", [1, 0, 0, 0], calls=1, repaired=1))
    write_run(summary_args, "hotpot", "opera", scored("hotpot", [1, 0, 0, 0.2]))  # +5
    write_run(summary_args, "hotpot", "auto", scored("hotpot", [1, 0, 0, 0.2], calls=3))  # +5
    agents = ["rag", "opera", "mujica", "omne", "auto"]
    rows = tables.targets_table(tables.summary_envs(summary_args, ["pq2h", "hotpot"], agents), agents).splitlines()

    assert rows[2] == ("| `auto` ≥ the best single design − 1 F1 on every environment (by the interval's lower bound) "
                       "| **met** | pq2h: 40.0 vs omne 25.0 (+15.0 [+0.0, +45.0]); hotpot: 30.0 vs opera 30.0 "
                       "(+0.0 [+0.0, +0.0]) |")  # each lower bound clears -1
    assert rows[3].startswith("| `auto` ≥ `rag` + 10, pooled over the KG environments (by the interval's lower "
                              "bound) | **within noise** | +40.0 [")  # 4 questions: the interval holds 10
    assert "over 4 questions in 4 clusters; these questions detect" in rows[3]
    assert rows[4].startswith("| `auto` ≥ `rag`, pooled over the text environments (by the interval's lower "
                              "bound) | **")
    assert rows[5] == ("| `auto`: at most 3× `rag`'s LLM calls and 3× its seconds | **met** | pooled by question "
                       "over 2 environments: 2.50× calls, 1.33× seconds (against its own `rag` stage's in 1, `rag`'s "
                       "run elsewhere); pq2h 2.00× / 2.00× (3 of 4 escalated, 2.0 calls each), hotpot 3.00× / 1.00× |")
    # hotpot's records hold no route: its seconds are against rag's run
    assert rows[6] == ("| every design ≥ `rag` on each KG environment (by the interval's lower bound) | "
                       "**within noise** | met 0 of 3 measured; within noise: opera on pq2h +10.0 [+0.0, +30.0], "
                       "mujica on pq2h +0.0 "
                       "[+0.0, +0.0], omne on pq2h +25.0 [+0.0, +75.0] |")  # 4 questions: no lower bound clears 0
    assert rows[7] == ("| the best design ≥ `rag` + 5 on each text environment (by the interval's lower bound) | "
                       "**within noise** | met 0 of 1 measured; within noise: opera on hotpot +5.0 [+0.0, +15.0] |")
    assert rows[8] == ("| Mujica: forced answers ≤ 25% of questions | **missed** | "
                       "pq2h 4 of 4 (NoProgress 3, RoundCap 1, not recorded 1) |")
    assert rows[9] == ("| OPERA: one-sub-goal plans on two-hop PathQuestion ≤ 20% | **missed** | "
                       "pq2h 4 of 4 (answered wrong 4) |")
    # on hotpot rag answered a format repair on each of its 4 questions: 4 of 4 calls
    assert rows[10].startswith("| no malformed runs; repairs ≤ 1% of calls (each run) | **missed** | "
                               "malformed runs: 0 of 32 questions; format-repair calls: rag 4 of 8, opera 0 of 16, "
                               "mujica 0 of 8, omne 0 of 8, auto 0 of 20;")
    assert rows[10].endswith("the highest share in one run: rag on hotpot, 4 of 4 (100.0%) |")

    write_run(summary_args, "pq2h", "omne", scored("pq2h", [1, 1, 0, 0]))  # 50: auto falls short by 10
    rows = tables.targets_table(tables.summary_envs(summary_args, ["pq2h"], agents), agents).splitlines()
    assert rows[2] == ("| `auto` ≥ the best single design − 1 F1 on every environment (by the interval's lower bound) "
                       "| **within noise** | pq2h: 40.0 vs omne 50.0 (-10.0 [-75.0, +45.0]) |")


def test_a_target_is_met_by_its_lower_bound_missed_by_its_upper_and_else_within_noise():
    """Issue 61's rule for every target read from an interval, and a target over several cells: missed if one is."""
    assert tables._read(12.0, (10.5, 14.0), 10.0) == "met"
    assert tables._read(12.0, (8.0, 16.0), 10.0) == "within noise"
    assert tables._read(-3.0, (-5.0, -2.0), -1.0) == "missed"
    assert tables._read(None, None, 0.0) == "not measured"
    assert tables._overall(["met", "within noise", "met"]) == "within noise"
    assert tables._overall(["met", "within noise", "missed"]) == "missed"
    assert tables._overall(["met", "met"]) == "met"
    cells = [{"agent": "omne", "env": "pq2h", "df1": 21.0, "ci": (8.0, 34.1)},
             {"agent": "omne", "env": "pq3h", "df1": 5.2, "ci": (-5.1, 14.6)}]
    assert tables._gain_target(cells, 0.0) == ("within noise", "met 1 of 2 measured; met: omne on pq2h +21.0 [+8.0, "
                                               "+34.1]; within noise: omne on pq3h +5.2 [-5.1, +14.6]")


def test_clustered_intervals_draw_paraphrases_together():
    """Four questions in two clusters: a bootstrap by cluster is wider than one by question."""
    diffs, clusters = [1.0, 1.0, 0.0, 0.0], ["a", "a", "b", "b"]
    assert paired_interval(diffs, clusters=clusters) == (0.0, 100.0)
    by_question = paired_interval(diffs * 10)
    assert 20 < by_question[0] and by_question[1] < 80
    assert paired_interval([1.0, 0.0], clusters=["a", "a"]) is None  # one cluster: no interval


def test_summary_reads_the_run_folders_and_writes_summary_md(summary_args, monkeypatch, capsys):
    write_run(summary_args, "pq2h", "rag", scored("pq2h", [1, 0, 0, 0]))
    write_run(summary_args, "pq2h", "omne", scored("pq2h", [1, 1, 0, 0]) + [record("pq2h-9", 1.0)])  # out of range
    monkeypatch.setattr(bench, "run_all", lambda *a: pytest.fail("--summary runs no eval"))
    monkeypatch.setattr("sys.argv", ["agents.py", "--summary", "--env", "pq2h", "--env", "hotpot", "--llm", LLM,
                                     "--limit", "4", "--out", str(summary_args.out),
                                     "--results", str(summary_args.results)])
    bench.main()
    text = (summary_args.out / "summary.md").read_text(encoding="utf-8")
    assert capsys.readouterr().out.strip() == text.strip()
    assert "| environment | questions (clusters) | rag | opera | mujica | omne |" in text  # direct has no run
    assert "| pq2h | 4 (4) | 25.0 | not run | not run | 50.0 (+25.0 [" in text
    assert "| hotpot | 4 (-) | not run | not run | not run | - |" in text
    assert "| pq2h | omne | 4 | 3.0 | 2.0 | 10 | - |" in text and "What the guards carry" not in text

    # records that count the prompt tokens read from the prefix cache: the tokens prefilled per question
    write_run(summary_args, "pq3h", "rag", [r | {"tokens": {"input": 8, "cached": 2 * n, "total": 10}}
                                            for n, r in enumerate(scored("pq3h", [1, 0, 0, 0]))])
    cells = tables.summary_envs(summary_args, ["pq3h"], ["rag"])
    assert "| pq3h | rag | 4 | 3.0 | 2.0 | 10 | 5 |" in tables.cost_table(cells, ["rag"])


def test_a_records_file_that_names_no_variant_is_left_out(folders):
    """A file beside the records (a one-off experiment) must not stand in for a variant."""
    env = bench.R.path_of(LLM, "pq2h", "rag", folders.results).parent
    (env / ("opera_by-hand" + bench.R.SUFFIX)).write_bytes((env / ("opera" + bench.R.SUFFIX)).read_bytes())
    assert tables.recorded_variants(folders, "pq2h") == {"opera": env / "opera.jsonl.gz", "rag": env / "rag.jsonl.gz"}


def test_records_are_compact_sorted_and_merged(folders):
    """Records keep what the tables read, no trace; a question asked again replaces its record; the same
    records give the same bytes."""
    path = bench.R.path_of(LLM, "pq2h", "rag", folders.results)
    first = bench.R.load(path)
    assert [r["id"] for r in first] == sorted(r["id"] for r in first) and "trace" not in first[0]
    assert set(first[0]) >= {"id", "cluster", "em", "f1", "latency", "llm_calls", "tokens", "health", "format_repairs"}
    before = path.read_bytes()
    bench.R.write(path, reversed(first))
    assert path.read_bytes() == before
    folder = bench.run_dir(folders.out, LLM, "pq2h", "rag")
    (folder / RESULTS).write_text(json.dumps({**first[0], "f1": 0.25}) + "\n", encoding="utf-8")
    assert bench.R.save(folder, path) == len(first)
    assert bench.R.load(path)[0]["f1"] == 0.25 and bench.R.load(path)[1] == first[1]


def test_a_run_asks_only_the_questions_the_records_lack(folders, monkeypatch):
    """A benchmark stopped on one machine goes on from the committed records on another: a complete records
    file is not asked again, a partial one asks only the ids it lacks."""
    commands = []
    monkeypatch.setattr(bench, "build_environments", lambda *a, **kw: None)
    monkeypatch.setattr(bench, "_run", lambda cmd, folder: commands.append(cmd))
    folders.store, folders.jobs = "embedded:///s", 1
    bench.run_all(folders, [("pq2h", "rag"), ("pq2h", "opera")])
    assert len(commands) == 1 and "--agent" in commands[0] and commands[0][commands[0].index("--agent") + 1] == "opera"
    ids = [q.id for q in load_questions("pathquestion", folders.data / "pathquestion" / "PQ-2H.txt")]
    assert commands[0][commands[0].index("--ids") + 1] == ",".join(sorted(ids[4:]))


def test_sigterm_stops_the_running_evals_and_starts_no_more(tmp_path: Path) -> None:
    """Killing the bench (SIGTERM) stops its eval children, which would otherwise hold their run folders' locks."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pids = tmp_path / "pids"
    child = f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); time.sleep(120)"
    script = tmp_path / "bench.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(SPEC.origin.rsplit('/', 1)[0])!r})
from concurrent.futures import ThreadPoolExecutor
from agents import start, stopping_children, wait
with ThreadPoolExecutor(2) as pool:  # four evals, two at a time
    with stopping_children():
        list(pool.map(lambda _: wait(start([sys.executable, "-c", {child!r}])), range(4)))
""")
    bench = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 2:
        time.sleep(0.1)
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 2
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=60) != 0
    time.sleep(1)
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert len(pids.read_text().split()) == 2  # the two queued evals never started


def test_a_design_takes_its_answers_from_autos_stage_and_asks_the_rest(folders):
    """auto ran OPERA on questions 0 and 1 (rag stopped on 2): OPERA's run gets those two, scored against the
    gold answer, with the stage's calls, seconds and tokens; the others are left to ask."""
    ids = [q.id for q in load_questions("pathquestion", folders.data / "pathquestion" / "PQ-2H.txt")]
    auto = bench.run_dir(folders.out, LLM, "pq2h", "auto")
    auto.mkdir(parents=True)
    stage = {"stage": "opera", "calls": 4, "seconds": 9.5, "tokens": {"input": 30, "output": 5, "total": 35}}
    rows = [{"id": ids[i], "answers": [f"answer_{i}"], "prediction": "x", "em": 0.0, "f1": 0.0, "latency": 12.0,
             "llm_calls": 5, "tokens": {"total": 50}, "health": {},
             "route": {"answered_by": "opera", "stages": [{"stage": "rag", "calls": 1}, stage],
                       "decisions": [{"stage": "rag", "action": "escalate"},
                                     {"stage": "opera", "action": "answer", "answer": answer}]}}
            for i, answer in ((0, "answer_0"), (1, "nobody"))]
    rows.append({"id": ids[2], "answers": ["answer_2"], "prediction": "answer_2", "em": 1.0, "f1": 1.0,
                 "latency": 2.0, "llm_calls": 1, "tokens": {"total": 9}, "health": {},
                 "route": {"answered_by": "rag", "stages": [{"stage": "rag", "calls": 1}],
                           "decisions": [{"stage": "rag", "action": "stop"}]}})
    (auto / RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    folders.limit = 6
    assert bench.from_auto(folders, "pq2h", "mujica") == 0 and bench.from_auto(folders, "pq2h", "rag") == 0
    opera = bench.run_dir(folders.out, LLM, "pq2h", "opera")
    (opera / RESULTS).unlink()
    assert bench.from_auto(folders, "pq2h", "opera") == 2
    assert bench.from_auto(folders, "pq2h", "opera") == 0  # never twice
    carried = read_records(opera / RESULTS)
    assert [(r["id"], r["f1"], r["llm_calls"], r["latency"], r["carried"]) for r in carried] == [
        (ids[0], 1.0, 4, 9.5, "auto"), (ids[1], 0.0, 4, 9.5, "auto")]
    assert carried[0]["tokens"]["total"] == 35 and "route" not in carried[0]
    # a stage handed rag's entities (auto's hand_over) is not the design's own run: nothing is carried from it
    handed = bench.run_dir(folders.out, LLM, "pq2h", "omne")
    for row in rows[:2]:
        row["route"]["stages"][1] |= {"stage": "omne", "start_from": ["x"]}
        row["route"]["decisions"][1]["stage"] = "omne"
    (auto / RESULTS).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert bench.from_auto(folders, "pq2h", "omne") == 0 and not (handed / RESULTS).exists()


def test_a_mechanism_is_compared_with_the_run_without_it_on_the_questions_both_answered(summary_args):
    write_run(summary_args, "pq2h", "mujica", scored("pq2h", [0, 0, 1, 0], calls=6))
    after = scored("pq2h", [1, 0, 1], calls=3)
    after[1]["health"]["forced"] = 1
    for asked, size in zip(after, (1, 2, 1)):  # a planner's plan: one sub-question, two, one
        asked["trace"]["plan"] = [{"question": f"q{n}"} for n in range(size)]
    write_run(summary_args, "pq2h", "mujica:plan_examples=plans", after)
    table = tables.mechanisms_table(summary_args, ["pq2h", "pq3h"], [("mujica", "mujica:plan_examples=plans")])
    assert "| `mujica` → `mujica:plan_examples=plans` | pq2h | 3 (3) | 33.3 → 66.7 | +33.3 [+0.0, +100.0] |" in table
    assert "| 6.00 → 3.00 | 3.0 → 3.0 | 0 of 3 → 1 of 3 | - → 2 of 3 |" in table and "pq3h" not in table
    assert tables.mechanisms_table(summary_args, ["pq3h"], [("mujica", "mujica:plan_examples=plans")]) is None
    summary_args.mechanism, summary_args.only_mechanisms = [["mujica", "mujica:plan_examples=plans"]], True
    alone = tables.summary(summary_args, ["pq2h", "pq3h"], ["rag", "mujica"])  # a slice where only the pair ran
    assert alone == table


def test_what_auto_did_counts_the_judge_of_a_second_look():
    """A question whose first answer was looked at again is counted by the second look's decision; each variant of
    auto has its row, with rag's F1 where it escalated."""
    def rec(qid: str, f1: float, *decisions: tuple[str, str, str]) -> dict:
        return {"id": qid, "f1": f1, "route": {"decisions": [
            {"stage": s, "action": a, "reason": r, "answer": "x"} for s, a, r in decisions]}}

    records = [rec("a", 1.0, ("rag", "stop", "found in its evidence")),
               rec("b", 1.0, ("rag", "look again", "found in its evidence"),
                   ("second_look", "stop", "the two answers agree")),
               rec("c", 0.0, ("rag", "look again", "found in its evidence"),
                   ("second_look", "escalate", "the two answers differ"), ("opera", "answer", "differs from rag")),
               rec("d", 0.5, ("rag", "escalate", "not in its evidence"), ("opera", "fallback", "no answer"))]
    golds = {"a": ["x"], "b": ["x"], "c": ["x"], "d": ["y"]}  # rag's answer "x": right on a-c, wrong on d
    records = [bench.R.compact(r | {"answers": golds[r["id"]]}) for r in records]  # each decision scored
    assert [d["f1"] for d in records[2]["route"]["decisions"]] == [1.0, 1.0, 1.0]
    table = tables.routes_table({"hotpot": {"runs": {"auto:second_look=true": {r["id"]: r for r in records},
                                                    "opera": {"a": records[0]}}}})
    assert "| hotpot | `auto:second_look=true` | 4 | 2 (100.0) | 2 (50.0) | 1 (0.0; 0 agree with rag) | 1 (50.0) |" \
        in table and "opera" not in table
    assert "the two answers differ 1, not in its evidence 1" in table


def test_the_confidence_report_says_how_well_confidence_splits_right_from_wrong(summary_args, monkeypatch):
    import confidence

    monkeypatch.setattr(confidence, "asked_ids", tables.asked_ids)
    write_run(summary_args, "hotpot", "rag:confidence=true",
              [r | {"confidence": c} for r, c in zip(scored("hotpot", [1, 0, 1, 0]), [0.9, 0.2, 0.95, 0.4])])
    summary_args.env = ["hotpot"]
    lines = confidence.reports(summary_args).splitlines()
    assert lines[0] == ("hotpot, questions 0-3: 4 answers with a confidence, rag F1 50.0, right (F1 >= 0.5) 2, "
                        "AUROC 1.00")
    assert "| 0.5 | 2 | 0.0 | 100.0 |" in lines and "| 0.95 | 3 | 33.3 | 100.0 |" in lines
    assert confidence.auroc([0.5, 0.5], [True, False]) == 0.5 and confidence.auroc([0.9], [True]) is None
    command = f"python bench/confidence.py --env hotpot --start 0 --limit 4 --llm {LLM}"
    block = doc.generated(command, summary_args.results)
    assert block.splitlines() == lines  # a generated block of docs/benchmarks.md


# -- slices: where defaults are chosen, where targets are read (issue 61, 3) ---------------------------
def sliced(**kwargs) -> argparse.Namespace:
    defaults = {"llm": "llamacpp:x", "agents": "rag,auto", "guards": None, "mechanism": [], "unseal": None,
                "slice": "sealed", "start": 0, "limit": None, "data": Path("d"), "store": "embedded:///s",
                "out": Path("o")}
    return argparse.Namespace(**(defaults | kwargs))


def test_the_sealed_slice_runs_the_frozen_defaults_only_unless_told_why():
    assert bench.check_sealed(sliced(), ["rag", "auto"]) is None
    assert "frozen defaults" in bench.check_sealed(sliced(), ["rag", "auto:min_confidence=0.3"])
    assert "--guards" in bench.check_sealed(sliced(guards="none"), ["rag"])
    assert "--mechanism" in bench.check_sealed(sliced(mechanism=[["a", "b"]]), ["rag"])
    assert bench.check_sealed(sliced(unseal="a one-off ablation"), ["auto:min_confidence=0.3"]) is None
    assert bench.check_sealed(sliced(slice="validation"), ["auto:min_confidence=0.3"]) is None


def test_a_slice_asks_its_own_range_of_each_environment():
    cmd = bench.eval_command(sliced(), "hotpot", "rag")
    assert cmd[cmd.index("--start") + 1] == "240" and cmd[cmd.index("--limit") + 1] == "60"
    cmd = bench.eval_command(sliced(slice="validation"), "pq2h", "rag")
    assert cmd[cmd.index("--start") + 1] == "140" and cmd[cmd.index("--limit") + 1] == "60"
    cmd = bench.eval_command(sliced(slice=None, start=7, limit=3), "pq2h", "rag")
    assert cmd[cmd.index("--start") + 1] == "7" and "2wiki-text" not in variants.SLICES["sealed"]
    cmd = bench.eval_command(sliced(slice=None, start=7), "pq2h", "rag")
    assert cmd[cmd.index("--limit") + 1] == str(variants.DEFAULT_LIMIT)


def test_a_limit_asks_the_first_questions_of_each_environments_slice():
    """A design's sealed run: `--slice sealed --limit 60` asks 240..299 of each environment, never beyond its
    slice, and the tables say so."""
    assert variants.span(sliced(limit=60), "pq2h") == (240, 60)
    assert variants.span(sliced(limit=500), "hotpot") == (240, 60)
    assert variants.asked_range(sliced(limit=60)) == "the sealed slice, its first 60 questions"
    assert variants.asked_range(sliced()) == "the sealed slice"


def test_sealed_records_carry_the_commit_and_settings_digest_they_were_first_made_with(tmp_path):
    stamp = bench.sealed_stamp(sliced(), ["rag", "auto"])
    assert len(stamp["settings"]) == 16 and stamp["commit"] and stamp["unsealed"] is None
    assert bench.sealed_stamp(sliced(), ["rag", "auto"]) == stamp
    assert bench.sealed_stamp(sliced(llm="llamacpp:y"), ["rag", "auto"])["settings"] != stamp["settings"]
    other = subprocess.run([sys.executable, "-c", "import json, sys; sys.path.insert(0, 'bench'); import agents; "
                            "from argparse import Namespace as N; print(agents.sealed_stamp(N(llm=" + repr(sliced().llm)
                            + ", unseal=None), ['rag', 'auto'])['settings'])"],
                           capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert other.stdout.strip() == stamp["settings"], other.stderr[-2000:]  # another process: the same digest
    folder, path = tmp_path / "run", tmp_path / "records.jsonl.gz"
    folder.mkdir()
    (folder / RESULTS).write_text(json.dumps({"id": "q1", "em": 1.0, "f1": 1.0, "latency": 1.0}) + "\n",
                                  encoding="utf-8")
    bench.R.save(folder, path, stamp={"commit": "abc", "settings": "s1", "unsealed": None})
    with (folder / RESULTS).open("a", encoding="utf-8") as f:
        f.write(json.dumps({"id": "q2", "em": 0.0, "f1": 0.0, "latency": 1.0}) + "\n")
    bench.R.save(folder, path, stamp={"commit": "def", "settings": "s1", "unsealed": None})
    assert [(r["id"], r["commit"]) for r in bench.R.load(path)] == [("q1", "abc"), ("q2", "def")]
