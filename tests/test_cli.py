"""The `mhqa` command line, run as a user runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mhqa_graph.cli import main


def mhqa(*args: str, store: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mhqa_graph.cli", *args]
    if store is not None:
        cmd += ["--store", f"embedded://{store}?embedder=hash"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture
def hotpot_rows(sample, tmp_path) -> Path:
    lines = (sample / "hotpotqa" / "demo.jsonl").read_text(encoding="utf-8").splitlines()[:5]
    path = tmp_path / "hotpot.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_ingest_query_and_stats(hotpot_rows, tmp_path):
    store = tmp_path / "store"
    first = mhqa("ingest", "dataset", "hotpotqa", str(hotpot_rows), "--name", "hp", store=store)
    assert first.returncode == 0, first.stderr
    assert "passages added: 50" in first.stdout
    again = mhqa("ingest", "dataset", "hotpotqa", str(hotpot_rows), "--name", "hp", store=store)
    assert "passages added: 0" in again.stdout

    stats = json.loads(mhqa("stats", "--json", store=store).stdout)
    assert stats["corpora"] == {"hp": {"passages": 50}} and stats["graphs"] == {}

    question = json.loads(hotpot_rows.read_text().splitlines()[0])
    hits = json.loads(mhqa("query", "search", "hp", question["question"], "-k", "3", "--json", store=store).stdout)
    assert len(hits) == 3 and {"id", "title", "text", "score"} <= set(hits[0])
    assert set(question["supporting_facts"]["title"]) & {h["title"] for h in hits}


def test_triples_and_graph_queries(tmp_path):
    kg = tmp_path / "kg.tsv"
    kg.write_text("Polish-Russian War\tdirector\tXawery Żuławski\nXawery Żuławski\tfather\tAndrzej Żuławski\n",
                  encoding="utf-8")
    store = tmp_path / "store"
    assert mhqa("ingest", "triples", str(kg), "--graph", "kg", store=store).returncode == 0
    node = json.loads(mhqa("query", "node", "kg", "Xawery Żuławski", "--json", store=store).stdout)
    assert {(f["relation"], f["other"], f["direction"]) for f in node["facts"]} == {
        ("father", "Andrzej Żuławski", "out"), ("director", "Polish-Russian War", "in")}
    matched = mhqa("query", "match", "kg", "polish russian war", "-k", "1", store=store)
    assert matched.stdout.split("  ", 1)[1].strip() == "Polish-Russian War"


def test_passages_file_with_bad_line(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "title": "A", "text": "alpha"}\nnot json\n{"id": "b", "title": "B", "text": "beta"}\n')
    store = tmp_path / "store"
    failed = mhqa("ingest", "passages", str(docs), "--corpus", "docs", store=store)
    assert failed.returncode == 2
    assert f"{docs}:2" in failed.stderr and "Traceback" not in failed.stderr
    kept = json.loads(mhqa("stats", "--json", store=store).stdout)
    assert kept["corpora"]["docs"]["passages"] == 1  # the row before the bad one is kept
    skipped = mhqa("ingest", "passages", str(docs), "--corpus", "docs", "--skip-bad", store=store)
    assert skipped.returncode == 0 and "skipped bad: 1" in skipped.stdout


def test_extract_with_fake_llm(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "title": "Sony", "text": "Sony was founded by Masaru Ibuka."}\n')
    store = tmp_path / "store"
    assert mhqa("ingest", "passages", str(docs), "--corpus", "docs", store=store).returncode == 0
    llm = 'fake:["Sony | founded by | Masaru Ibuka\\nthis line is noise"]'
    done = mhqa("ingest", "extract", "--corpus", "docs", "--graph", "kg", "--llm", llm, store=store)
    assert done.returncode == 0, done.stderr
    node = json.loads(mhqa("query", "node", "kg", "Sony", "--json", store=store).stdout)
    assert node["facts"] == [{"relation": "founded by", "other": "Masaru Ibuka", "direction": "out"}]


def test_typed_errors_are_one_line(tmp_path):
    store = tmp_path / "store"
    done = mhqa("query", "node", "nope", "x", store=store)
    assert done.returncode == 2
    assert "StoreNotFound" in done.stderr and "Traceback" not in done.stderr
    assert not store.exists()  # a reader never creates a store
    debug = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "--debug", "query", "node", "nope", "x",
                            "--store", f"embedded://{store}?embedder=hash"], capture_output=True, text=True)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    bad_uri = mhqa("stats", "--store", "ftp://nowhere")
    assert bad_uri.returncode == 2 and "InvalidStoreURI" in bad_uri.stderr


def test_models_list():
    rows = json.loads(mhqa("models", "list", "--json").stdout)
    assert {r["name"] for r in rows} >= {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "all-minilm-l6-v2"}
    assert all(r["extra"] in ("models", "models-qwen") for r in rows)


# -- user mistakes: each one line on stderr, exit 2, no traceback ------------------------------------------
@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> dict[str, str]:
    """A store with corpus `docs` and graph `kg`, a passages file, a benchmark file, an existing run folder."""
    root = tmp_path_factory.mktemp("mistakes")
    docs = root / "docs.jsonl"
    docs.write_text('{"id": "a", "title": "Inception", "text": "Inception is a film by Christopher Nolan."}\n')
    kg = root / "kg.tsv"
    kg.write_text("Inception\tdirected by\tChristopher Nolan\n", encoding="utf-8")
    bench = root / "hotpot.jsonl"
    bench.write_text(json.dumps({"id": "q1", "question": "Who directed Inception?", "answer": "Christopher Nolan",
                                 "type": "bridge", "level": "easy",
                                 "supporting_facts": {"title": ["Inception"], "sent_id": [0]},
                                 "context": {"title": ["Inception"],
                                             "sentences": [["Inception is a film by Christopher Nolan."]]}}) + "\n")
    store = f"embedded://{root / 'store'}?embedder=hash"
    for args in (["passages", str(docs), "--corpus", "docs"], ["triples", str(kg), "--graph", "kg"]):
        assert mhqa("ingest", *args, "--store", store).returncode == 0
    run = root / "run"
    done = mhqa("eval", str(bench), "--dataset", "hotpotqa", "--agent", "direct", "--out", str(run),
                "--llm", 'fake:["<answer>Christopher Nolan</answer>"]', "--store", store)
    assert done.returncode == 0, done.stderr
    return {"store": store, "docs": str(docs), "bench": str(bench), "run": str(run), "root": str(root)}


CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "train"
MISTAKES = {  # what the user typed -> what the one line must say
    "unknown command": (["evl"], "No such command 'evl'. Did you mean 'eval'?"),
    "unknown subcommand": (["query", "serch", "docs", "x"], "Did you mean 'search'?"),
    "unknown option": (["stats", "--bogus"], "No such option: --bogus"),
    "missing argument": (["query", "node", "kg"], "Missing argument 'name'; see 'mhqa query node --help'"),
    "missing option": (["eval", "{bench}", "--dataset", "hotpotqa", "--agent", "rag"], "Missing option '--out'"),
    "missing file": (["ingest", "passages", "missing.jsonl", "--corpus", "c", "--store", "{store}"],
                     "'missing.jsonl' does not exist"),
    "missing eval file": (["eval", "nofile.jsonl", "--dataset", "hotpotqa", "--agent", "rag", "--out", "x"],
                          "'nofile.jsonl' does not exist"),
    "not a number": (["query", "match", "kg", "x", "-k", "abc", "--store", "{store}"], "Invalid value for '-k'"),
    "k out of range": (["query", "match", "kg", "x", "-k", "0", "--store", "{store}"],
                       "k must be an integer in 1..1000"),
    "unknown search mode": (["query", "search", "docs", "x", "--mode", "fuzzy", "--store", "{store}"],
                            "mode must be one of"),
    "unknown corpus": (["query", "search", "nope", "x", "--store", "{store}"], "unknown corpus 'nope' in embedded://"),
    "unknown graph": (["query", "node", "nope", "x", "--store", "{store}"], "unknown graph 'nope' in embedded://"),
    "unknown entity": (["query", "node", "kg", "Tenet", "--store", "{store}"], "no entity named 'Tenet'"),
    "store that does not exist": (["stats", "--store", "embedded:///no/such/dir"], "no store at embedded:///no/such"),
    "plain path as store": (["stats", "--store", "/no/such/dir"], "did you mean embedded:///no/such/dir?"),
    "unknown store scheme": (["stats", "--store", "ftp://nowhere"], "InvalidStoreURI"),
    "unknown dataset": (["ingest", "dataset", "hotpot", "{bench}", "--name", "x", "--store", "{store}"],
                        "unknown dataset 'hotpot'"),
    "unknown agent": (["ask", "Who?", "--agent", "oprea", "--store", "{store}"], "unknown agent 'oprea'"),
    "unknown model spec": (["ask", "Who?", "--agent", "direct", "--llm", "gpt4"], "unknown chat model spec 'gpt4'"),
    "malformed fake spec": (["ask", "Who?", "--agent", "direct", "--llm", "fake:[x]"], "JSON list of strings"),
    "missing model folder": (["ask", "Who?", "--agent", "direct", "--llm", "hf:/missing"],
                             "neither a local folder nor a model"),
    "embedding pack as chat model": (["ask", "Who?", "--agent", "direct", "--llm", "all-minilm-l6-v2"],
                                     "is an embedding pack"),
    "empty question": (["ask", "  ", "--agent", "direct", "--llm", "fake"], "InvalidQuestion: question is empty"),
    "ask on a missing store": (["ask", "Who?", "--agent", "rag", "--corpus", "docs", "--llm", "fake",
                                "--store", "embedded:///no/such/dir"], "StoreNotFound"),
    "ask on an unknown corpus": (["ask", "Who?", "--agent", "rag", "--corpus", "dcos", "--llm", "fake",
                                  "--store", "{store}"], "unknown corpus 'dcos'"),
    "eval on a missing store": (["eval", "{bench}", "--dataset", "hotpotqa", "--agent", "rag", "--out", "{root}/r2",
                                 "--llm", "fake", "--store", "embedded:///no/such/dir"], "StoreNotFound"),
    "eval with a bad model": (["eval", "{bench}", "--dataset", "hotpotqa", "--agent", "rag", "--out", "{root}/r3",
                               "--llm", "gpt4", "--store", "{store}"], "unknown chat model spec 'gpt4'"),
    "eval into another run's folder": (["eval", "{bench}", "--dataset", "hotpotqa", "--agent", "rag", "--out",
                                        "{run}", "--llm", "fake", "--store", "{store}"],
                                       "holds another run (agent 'direct' -> 'rag'"),
    "eval with an unknown corpus": (["eval", "{bench}", "--dataset", "hotpotqa", "--agent", "rag", "--out",
                                     "{root}/r4", "--corpus", "nope", "--llm", "fake", "--store", "{store}"],
                                    "unknown corpus 'nope'"),
    "eval with a negative limit": (["eval", "{bench}", "--dataset", "hotpotqa", "--agent", "rag", "--out", "x",
                                    "--limit", "0"], "--limit must be >= 1"),
    "export in an unknown format": (["export", "{run}", "--format", "dpo", "--out", "{root}/e"],
                                    "unknown format 'dpo'"),
    "report on a missing folder": (["report", "runs/none"], "'runs/none' does not exist"),
    "train with an unknown method": (["train", "ppo", "--config", "{bench}"], "ppo"),
    "a teacher for a method without one": (["train", "mapgrpo", "--config", str(CONFIGS / "mapgrpo.yaml"),
                                            "--teacher", "llamacpp:qwen2.5-coder-1.5b"],
                                           "a teacher is an Omne or MyGO setting"),
    "extract with a bad model": (["ingest", "extract", "--corpus", "docs", "--graph", "g", "--llm", "gpt4",
                                  "--store", "{store}"], "unknown chat model spec"),
    "trace into a missing folder": (["ask", "Who?", "--agent", "direct", "--llm", "fake", "--trace",
                                     "/no/such/dir/t.json"], "the folder /no/such/dir does not exist"),
    "demo with a missing data folder": (["demo", "--data", "/no/such/data", "--llm", "fake"],
                                        "/no/such/data/hotpotqa/dev_a.jsonl not found: put HotpotQA's distractor dev "
                                        "rows, Hugging Face layout, one JSON object a line "
                                        "(https://hotpotqa.github.io/) there, or leave out --data to run on the "
                                        "bundled sample"),
}


def run_main(args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """`mhqa ARGS` in this process (as `main()` runs it, minus the interpreter start): exit code, stderr."""
    monkeypatch.setattr(sys, "argv", ["mhqa", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    return exited.value.code, capsys.readouterr().err


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_user_mistake_is_one_line_and_exit_2(filled, mistake, capsys, monkeypatch):
    args, expected = MISTAKES[mistake]
    code, stderr = run_main([a.format(**filled) for a in args], capsys, monkeypatch)
    lines = stderr.strip().splitlines()
    assert code == 2, (code, stderr)
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]


def test_a_mistake_run_as_a_user_runs_it():
    done = mhqa("eval", "nofile.jsonl", "--dataset", "hotpotqa", "--agent", "rag", "--out", "x")
    assert done.returncode == 2
    assert done.stderr == ("error: Invalid value for 'file': file 'nofile.jsonl' does not exist; "
                           "see 'mhqa eval --help'\n")


def test_there_are_at_least_25_mistakes():
    assert len(MISTAKES) >= 25


# -- eval run folders ---------------------------------------------------------------------------------------
def test_eval_run_folder_records_its_run_and_refuses_another(filled, tmp_path):
    run = Path(filled["run"])
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["agent"] == "direct" and manifest["dataset"] == "hotpotqa"
    assert manifest["llm"] == 'fake:["<answer>Christopher Nolan</answer>"]'
    assert manifest["file"] == filled["bench"] and manifest["settings"] == {}
    args = ["eval", filled["bench"], "--dataset", "hotpotqa", "--agent", "direct", "--store", filled["store"]]
    other = mhqa(*args, "--out", str(run), "--llm", 'fake:["<answer>Nolan</answer>"]')
    assert other.returncode == 2 and "holds another run (llm" in other.stderr and "--force-new" in other.stderr
    assert json.loads((run / "results.jsonl").read_text())["prediction"] == "Christopher Nolan"  # untouched
    fresh = mhqa(*args, "--out", str(run), "--llm", 'fake:["<answer>Nolan</answer>"]', "--force-new")
    assert fresh.returncode == 0, fresh.stderr
    assert [json.loads(line)["prediction"] for line in (run / "results.jsonl").read_text().splitlines()] == ["Nolan"]
    assert json.loads((run / "run.json").read_text())["llm"] == 'fake:["<answer>Nolan</answer>"]'


def test_eval_announces_its_ingest_and_uses_a_given_corpus(filled, tmp_path):
    store = f"embedded://{tmp_path / 'store'}?embedder=hash"
    assert mhqa("ingest", "passages", filled["docs"], "--corpus", "docs", "--store", store).returncode == 0
    args = ["eval", filled["bench"], "--dataset", "hotpotqa", "--agent", "rag", "--llm",
            'fake:["<answer>Christopher Nolan</answer>"]', "--store", store]
    built = mhqa(*args, "--out", str(tmp_path / "a"))
    assert built.returncode == 0, built.stderr
    assert "ingest hotpot.jsonl into 'hotpotqa-hotpot' in embedded://" in built.stderr
    again = mhqa(*args, "--out", str(tmp_path / "b"))
    assert "ingest" not in again.stderr  # built once
    given = mhqa(*args, "--out", str(tmp_path / "c"), "--corpus", "docs")
    assert given.returncode == 0 and "ingest" not in given.stderr
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["environment"]["corpus"] == "docs" and summary["complete"] is True


CHILD = """
import signal
import sys
import mhqa_graph.models.factory as factory
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a terminal, even if our launcher ignores it
from mhqa_graph.testing.fakes import FakeChatModel
# every model call takes 0.5 s, so the run is still going when the test interrupts it
factory.load_chat_model = lambda spec, **kw: FakeChatModel(responses=["<answer>Tulsa</answer>"], latency=0.5)
from mhqa_graph.cli import main
sys.argv = ["mhqa", *sys.argv[1:]]
main()
"""


def test_eval_ctrl_c_writes_a_partial_summary_and_exits_130(sample, tmp_path):
    import signal
    import time

    store = f"embedded://{tmp_path / 'store'}?embedder=hash"
    out = tmp_path / "run"
    args = ["eval", str(sample / "hotpotqa" / "demo.jsonl"), "--dataset", "hotpotqa", "--agent", "direct",
            "--llm", "fake", "--limit", "20", "-k", "1", "--out", str(out), "--store", store]
    assert mhqa("ingest", "passages", str(tmp_path / "none.jsonl"), "--corpus", "x", "--store", store).returncode == 2
    (tmp_path / "one.jsonl").write_text('{"id": "a", "title": "A", "text": "alpha"}\n')
    assert mhqa("ingest", "passages", str(tmp_path / "one.jsonl"), "--corpus", "x", "--store", store).returncode == 0
    child = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 240
    while not (results.exists() and results.read_text().count("\n") >= 2):
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.1)
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=60)
    done = results.read_text().count("\n")
    assert child.returncode == 130, stderr
    assert f"interrupted at {done}/20; rerun the same command to resume" in stderr and "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["n"], summary["complete"], summary["questions"]) == (done, False, 20)


def test_export_roles_skips_a_role_without_rows(filled, tmp_path):
    pytest.importorskip("datasets")
    replies = [json.dumps({"subgoals": ["Who directed Inception?"]}),
               json.dumps({"sufficient": True, "answer": "Christopher Nolan"}), "Christopher Nolan"]
    run = tmp_path / "opera"
    done = mhqa("eval", filled["bench"], "--dataset", "hotpotqa", "--agent", "opera", "--corpus", "docs",
                "--llm", "fake:" + json.dumps(replies), "--store", filled["store"], "--out", str(run))
    assert done.returncode == 0, done.stderr
    exported = mhqa("export", str(run), "--format", "roles", "--out", str(tmp_path / "roles"))
    assert exported.returncode == 0, exported.stderr
    notes = [line for line in exported.stderr.splitlines() if line.startswith("note:")]
    assert notes == [f"note: no rewrite rows in {run}; the rewrite split is skipped"]
    assert "plan: 1 rows, analysis: 1 rows ->" in exported.stdout
    assert not (tmp_path / "roles" / "rewrite.jsonl").exists()
    nothing = mhqa("export", filled["run"], "--format", "roles", "--out", str(tmp_path / "none"))
    assert nothing.returncode == 2 and nothing.stderr.startswith("error: TraceError: nothing to export as roles")


def test_stats_never_loads_the_embedder(filled, tmp_path):
    """`mhqa stats` reads counts only: even an embedder that cannot load is never touched."""
    import shutil
    import sqlite3

    root = tmp_path / "copy"
    shutil.copytree(Path(filled["root"]) / "store", root)
    with sqlite3.connect(root / "store.sqlite") as db:
        db.execute("UPDATE meta SET value = 'st:/no/such/model' WHERE key = 'embedder'")
    stats = mhqa("stats", "--json", "--store", f"embedded://{root}")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["corpora"]["docs"] == {"passages": 1}
    search = mhqa("query", "search", "docs", "film", "--store", f"embedded://{root}")
    assert search.returncode == 2 and "/no/such/model" in search.stderr  # a search needs it


def test_models_list_shows_whole_names_in_80_columns():
    listed = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "models", "list"], capture_output=True,
                            text=True, env={**os.environ, "COLUMNS": "80"})
    assert listed.returncode == 0, listed.stderr
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "all-minilm-l6-v2", "smollm2-135m"):
        assert name in listed.stdout
    assert "…" not in listed.stdout


def test_demo_with_a_fake_model(sample, pq_2h, tmp_path):
    """The demo's --data path on a folder of real rows (the bundled sample's first HotpotQA rows, PathQuestion lines),
    a hash-embedder store and a scripted model: every agent shows its steps and its answer beside the gold one,
    then the summary line."""
    data = tmp_path / "data"
    (data / "hotpotqa").mkdir(parents=True)
    (data / "pathquestion").mkdir()
    rows = (sample / "hotpotqa" / "demo.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    (data / "hotpotqa" / "dev_a.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    for name, lines in pq_2h.items():
        (data / "pathquestion" / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    gold = json.loads(rows[0])["answer"]
    store = f"embedded://{tmp_path / 'demo'}?embedder=hash"
    args = ["demo", "--data", str(data), "--store", store, "--llm", f'fake:["<answer>{gold}</answer>"]']
    done = mhqa(*args)
    assert done.returncode == 0, done.stderr
    for agent in ("direct", "rag", "opera", "mujica", "omne", "auto"):
        assert f"{agent} Q: " in done.stdout
    assert "rag: escalate (not in its evidence)" in done.stdout and "omne: answer (" in done.stdout
    assert "(no retrieval: the model's own knowledge)" in done.stdout and "retrieved: " in done.stdout
    assert "plan: " in done.stdout and "level 0: q1 " in done.stdout and "(no tool call)" in done.stdout
    assert f"gold: {gold!r}" in done.stdout and "gold: 'united kingdom'" in done.stdout
    # direct, rag and OPERA (its synthesis; its plan was not JSON) say the gold answer; Mujica, Omne and auto cannot
    assert "3 of 6 agents answered correctly" in done.stdout and "total time" in done.stdout
    assert re.search(r"total time .*\(step 1 [\d.]+ s, step 2 [\d.]+ s, step 3 [\d.]+ s, step 4 ", done.stdout)
    assert "  step 4: " in done.stdout
    again = mhqa(*args)
    assert "hotpotqa-dev_a: in the store already" in again.stdout


def test_the_demo_runs_from_a_bare_clone_on_the_bundled_sample(tmp_path):
    """Without --data (nothing beside the clone), the demo runs on the sample the package bundles: its HotpotQA
    question (gold Tulsa) for the text agents and its 2Wiki evidence graph's first question for omne and auto
    (issue 64, 1)."""
    from mhqa_graph.demo import BUNDLED

    assert sum(f.stat().st_size for f in BUNDLED[0][1].parent.parent.rglob("*") if f.is_file()) < 1_000_000
    store = f"embedded://{tmp_path / 'demo'}?embedder=hash"
    done = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "demo", "--store", store, "--llm",
                           'fake:["<answer>Tulsa</answer>"]'], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hotpotqa-demo: 300 passages" in done.stdout
    assert "2wiki-demo_evidences: 0 passages, 78 triples" in done.stdout
    assert "Tinted Windows" in done.stdout and "gold: 'Tulsa'" in done.stdout and "gold: 'Grammy'" in done.stdout
    assert "match_entities: Sunday Papers" in done.stdout
    assert "3 of 6 agents answered correctly" in done.stdout
    assert "--corpus hotpotqa-demo or --graph 2wiki-demo_evidences" in done.stdout


def test_ask_exits_1_when_the_run_failed_and_prints_the_answer_before_the_trace(tmp_path):
    """A script can tell a failed run (no answer) from an answered one; the answer is printed, then the trace
    written; --decoding is accepted as by eval."""
    failed = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "ask", "Who?", "--agent", "direct", "--llm",
                             'fake:["<answer></answer>"]'], capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "note: MalformedOutput" in failed.stderr and "Traceback" not in failed.stderr
    trace = tmp_path / "t.json"
    done = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "ask", "Who?", "--agent", "direct", "--llm",
                           'fake:["<answer>Nolan</answer>"]', "--decoding", "prompt", "--trace", str(trace)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "Nolan"
    assert json.loads(trace.read_text())["answer"] == "Nolan"
