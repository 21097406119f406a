"""Regression tests of the probe findings of issue 45: store paths, JSON readers, torn exports, symlinks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mhqa_graph.errors import InvalidInput
from mhqa_graph.eval import run_eval
from mhqa_graph.export import read_records as export_records
from mhqa_graph.store import open_store
from mhqa_graph.testing.fakes import FakeChatModel


def mhqa(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mhqa_graph.cli", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("name, folder", [("st%231", "st#1"), ("q%3Fx", "q?x"), ("e%41f", "eAf"), ("p%25", "p%")])
def test_a_store_path_holding_uri_characters_keeps_its_database_inside(tmp_path, name, folder):
    """`embedded:st%231` is the folder `st#1`: its SQLite database is inside it, opened read-only too."""
    uri = f"embedded://{tmp_path}/{name}?embedder=hash"
    with open_store(uri) as store:
        store.add_triples("g", [("a", "r", folder)])
    assert sorted(os.listdir(tmp_path)) == [folder] and "store.sqlite" in os.listdir(tmp_path / folder)
    with open_store(uri, create=False, read_only=True) as reader:
        assert reader.node_info("g", "a").facts[0].other == folder


def test_two_stores_whose_names_differ_after_a_hash_do_not_share_a_database(tmp_path):
    with open_store(f"embedded://{tmp_path}/st%231?embedder=hash") as one, \
            open_store(f"embedded://{tmp_path}/st%232?embedder=hash") as two:
        one.add_triples("g", [("a", "r", "one")])
        two.add_triples("g", [("a", "r", "two")])
        assert one.node_info("g", "a").facts[0].other == "one" and two.node_info("g", "a").facts[0].other == "two"


def test_an_integer_too_long_to_read_and_an_infinite_number_are_bad_rows(tmp_path):
    rows = tmp_path / "t.jsonl"
    rows.write_text('["a", "r", "b"]\n["x", "r", ' + "9" * 5000 + ']\n["c", "r", 1e400]\n["d", "r", "e"]\n')
    store = f"embedded://{tmp_path}/s?embedder=hash"
    done = mhqa("ingest", "triples", str(rows), "--graph", "g", "--store", store, "--skip-bad")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "triples added: 2" in done.stdout and "skipped bad: 2" in done.stdout
    assert "t.jsonl:2: invalid JSON: Exceeds the limit" in done.stderr and "the number inf" in done.stderr
    strict = mhqa("ingest", "triples", str(rows), "--graph", "h", "--store", store)
    assert strict.returncode != 0 and "Traceback" not in strict.stderr and "t.jsonl:2" in strict.stderr


def test_export_reads_a_results_file_torn_inside_a_character(tmp_path):
    record = {"id": "q1", "question": "東京は?", "answers": ["東京"], "prediction": "東京", "em": 1.0, "f1": 1.0,
              "trace": {"schema_version": 1, "agent": "rag", "question": "東京は?"}}
    torn = json.dumps(record, ensure_ascii=False).encode("utf-8")
    cut = torn.index("東京".encode()) + 1  # inside the first character
    (tmp_path / "results.jsonl").write_bytes(json.dumps(record, ensure_ascii=False).encode() + b"\n" + torn[:cut])
    assert [r["id"] for r in export_records(tmp_path)] == ["q1"]


def test_a_symlink_planted_in_a_run_folder_is_refused_and_its_target_untouched(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"id": "q1", "question": "Who?", "answer": "x", "type": "bridge", "level": "easy",
                                "supporting_facts": {"title": ["P"], "sent_id": [0]},
                                "context": {"title": ["P"], "sentences": [["P is x."]]}}) + "\n")
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    for name in ("results.jsonl", "summary.json"):
        out = tmp_path / f"run-{name}"
        out.mkdir()
        (out / name).symlink_to(target)
        with pytest.raises(InvalidInput, match="symbolic link"):
            run_eval("rag", "hotpotqa", data, None, f"embedded://{tmp_path}/s?embedder=hash", out,
                     context_overrides={"llm": FakeChatModel(responses=["<answer>x</answer>"])}, progress=False)
    out = tmp_path / "run-tmp"
    out.mkdir()
    (out / "summary.json.tmp").symlink_to(target)
    run_eval("rag", "hotpotqa", data, None, f"embedded://{tmp_path}/s?embedder=hash", out,
             context_overrides={"llm": FakeChatModel(responses=["<answer>x</answer>"])}, progress=False)
    assert target.read_text() == "keep me" and json.loads((out / "summary.json").read_text())["n"] == 1


# -- integration as LangGraph users expect ---------------------------------------------------------------
@pytest.fixture
def wiki(tmp_path):
    from mhqa_graph.types import Passage

    store = open_store(f"embedded://{tmp_path}/w?embedder=hash")
    store.add_passages("wiki", [Passage("p1", "Inception", "Inception is a 2010 film directed by Christopher Nolan.")])
    yield store
    store.close()


def test_as_tool_with_a_checkpointer_answers_a_plain_invoke(wiki):
    from langgraph.checkpoint.memory import InMemorySaver
    from mhqa_graph.graphs import as_tool

    tool = as_tool("rag", checkpointer=InMemorySaver(), llm=FakeChatModel(responses=["<answer>Nolan</answer>"]),
                   store=wiki, corpus="wiki")
    assert tool.invoke({"question": "Who directed Inception?"}) == "Nolan"
    assert tool.invoke({"question": "Who directed Inception?"}) == "Nolan"  # a second call, a second thread


def test_settings_in_configurable_are_honoured_as_the_server_honours_them(wiki):
    from mhqa_graph.graphs import build_graph

    model = FakeChatModel(responses=["<answer>Nolan</answer>"])
    out = build_graph("rag").invoke({"question": "Who directed Inception?"},
                                    {"configurable": {"llm": model, "store": wiki, "corpus": "wiki", "top_k": 1}})
    assert out["answer"] == "Nolan" and len(out["retrieved"]) == 1


def test_a_typo_or_a_foreign_context_class_is_a_typed_error(wiki):
    from dataclasses import dataclass

    from mhqa_graph.graphs import build_graph

    with pytest.raises(InvalidInput, match=r"unknown setting\(s\) crpus \(did you mean 'corpus'\?\)"):
        build_graph("rag").invoke({"question": "Who?"}, context={"crpus": "wiki", "llm": "fake"})

    @dataclass
    class ParentContext:
        user: str = "me"

    with pytest.raises(InvalidInput, match="must be a BaselineContext, an AgentContext or a dict"):
        build_graph("rag").invoke({"question": "Who?"}, context=ParentContext())


def test_native_tool_mode_with_a_model_without_tools_says_so(wiki):
    from mhqa_graph.graphs import build_graph, make_context

    with pytest.raises(InvalidInput, match="tool_mode=native: FakeChatModel has no native tool calling"):
        make_context("omne", llm=FakeChatModel(responses=["x"]), store=wiki, corpus="wiki", tool_mode="native")
    out = build_graph("omne").invoke({"question": "Who?"}, context={  # a dict context: the run says why
        "llm": FakeChatModel(responses=["x"]), "store": wiki, "corpus": "wiki", "tool_mode": "native"})
    assert out["error"].startswith("InvalidInput: tool_mode=native: FakeChatModel has no native tool calling")


def test_an_eval_over_another_files_corpus_or_an_edited_file_is_refused(tmp_path):
    """Two files with the same name in different folders take the same environment name: the second is refused,
    not evaluated over the first's passages; a file edited in place is another run's file."""
    from mhqa_graph.eval.environments import EnvironmentMismatch
    from mhqa_graph.eval.runner import RunMismatch

    def rows(folder: str, answer: str) -> Path:
        (tmp_path / folder).mkdir()
        path = tmp_path / folder / "dev.jsonl"
        path.write_text(json.dumps({"id": "q1", "question": "Who?", "answer": answer, "context": {
            "title": [f"T {answer}"], "sentences": [[f"{answer} is it."]]}}) + "\n", encoding="utf-8")
        return path

    first, second = rows("A", "alpha"), rows("B", "beta")
    store = f"embedded://{tmp_path}/s?embedder=hash"
    model = {"llm": FakeChatModel(responses=["<answer>alpha</answer>"])}
    run_eval("rag", "hotpotqa", first, None, store, tmp_path / "ra", context_overrides=model, progress=False)
    with pytest.raises(EnvironmentMismatch, match=r"holds 'hotpotqa-dev', but not built from dev.jsonl"):
        run_eval("rag", "hotpotqa", second, None, store, tmp_path / "rb", context_overrides=model, progress=False)
    first.write_text(first.read_text().replace("Who?", "Who is it?"), encoding="utf-8")
    with pytest.raises(RunMismatch, match="file_sha256"):
        run_eval("rag", "hotpotqa", first, None, store, tmp_path / "ra", context_overrides=model, progress=False)


def test_a_write_error_drains_the_tasks_and_keeps_a_partial_summary(tmp_path):
    """ENOSPC on the third record, with 4 questions in flight: the error once, no pending task, the summary of
    the records written."""
    rows = tmp_path / "qa.jsonl"
    rows.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Where is {i}?", "answer": "x", "context": {
        "title": [f"T{i}"], "sentences": [[f"{i} is x."]]}}) + "\n" for i in range(12)), encoding="utf-8")
    script = tmp_path / "run.py"
    script.write_text(f"""
