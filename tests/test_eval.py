"""The evaluation runner, environments, CLI and reports, with scripted models and a hash-embedder store."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from mhqa_graph.errors import InvalidInput
from mhqa_graph.eval import compare, compare_table, environment_name, plot, prepare, read_records, run_eval
from mhqa_graph.eval.runner import cut_torn_line
from mhqa_graph.ingest.datasets import dataset_passages
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel

# id -> (question, gold, type, what the scripted model replies; None = the model call fails)
ROWS = {
    "q1": ("Which city did the band Alpha first perform in?", "Tulsa", "bridge", "<answer>Tulsa</answer>"),
    "q2": ("Are Alpha and Beta both rock bands?", "yes", "comparison", "<answer>no</answer>"),
    "q3": ("Who founded Gamma Records?", "John Smith", "bridge", "<answer>John</answer>"),
    "q4": ("In which year was Delta born?", "1817", "bridge", None),
    "q5": ("Which is older, Epsilon or Zeta?", "Epsilon", "comparison", "<answer>Epsilon</answer>"),
    "q6": ("   ", "nothing", "bridge", "<answer>nothing</answer>"),  # empty question: InvalidQuestion
}


def hotpot_row(rid: str, question: str, answer: str, qtype: str) -> dict:
    title = f"Page {rid}"
    return {"id": rid, "question": question, "answer": answer, "type": qtype, "level": "easy",
            "supporting_facts": {"title": [title], "sent_id": [0]},
            "context": {"title": [title, "Filler"],
                        "sentences": [[f"{title} is about {answer}.", f" {question} The answer is {answer}."],
                                      ["Nothing to see here."]]}}


def write_dataset(path: Path, rows: dict = ROWS) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for rid, (question, answer, qtype, _) in rows.items():
            f.write(json.dumps(hotpot_row(rid, question, answer, qtype)) + "\n")
    return path


def scripted(rows: dict = ROWS, delay: float = 0.0, peak: dict | None = None) -> FakeChatModel:
    """A model that answers each question of `rows` with its scripted reply (or fails)."""
    lock = threading.Lock()
    state = {"now": 0}

    def respond(messages):
        with lock:
            state["now"] += 1
            if peak is not None:
                peak["max"] = max(peak.get("max", 0), state["now"])
        try:
            time.sleep(delay)
            text = messages[-1].text.rsplit("Question:", 1)[-1]
            for question, _, _, reply in rows.values():
                if question.strip() and question in text:
                    if reply is None:
                        raise RuntimeError("backend down")
                    return reply
            return "<answer>unknown</answer>"
        finally:
            with lock:
                state["now"] -= 1

    return FakeChatModel(respond=respond)


@pytest.fixture
def setup(tmp_path):
    return write_dataset(tmp_path / "tiny.jsonl"), f"embedded://{tmp_path}/s?embedder=hash", tmp_path / "run"


def lines(out: Path) -> list[dict]:
    raw = (out / "results.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    return [json.loads(x) for x in raw.splitlines()]


def test_records_and_summary(setup):
    data, store, out = setup
    model = scripted()
    s = run_eval("rag", "hotpotqa", data, None, store, out, concurrency=3, context_overrides={"llm": model},
                 progress=False)
    records = {r["id"]: r for r in lines(out)}
    assert sorted(records) == sorted(ROWS) and len(lines(out)) == len(ROWS)
    assert (records["q1"]["prediction"], records["q1"]["em"], records["q1"]["f1"]) == ("Tulsa", 1.0, 1.0)
    assert records["q3"]["f1"] == pytest.approx(2 / 3) and records["q3"]["em"] == 0.0
    assert records["q4"]["error"].startswith("ModelError") and not records["q4"]["failed"]
    assert records["q6"]["error"].startswith("InvalidQuestion") and records["q6"]["failed"]
    assert records["q6"]["llm_calls"] == 0 and records["q6"]["trace"]["error"].startswith("InvalidQuestion")
    r1 = records["q1"]
    assert r1["answers"] == ["Tulsa"] and r1["type"] == "bridge" and r1["hops"] == 2 and r1["latency"] > 0
    assert r1["llm_calls"] == 1 and r1["tokens"]["input"] > 0
    assert r1["tokens"]["total"] == r1["tokens"]["input"] + r1["tokens"]["output"]
    assert r1["trace"]["design"]["source"] == "corpus:hotpotqa-tiny" and r1["trace"]["steps"][0]["retrieved"]
    assert [c["role"] for c in r1["trace"]["llm_calls"]] == ["answer"]

    assert s.n == 6 and s.failures == 1 and s.with_error == 2
    assert s.em == pytest.approx(2 / 6) and s.f1 == pytest.approx((1 + 2 / 3 + 1) / 6)
    assert s.by_type["bridge"].n == 4 and s.by_type["bridge"].f1 == pytest.approx((1 + 2 / 3) / 4)
    assert s.by_type["comparison"].em == pytest.approx(0.5)
    assert s.by_hops["2"].n == 6
    assert s.llm_calls_per_question == pytest.approx(5 / 6)
    assert s.environment == {"corpus": "hotpotqa-tiny", "graph": None, "ingested": True}
    assert s.latency_p50 <= s.latency_p90
    saved = json.loads((out / "summary.json").read_text())
    assert saved["f1"] == pytest.approx(s.f1) and saved["agent"] == "rag" and saved["llm"] == "FakeChatModel"
    assert saved["by_type"]["comparison"]["n"] == 2


def test_rerun_skips_finished_ids_and_the_built_environment(setup):
    data, store, out = setup
    run_eval("rag", "hotpotqa", data, None, store, out, context_overrides={"llm": scripted()}, progress=False)
    model = scripted()
    s = run_eval("rag", "hotpotqa", data, None, store, out, context_overrides={"llm": model}, progress=False)
    assert model.calls == [] and len(lines(out)) == 6 and s.n == 6
    assert s.environment["ingested"] is False


def test_resume_after_a_partial_run(setup):
    data, store, out = setup
    first = scripted()
    s = run_eval("rag", "hotpotqa", data, None, store, out, limit=2, context_overrides={"llm": first},
                 progress=False)
    assert s.n == 2 and sorted(r["id"] for r in lines(out)) == ["q1", "q2"]
    second = scripted()
    s = run_eval("rag", "hotpotqa", data, None, store, out, context_overrides={"llm": second}, progress=False)
    ids = [r["id"] for r in lines(out)]
    assert sorted(ids) == sorted(ROWS) and len(ids) == len(set(ids)) and s.n == 6
    assert len(first.calls) == 2 and len(second.calls) == 3  # q3, q4, q5 (q6 never reaches the model)


def test_torn_last_line_is_cut_and_redone(setup):
    data, store, out = setup
    run_eval("rag", "hotpotqa", data, None, store, out, limit=3, context_overrides={"llm": scripted()},
             progress=False)
    with (out / "results.jsonl").open("ab") as f:
        f.write(b'{"id": "q4", "question": "In which ye')
    assert sorted(r["id"] for r in read_records(out / "results.jsonl")) == ["q1", "q2", "q3"]
    s = run_eval("rag", "hotpotqa", data, None, store, out, context_overrides={"llm": scripted()}, progress=False)
    ids = [r["id"] for r in lines(out)]  # every line parses
    assert sorted(ids) == sorted(ROWS) and len(ids) == 6 and s.n == 6


def test_cut_torn_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"id": 1}\n{"id": 2}\n{"id": 3, "x')
    assert cut_torn_line(path) == len(b'{"id": 3, "x')
    assert path.read_bytes() == b'{"id": 1}\n{"id": 2}\n'
    assert cut_torn_line(path) == 0
    path.write_bytes(b"no newline at all")
    cut_torn_line(path)
    assert path.read_bytes() == b""


def test_concurrency_keeps_k_questions_in_flight(tmp_path):
    rows = {f"c{i}": (f"What is the code of item {i}?", f"code {i}", "bridge", f"<answer>code {i}</answer>")
            for i in range(8)}
    data = write_dataset(tmp_path / "many.jsonl", rows)
    peak: dict = {}
    start = time.perf_counter()
    s = run_eval("rag", "hotpotqa", data, None, f"embedded://{tmp_path}/s?embedder=hash", tmp_path / "run",
                 concurrency=4, context_overrides={"llm": scripted(rows, delay=0.3, peak=peak)}, progress=False)
    assert s.n == 8 and s.em == 1.0
    assert peak["max"] == 4
    assert s.wall_time is not None and time.perf_counter() - start < 8 * 0.3 + 5


def test_bad_arguments(setup):
    data, store, out = setup
    with pytest.raises(InvalidInput):
        run_eval("rag", "hotpotqa", data, "fake", store, out, concurrency=0, progress=False)
    empty = data.with_name("empty.jsonl")
    empty.write_text("")
    with pytest.raises(InvalidInput, match="no questions"):
        run_eval("rag", "hotpotqa", empty, "fake", store, out, progress=False)


# -- environments ------------------------------------------------------------------------------
def wiki_row(rid: str, with_context: bool) -> dict:
    row = {"_id": rid, "type": "compositional", "question": f"Who is the father of Ann {rid}?",
           "answer": f"Bob {rid}", "supporting_facts": [[f"Ann {rid}", 0]],
           "evidences": [[f"Ann {rid}", "father", f"Bob {rid}"], [f"Bob {rid}", "spouse", f"Cat {rid}"]]}
    if with_context:
        row["context"] = [[f"Ann {rid}", [f"Ann {rid} is the daughter of Bob {rid}."]]]
    return row


def test_prepare_builds_what_each_dataset_offers(tmp_path):
    evid = tmp_path / "dev_evidences.json"
    evid.write_text(json.dumps([wiki_row("1", False), wiki_row("2", False)]))
    ctx = tmp_path / "dev_context.jsonl"
    ctx.write_text("\n".join(json.dumps(wiki_row(str(i), True)) for i in range(3)) + "\n")
    hotpot = write_dataset(tmp_path / "tiny.jsonl")
    kb = tmp_path / "2H-kb.txt"
    kb.write_text("ann_x\tfather\tbob_x\nbob_x\tspouse\tcat_x\n")
    pq = tmp_path / "PQ-2H.txt"
    pq.write_text("who is ann_x 's father ?\tbob_x(bob_x/)\tann_x#father#bob_x#<end>#bob_x\n")
    with open_store(f"embedded://{tmp_path}/s?embedder=hash") as store:
        name = environment_name("2wiki", evid)
        assert prepare(store, "2wiki", evid, name) == {"corpus": None, "graph": name, "ingested": True}
        assert store.stats().graphs[name]["triples"] == 4
        assert prepare(store, "2wiki", evid, name)["ingested"] is False
        name = environment_name("2wiki", ctx)
        assert prepare(store, "2wiki", ctx, name) == {"corpus": name, "graph": name, "ingested": True}
        name = environment_name("hotpotqa", hotpot)
        assert prepare(store, "hotpotqa", hotpot, name) == {"corpus": name, "graph": None, "ingested": True}
        assert environment_name("pathquestion", pq) == environment_name("pathquestion", kb) == "pathquestion-2H-kb"
        env = prepare(store, "pathquestion", pq, "pathquestion-2H-kb")
        assert env["graph"] == "pathquestion-2H-kb" and env["corpus"] is None
        assert store.node_info("pathquestion-2H-kb", "ann x").facts
        # an interrupted build (fewer items than the file) is completed
        store.add_passages("partial", list(dataset_passages("hotpotqa", hotpot))[:2])
        assert prepare(store, "hotpotqa", hotpot, "partial")["ingested"] is True
        assert store.stats().corpora["partial"]["passages"] == store.stats().corpora[name]["passages"]


def test_pathquestion_eval_gives_the_topic_entity(tmp_path):
    (tmp_path / "2H-kb.txt").write_text("ann_x\tfather\tbob_x\nbob_x\tspouse\tcat_x\n")
    pq = tmp_path / "PQ-2H.txt"
    pq.write_text("who is ann_x 's father 's wife ?\tcat_x(cat_x/)\tann_x#father#bob_x#spouse#cat_x#<end>#cat_x\n")
    seen = []

    def respond(messages):
        seen.append(messages[-1].text)
        return "<answer>cat x</answer>"

    s = run_eval("rag", "pathquestion", pq, None, f"embedded://{tmp_path}/s?embedder=hash", tmp_path / "run",
                 context_overrides={"llm": FakeChatModel(respond=respond)}, progress=False)
    assert s.em == 1.0 and s.environment["graph"] == "pathquestion-2H-kb"
    assert "bob x" in seen[0]  # the facts of the topic entity "ann x" were shown
    record = lines(tmp_path / "run")[0]
    assert record["trace"]["design"]["retrieved"][0]["entity"] == "ann x"


def test_an_edited_row_the_sample_misses_is_refused_by_the_files_sha256(tmp_path):
    """A passage of a 400-row file and a fact of a 400-fact KB edited after their environments were built, where the
    17-item sample never looks: each collection keeps the sha256 of its file (a PathQuestion graph: its KB's), so the
    edit is an EnvironmentMismatch, as is a bigger file of the same name; a store built before the sha256 was kept
    still gets the sample check (issue 65)."""
    from mhqa_graph.eval.environments import EnvironmentMismatch, survey
    from mhqa_graph.ingest.runner import environment_sha256, ingest

    rows = {f"q{i}": (f"Where is town {i}?", "Tulsa", "bridge", None) for i in range(400)}
    data = write_dataset(tmp_path / "big.jsonl", rows)
    (tmp_path / "pq").mkdir()
    kb = tmp_path / "pq" / "2H-kb.txt"
    kb.write_text("".join(f"e{i}\tr\te{i + 1}\n" for i in range(400)), encoding="utf-8")
    pq = tmp_path / "pq" / "PQ-2H.txt"
    pq.write_text("where is e0\te2\te0#r#e1#r#e2\n", encoding="utf-8")
    name, kg = environment_name("hotpotqa", data), environment_name("pathquestion", pq)
    with open_store(f"embedded://{tmp_path}/s?embedder=hash") as store:
        assert prepare(store, "hotpotqa", data, name)["ingested"] and prepare(store, "pathquestion", pq, kg)["graph"]
        assert store.file_sha256("corpus", name) == environment_sha256("hotpotqa", data)
        assert store.file_sha256("graph", kg) == environment_sha256("pathquestion", pq)
        assert store.file_sha256("graph", name) is None
    data.write_text(data.read_text(encoding="utf-8").replace("\n", "\r\n") + "\n", encoding="utf-8")
    with open_store(f"embedded://{tmp_path}/s?embedder=hash", read_only=True) as store:  # the same items, rewritten
        assert survey(store, "hotpotqa", data, name).complete
    with open_store(f"embedded://{tmp_path}/old?embedder=hash") as old:  # no sha256: as built before issue 65
        ingest(old, corpus=name, passages=dataset_passages("hotpotqa", data))
    original = data.read_text(encoding="utf-8").replace("\r\n", "\n")
    data.write_text(original.replace("Page q7 is about Tulsa.", "Page q7 is about Boston."), encoding="utf-8")
    kb.write_text(kb.read_text(encoding="utf-8").replace("e7\tr\te8\n", "e7\tr\te9\n"), encoding="utf-8")
    with open_store(f"embedded://{tmp_path}/s?embedder=hash", read_only=True) as store:
        with pytest.raises(EnvironmentMismatch, match=r"holds 'hotpotqa-big', but not built from big.jsonl .*sha256"):
            survey(store, "hotpotqa", data, name)
        with pytest.raises(EnvironmentMismatch, match="2H-kb.txt .*sha256"):
            survey(store, "pathquestion", pq, kg)
    with open_store(f"embedded://{tmp_path}/s?embedder=hash") as store:
        write_dataset(data, {**rows, "q400": ("Where else?", "Tulsa", "bridge", None)})  # more rows: not completed
        with pytest.raises(EnvironmentMismatch, match="sha256"):
            prepare(store, "hotpotqa", data, name)
        assert store.stats().corpora[name]["passages"] == 401
    with open_store(f"embedded://{tmp_path}/old?embedder=hash", read_only=True) as old:
        data.write_text(original.replace("Page q7 is about Tulsa.", "Page q7 is about Boston."), encoding="utf-8")
        assert survey(old, "hotpotqa", data, name).complete  # what the sample cannot see
        data.write_text(original.replace("Page q0 is about Tulsa.", "Page q0 is about Boston."), encoding="utf-8")
        with pytest.raises(EnvironmentMismatch, match="passage"):
            survey(old, "hotpotqa", data, name)


# -- CLI and reports --------------------------------------------------------------------------
def cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mhqa_graph.cli", *args], capture_output=True, text=True,
                          timeout=120, **kwargs)


def test_cli_eval_and_report(setup, tmp_path):
    data, store, _ = setup
    run_a, run_b = tmp_path / "runs" / "rag", tmp_path / "runs" / "direct"
    typo = f"embedded://{tmp_path}/no/such/store?embedder=hash"  # a new store folder, but its parent is missing
    assert cli("eval", str(data), "--dataset", "hotpotqa", "--agent", "rag", "--store", typo,
               "--out", str(run_a)).returncode == 2
    assert cli("ingest", "dataset", "hotpotqa", str(data), "--name", "tiny", "--store", store).returncode == 0
    res = cli("eval", str(data), "--dataset", "hotpotqa", "--agent", "rag", "--llm", 'fake:["<answer>Tulsa</answer>"]',
              "--store", store, "--concurrency", "2", "--out", str(run_a))
    assert res.returncode == 0, res.stderr
    assert "EM" in res.stdout and len(lines(run_a)) == 6
    res = cli("eval", str(data), "--dataset", "hotpotqa", "--agent", "direct", "--llm", 'fake:["<answer>no</answer>"]',
              "--store", store, "--limit", "3", "--out", str(run_b))
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_b / "summary.json").read_text())
    assert summary["n"] == 3 and summary["agent"] == "direct" and summary["llm"] == 'fake:["<answer>no</answer>"]'

    png = tmp_path / "report.png"
    res = cli("report", str(run_a), str(run_b), "--out", str(png), env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    assert "2 runs on the 3 questions they share" in res.stdout
    assert "type=comparison" in res.stdout and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    res = cli("eval", str(data), "--dataset", "squad", "--agent", "rag", "--out", str(run_b))
    assert res.returncode == 2 and "unknown dataset" in res.stderr


def test_compare_restricts_to_shared_questions(setup, tmp_path):
    data, store, _ = setup
    run_eval("rag", "hotpotqa", data, None, store, tmp_path / "a", context_overrides={"llm": scripted()},
             progress=False)
    run_eval("direct", "hotpotqa", data, "fake:[\"<answer>Tulsa</answer>\"]", store, tmp_path / "b", limit=2,
             progress=False)
    summaries = compare([tmp_path / "a", tmp_path / "b"])
    a, b = summaries["a"], summaries["b"]
    assert a.n == b.n == 2  # q1, q2
    assert (a.em, b.em) == (0.5, 0.5) and a.agent == "rag" and b.agent == "direct"
    table = compare_table(summaries)
    assert table.row_count > 5
    assert plot(summaries, tmp_path / "p" / "x.png").stat().st_size > 1000


# -- a real kill ------------------------------------------------------------------------------
SCRIPT = textwrap.dedent("""
    import sys
    from mhqa_graph.eval import run_eval
    from mhqa_graph.testing.fakes import FakeChatModel
    data, store, out, latency = sys.argv[1:5]
    run_eval("rag", "hotpotqa", data, None, store, out, concurrency=3, progress=False,
             context_overrides={"llm": FakeChatModel(responses=["<answer>x</answer>"], latency=float(latency))})
""")


def test_sigkill_then_rerun_leaves_each_question_once(tmp_path):
    """Kill the eval with SIGKILL at several points, resuming each time; then finish it."""
    rows = {f"k{i}": (f"What is the name of thing {i}?", "x", "bridge", None) for i in range(40)}
    data = write_dataset(tmp_path / "many.jsonl", rows)
    store, out = f"embedded://{tmp_path}/s?embedder=hash", tmp_path / "run"
    results = out / "results.jsonl"
    counts = []
    for kill_at in (3, 11, 19, 27):
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(data), store, str(out), "0.1"])
        try:
            deadline = time.time() + 60
            while time.time() < deadline and (not results.exists() or results.read_bytes().count(b"\n") < kill_at):
                time.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
        counts.append(results.read_bytes().count(b"\n"))
        [json.loads(line) for line in results.read_text().splitlines()[:-1]]  # complete lines parse
    assert counts == sorted(counts) and 3 <= counts[0] and counts[-1] < 40, counts
    subprocess.run([sys.executable, "-c", SCRIPT, str(data), store, str(out), "0"], check=True, timeout=120)
    ids = [r["id"] for r in lines(out)]
    assert sorted(ids) == sorted(rows) and len(ids) == len(set(ids))
    assert json.loads((out / "summary.json").read_text())["n"] == 40


def test_eval_records_export_to_sft(setup, tmp_path):
    """An eval run's records carry full traces: sft export trains on the agent's replies."""
    datasets = pytest.importorskip("datasets")
    from mhqa_graph.export import export

    data, store, out = setup
    run_eval("rag", "hotpotqa", data, None, store, out, context_overrides={"llm": scripted()}, progress=False)
    export(out, "sft", tmp_path / "sft", min_reward=1.0)
    rows = datasets.load_from_disk(str(tmp_path / "sft"))
    assert len(rows) == 2  # the two questions answered exactly
    for row in rows:
        trained = [m for m in row["messages"] if m["weight"] > 0]
        assert [m["role"] for m in trained] == ["assistant"] and row["prediction"] in trained[0]["content"]


def test_the_summary_caption_runs_at_the_consoles_width(setup, capsys, monkeypatch):
    """The caption under an eval's summary table is printed at the console's width, not wrapped into the narrow
    table's column, and an unknown evidence recall reads `-`, not `-%` (issue 64, 4)."""
    from mhqa_graph.eval.report import summarize, summary_table

    monkeypatch.setenv("COLUMNS", "200")
    data, store, out = setup
    run_eval("rag", "hotpotqa", data, None, store, out, limit=1, context_overrides={"llm": scripted()})
    first = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("failures"))
    assert "LLM calls per question" in first
    record = {"id": "1", "em": 0.0, "f1": 0.0, "latency": 1.0, "llm_calls": 1, "tokens": {"total": 1},
              "diagnostics": {"evidence_recall": None, "failure": None}}
    assert summary_table(summarize([record])).caption.endswith("gold evidence seen -")