import errno, sys
from mhqa_graph.eval import run_eval
from mhqa_graph.eval.runner import ResultsWriter
from mhqa_graph.testing.fakes import FakeChatModel
write, n = ResultsWriter.write, [0]
def full(self, record):
    n[0] += 1
    if n[0] > 2:
        raise OSError(errno.ENOSPC, "No space left on device")
    write(self, record)
ResultsWriter.write = full
try:
    run_eval("direct", "hotpotqa", {str(rows)!r}, None, "embedded://{tmp_path}/s?embedder=hash",
             {str(tmp_path / 'run')!r},
             concurrency=4, context_overrides={{"llm": FakeChatModel(responses=["<answer>x</answer>"], latency=0.05)}},
             progress=False)
except OSError as exc:
    print("stopped:", exc.strerror)
""", encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert "stopped: No space left on device" in done.stdout, done.stderr
    assert "Task was destroyed" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["complete"] is False and summary["n"] == 2


def test_duplicate_question_ids_are_counted_not_silent(tmp_path, caplog):
    from mhqa_graph.eval.runner import load_questions

    rows = tmp_path / "qa.jsonl"
    rows.write_text("".join(json.dumps({"id": qid, "question": q, "answer": "x", "context": {
        "title": ["T"], "sentences": [["x."]]}}) + "\n" for qid, q in (("a", "one?"), ("b", "two?"), ("a", "three?"))))
    with caplog.at_level("WARNING"):
        items = load_questions("hotpotqa", rows)
    assert [i.question for i in items] == ["one?", "two?"]
    assert "1 question row skipped: it repeats an earlier row's id (the first: 'a')" in caplog.text


def test_report_and_resume_keep_only_the_fields_they_need(tmp_path):
    """A summary reads no trace: the records it holds keep the summary's fields only."""
    from mhqa_graph.eval.report import SUMMARY_FIELDS, read_records

    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"id": "q1", "em": 1.0, "f1": 1.0, "trace": {"llm_calls": ["x" * 10_000]}}) + "\n")
    kept = read_records(path, keep=SUMMARY_FIELDS)
    assert kept == [{"id": "q1", "em": 1.0, "f1": 1.0}] and "trace" in read_records(path)[0]


def test_an_eval_keeps_k_tasks_however_many_questions_are_queued(tmp_path, monkeypatch):
    """K workers take the questions in turn: the number of tasks is K, not the number of questions (a Ctrl-C
    cancels K tasks, not 50,000)."""
    import asyncio

    from mhqa_graph.eval import runner

    peak = {"tasks": 0}
    answer = runner._answer

    async def counting(*args, **kwargs):
        peak["tasks"] = max(peak["tasks"], len(asyncio.all_tasks()))
        return await answer(*args, **kwargs)

    monkeypatch.setattr(runner, "_answer", counting)
    rows = tmp_path / "qa.jsonl"
    rows.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Where is {i}?", "answer": "x", "context": {
        "title": ["T"], "sentences": [["x."]]}}) + "\n" for i in range(200)), encoding="utf-8")
    summary = run_eval("direct", "hotpotqa", rows, None, f"embedded://{tmp_path}/s?embedder=hash", tmp_path / "run",
                       concurrency=4, context_overrides={"llm": FakeChatModel(responses=["<answer>x</answer>"])},
                       progress=False)
    assert summary.n == 200 and peak["tasks"] <= 4 * 4, peak  # per worker: its question and the graph run


# -- issue 65, section 5: settings, specs and files -----------------------------------------------------
OUT_OF_RANGE = [
    ("rag", "model_timeout", float("nan"), "model_timeout must be a number from 0 to 86,400, got nan"),
    ("rag", "model_timeout", float("inf"), "model_timeout must be a number from 0 to 86,400, got inf"),
    ("rag", "model_timeout", 1e300, "model_timeout must be a number from 0 to 86,400, got 1e+300"),
    ("rag", "retry_backoff", float("nan"), "retry_backoff must be a number from 0 to 600, got nan"),
    ("rag", "top_k", 1001, "top_k must be an integer from 1 to 1,000, got 1001"),
    ("rag", "max_new_tokens", 10**5000,
     "max_new_tokens must be an integer from 1 to 32,768, got an integer of about 5,000 digits"),
    ("opera", "topk_schedule", (5, 2000), "topk_schedule must be an integer from 1 to 1,000, got 2000"),
    ("auto", "budget", "12", "budget must be an integer from 0 to 1,000, got '12'"),
    ("auto", "min_confidence", float("nan"), "min_confidence must be a number from 0 to 1, got nan"),
    ("omne", "context_chars", 10**7, "context_chars must be an integer from 0 to 1,000,000, got 10000000"),
]


@pytest.mark.parametrize(("agent", "name", "value", "message"), OUT_OF_RANGE,
                         ids=[f"{agent}-{name}-{i}" for i, (agent, name, _, _) in enumerate(OUT_OF_RANGE)])
def test_a_non_finite_or_out_of_range_setting_is_refused_naming_its_range(agent, name, value, message):
    """NaN passed `value < 0` (a NaN model_timeout failed every call at once), inf and 1e300 overflowed, top_k
    1001 passed and then failed every search."""
    from mhqa_graph.graphs import make_context

    with pytest.raises(InvalidInput) as refused:
        make_context(agent, llm="fake", corpus="wiki", **{name: value})
    assert str(refused.value) == message


def test_every_numeric_setting_has_a_range_that_holds_its_default():
    import dataclasses

    from mhqa_graph.graphs import SPECS, context_schema, make_context
    from mhqa_graph.graphs.settings import SETTING_RANGES

    for agent in SPECS:
        numeric = [f for f in dataclasses.fields(context_schema(agent))
                   if f.type in ("int", "float", "tuple[int, ...]")]
        assert [f.name for f in numeric if f.name not in SETTING_RANGES] == [], agent
        most = {f.name: SETTING_RANGES[f.name][1] for f in numeric if f.type != "tuple[int, ...]"}
        make_context(agent, llm="fake", corpus="wiki", **most)  # each bound is in its range


def test_a_probe_row_that_raises_or_times_out_is_a_failed_row_and_the_table_goes_on(monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_probes", Path(__file__).parents[1] / "bench" / "probes.py")
    probes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probes)

    def raises(tmp: Path):
        raise RuntimeError("boom\nsecond line")

    def times_out(tmp: Path):
        raise subprocess.TimeoutExpired(["mhqa", "eval"], 600)

    monkeypatch.setattr(probes, "PROBES", {"raises": raises, "times-out": times_out, "fine": lambda tmp: (2, 0, "ok")})
    monkeypatch.setattr(sys, "argv", ["probes.py"])
    probes.main()
    rows = [row.rsplit("|", 2)[0] for row in capsys.readouterr().out.splitlines()[2:]]  # without the seconds
    assert rows == ["| raises | 1 | 1 | stopped: RuntimeError: boom second line ",
                    "| times-out | 1 | 1 | stopped: TimeoutExpired: Command '['mhqa', 'eval']' timed out after 600 "
                    "seconds ",
                    "| fine | 2 | 0 | ok "]
