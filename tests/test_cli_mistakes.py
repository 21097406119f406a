"""A newcomer's mistakes and rough edges (issue 30): each mistake exits 2 with one stderr line and no
traceback; text holding square brackets is shown as it is; traces export; OPERA can be scripted
without its grounding guard; `ingest dataset` names its environment and `eval` starts from nothing."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mhqa_graph.cli import main

BRACKETS = "The map reads Inception -[director]-> Christopher Nolan [/bold] [red]."


def mhqa(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mhqa_graph.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def run_main(args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    """`mhqa ARGS` in this process: exit code, stderr."""
    monkeypatch.setattr(sys, "argv", ["mhqa", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    return exited.value.code, capsys.readouterr().err


def one_line(code: int, stderr: str, expected: str) -> None:
    lines = stderr.strip().splitlines()
    assert code == 2, (code, stderr)
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]


HOTPOT_ROW = {"id": "q1", "question": "Who directed Inception?", "answer": "Christopher Nolan", "type": "bridge",
              "level": "easy", "supporting_facts": {"title": ["Inception"], "sent_id": [0]},
              "context": {"title": ["Inception"], "sentences": [["Inception is a film by Christopher Nolan."]]}}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """A store with corpus `docs` (one passage holding square brackets) and graph `kg`, a HotpotQA file,
    empty files, an eval run, a folder without a run and a mistyped training config."""
    root = tmp_path_factory.mktemp("newcomer")
    docs = root / "docs.jsonl"
    docs.write_text(json.dumps({"id": "a", "title": "Inception [/bold]", "text": BRACKETS}) + "\n", encoding="utf-8")
    kg = root / "kg.tsv"
    kg.write_text("Inception\tdirected by\tChristopher Nolan\n", encoding="utf-8")
    bench = root / "hotpot.jsonl"
    bench.write_text(json.dumps(HOTPOT_ROW) + "\n", encoding="utf-8")
    (root / "empty.jsonl").write_text("", encoding="utf-8")
    (root / "blank.tsv").write_text("\n\n", encoding="utf-8")
    (root / "norun").mkdir()
    (root / "bad.yaml").write_text("model:\n  lora_r: sixteen\n", encoding="utf-8")
    store = f"embedded://{root / 'store'}?embedder=hash"
    for args in (["passages", str(docs), "--corpus", "docs"], ["triples", str(kg), "--graph", "kg"]):
        done = mhqa("ingest", *args, "--store", store)
        assert done.returncode == 0, done.stderr
    return {"root": str(root), "store": store, "bench": str(bench), "docs": str(docs)}


NEWCOMER_MISTAKES = {  # issue 30's list -> what the one line must say
    "report on a folder without a run": (["report", "{root}/norun"], "holds no eval run (no results.jsonl)"),
    "ask with neither --corpus nor --graph": (["ask", "Who?", "--agent", "rag", "--llm", "fake", "--store", "{store}"],
                                              "give --corpus NAME or --graph NAME"),
    "an empty fake script": (["ask", "Who?", "--agent", "direct", "--llm", "fake:[]"], "fake:[] scripts no reply"),
    "a misspelt URI option": (["stats", "--store", "embedded://{root}/store?embeder=hash"],
                              "unknown option 'embeder' (known: embedder); did you mean embedder=?"),
    "a misspelt neo4j URI option": (["stats", "--store", "neo4j://localhost:7687?databse=x"],
                                    "did you mean database=?"),
    "an empty passages file": (["ingest", "passages", "{root}/empty.jsonl", "--corpus", "c", "--store", "{store}"],
                               "empty.jsonl holds no passages"),
    "an empty triples file": (["ingest", "triples", "{root}/blank.tsv", "--graph", "g", "--store", "{store}"],
                              "blank.tsv holds no triples"),
    "an empty dataset file": (["ingest", "dataset", "hotpotqa", "{root}/empty.jsonl", "--store", "{store}"],
                              "holds no hotpotqa passages or triples"),
    "2wiki on a HotpotQA file (ingest)": (["ingest", "dataset", "2wiki", "{bench}", "--store", "{store}"],
                                          "looks like a hotpotqa file, not 2wiki; pass --dataset hotpotqa"),
    "2wiki on a HotpotQA file (eval)": (["eval", "{bench}", "--dataset", "2wiki", "--agent", "rag", "--out",
                                         "{root}/r2", "--llm", "fake", "--store", "{store}"],
                                        "looks like a hotpotqa file, not 2wiki"),
    "a wrongly typed training value": (["train", "mygo", "--config", "{root}/bad.yaml"],
                                       "model.lora_r must be an integer, got 'sixteen'"),
    "grpo from a trace file": (["export", "{root}/trace.json", "--format", "grpo", "--out", "{root}/g"],
                               "a trace file has no gold answers"),
    "an unknown guard for ask": (["ask", "Who?", "--agent", "direct", "--llm", "fake", "--guards", "groundd"],
                                 "unknown guard(s) 'groundd'"),
}


@pytest.mark.parametrize("mistake", list(NEWCOMER_MISTAKES))
def test_each_newcomer_mistake_is_one_line_and_exit_2(files, mistake, capsys, monkeypatch):
    args, expected = NEWCOMER_MISTAKES[mistake]
    if mistake == "a wrongly typed training value":
        pytest.importorskip("mhqa_graph.training.mygo", reason="the train extra reads training configs")
    if mistake == "grpo from a trace file":
        pytest.importorskip("datasets")
        trace = Path(files["root"]) / "trace.json"
        if not trace.exists():
            done = mhqa("ask", "Who?", "--agent", "direct", "--llm", 'fake:["<answer>Nolan</answer>"]',
                        "--trace", str(trace))
            assert done.returncode == 0, done.stderr
    code, stderr = run_main([a.format(**files) for a in args], capsys, monkeypatch)
    one_line(code, stderr, expected)


def test_a_mistyped_training_value_fails_before_any_model_loads(files, capsys, monkeypatch):
    pytest.importorskip("mhqa_graph.training.mygo", reason="the train extra reads training configs")
    import mhqa_graph.training as training

    def no_training(*args, **kwargs):
        raise AssertionError("train() ran: the model would have loaded")

    monkeypatch.setattr(training, "train", no_training)
    code, stderr = run_main(["train", "mygo", "--config", f"{files['root']}/bad.yaml"], capsys, monkeypatch)
    one_line(code, stderr, "lora_r must be an integer")


def test_a_neo4j_uri_without_the_extra_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "neo4j", None)  # as if the neo4j extra were not installed
    monkeypatch.delitem(sys.modules, "mhqa_graph.store.neo4j_backend", raising=False)
    code, stderr = run_main(["stats", "--store", "neo4j://localhost:7687"], capsys, monkeypatch)
    one_line(code, stderr, "a Neo4j store needs the neo4j extra (neo4j is missing); pip install 'mhqa-graph[neo4j]'")


def test_the_mistakes_as_a_user_runs_them(files):
    """Two of them in a fresh interpreter, exactly as a shell script sees them."""
    done = mhqa("report", f"{files['root']}/norun")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"error: InvalidInput: {files['root']}/norun holds no eval run (no results.jsonl); "
                           "pass folders written by `mhqa eval --out`\n")
    done = mhqa("stats", "--store", f"embedded://{files['root']}/store?embeder=hash")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


# -- item 1: text with square brackets is shown as it is ------------------------------------------------
def test_ask_stream_shows_square_brackets_as_they_are(files):
    answer = "Where was [entity from step 1] born? [/bold]"
    done = mhqa("ask", "Who directed Inception?", "--agent", "rag", "--corpus", "docs", "--stream",
                "--llm", "fake:" + json.dumps([f"<answer>{answer}</answer>"]), "--store", files["store"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == answer
    assert "-[director]->" in done.stderr and "[/bold] [red]" in done.stderr and "[entity from step 1]" in done.stderr
    assert "MarkupError" not in done.stderr


def test_query_search_shows_square_brackets_as_they_are(files):
    done = mhqa("query", "search", "docs", "Inception", "--store", files["store"])
    assert done.returncode == 0, done.stderr
    assert "Inception [/bold] (a)" in done.stdout and "-[director]-> Christopher Nolan [/bold] [red]." in done.stdout


def test_demo_shows_square_brackets_as_they_are(files):
    """The demo's agent section, with a question, a passage and an answer holding markup-like text."""
    from rich.console import Console

    from mhqa_graph.demo import _agent
    from mhqa_graph.ingest.datasets import QAItem
    from mhqa_graph.store import open_store
    from mhqa_graph.testing.fakes import FakeChatModel

    console = Console(file=io.StringIO(), width=200)
    item = QAItem(id="q", question="Where was [entity from step 1] born? [/bold]", answers=("[red]",))
    model = FakeChatModel(responses=["<answer>[/red] -[director]-></answer>"])
    with open_store(files["store"], create=False) as store:
        for agent in ("rag", "direct"):
            _agent(agent, [item], model, store, {"corpus": "docs"} if agent == "rag" else {}, console)
    shown = console.file.getvalue()
    assert "rag Q: Where was [entity from step 1] born? [/bold]" in shown
    assert "answer: '[/red] -[director]->'   gold: '[red]'" in shown
    assert "retrieved: Inception [/bold]" in shown


# -- item 5: a trace file exports ------------------------------------------------------------------------
def test_a_trace_from_ask_and_from_the_recorder_exports(files, tmp_path):
    pytest.importorskip("datasets")
    from mhqa_graph.graphs import build_graph, make_context

    from mhqa_graph.traces import run_with_trace

    replies = [json.dumps({"subgoals": ["Who directed Inception?"]}),
               json.dumps({"sufficient": True, "answer": "Christopher Nolan"}), "Christopher Nolan"]
    trace = tmp_path / "opera.json"
    done = mhqa("ask", "Who directed Inception?", "--agent", "opera", "--corpus", "docs", "--llm",
                "fake:" + json.dumps(replies), "--store", files["store"], "--trace", str(trace))
    assert done.returncode == 0, done.stderr
    exported = mhqa("export", str(trace), "--format", "roles", "--out", str(tmp_path / "roles"))
    assert exported.returncode == 0, exported.stderr
    assert "plan: 1 rows, analysis: 1 rows ->" in exported.stdout
    row = json.loads((tmp_path / "roles" / "analysis.jsonl").read_text().splitlines()[0])
    assert row["step_answer"] == "Christopher Nolan" and row["reward"] is None and row["answers"] == []

    # run_with_trace returns (output, trace); a JSON list of such traces is a trace file too
    context = make_context("direct", llm="fake:" + json.dumps(["<think>known</think><answer>Nolan</answer>"]))
    output, recorded = run_with_trace(build_graph("direct"), "direct", "Who directed Inception?", context)
    assert output["answer"] == "Nolan" and recorded.answer == "Nolan"
    listed = tmp_path / "traces.json"
    listed.write_text(json.dumps([recorded.model_dump(mode="json")] * 2), encoding="utf-8")
    sft = mhqa("export", str(listed), "--format", "sft", "--out", str(tmp_path / "sft"))
    assert sft.returncode == 0, sft.stderr
    assert "sft: 2 rows ->" in sft.stdout


# -- item 6: OPERA scripted without the grounding guard -----------------------------------------------
def opera_roles(fake_llms, analysis_answer: str) -> dict:
    return fake_llms("opera", plan=[json.dumps({"subgoals": ["Where was Andrzej Żuławski born?"]})],
                     analysis=[json.dumps({"sufficient": True, "answer": analysis_answer})],
                     rewrite=[json.dumps({"query": "Andrzej Żuławski birthplace"})], answer=["Lwów"])


def test_opera_analysis_not_in_a_passage_is_a_guard_that_scripts_switch_off(mhqa_store, fake_llms):
    """An analysis answer that no shown passage contains ('Lwów': the passage says 'Lviv') is marked
    insufficient by the `analysis_grounded` guard, and a rewrite follows; `guards="none"` (or
    "-analysis_grounded") takes the scripted reply as it is."""
    from mhqa_graph.graphs import build_graph, make_context

    graph = build_graph("opera")
    question = {"question": "Where was Andrzej Żuławski born?"}
    roles = opera_roles(fake_llms, "Lwów")
    guarded = graph.invoke(question, context=make_context("opera", role_llms=roles, store=mhqa_store, corpus="docs"))
    assert not guarded["steps"][0]["sufficient"] and roles["rewrite"].calls
    assert "analysis_grounded" in [f["guard"] for f in guarded["guards"]]
    for guards in ("none", "-analysis_grounded"):
        roles = opera_roles(fake_llms, "Lwów")
        out = graph.invoke(question, context=make_context("opera", role_llms=roles, store=mhqa_store, corpus="docs",
                                                          guards=guards))
        assert out["steps"][0]["sufficient"] and out["steps"][0]["answer"] == "Lwów", guards
        assert roles["rewrite"].calls == [] and out["answer"] == "Lwów"
        assert "analysis_grounded" not in [f["guard"] for f in out["guards"]]
    roles = opera_roles(fake_llms, "Lviv")  # or script an answer the passage holds word for word
    out = graph.invoke(question, context=make_context("opera", role_llms=roles, store=mhqa_store, corpus="docs"))
    assert out["steps"][0]["sufficient"] and roles["rewrite"].calls == []


def test_ask_takes_guards(files):
    replies = [json.dumps({"subgoals": ["Who directed Inception?"]}),
               json.dumps({"sufficient": True, "answer": "Chris Nolan Jr"}), json.dumps({"query": "x"}), "Nolan"]
    args = ["ask", "Who directed Inception?", "--agent", "opera", "--corpus", "docs", "--llm",
            "fake:" + json.dumps(replies), "--store", files["store"], "--json"]
    out = json.loads(mhqa(*args, "--guards", "none").stdout)
    assert out["trace"]["design"]["guards"] == []
    assert out["trace"]["design"]["steps"][0]["answer"] == "Chris Nolan Jr"


# -- item 8: ingest names its environment, eval starts from nothing ----------------------------------------
def test_ingest_dataset_names_its_environment_as_eval_does(files, tmp_path):
    store = f"embedded://{tmp_path / 'store'}?embedder=hash"
    done = mhqa("ingest", "dataset", "hotpotqa", files["bench"], "--store", store)
    assert done.returncode == 0, done.stderr
    stats = json.loads(mhqa("stats", "--json", "--store", store).stdout)
    assert stats["corpora"] == {"hotpotqa-hotpot": {"passages": 1}}
    run = mhqa("eval", files["bench"], "--dataset", "hotpotqa", "--agent", "rag", "--out", str(tmp_path / "run"),
               "--llm", 'fake:["<answer>Christopher Nolan</answer>"]', "--store", store)
    assert run.returncode == 0, run.stderr
    assert "ingest" not in run.stderr  # the environment ingest dataset built


@pytest.mark.parametrize("folder", ["empty", "new"])
def test_eval_starts_from_an_empty_or_new_store_folder(files, tmp_path, folder):
    root = tmp_path / "store"
    if folder == "empty":
        root.mkdir()
    done = mhqa("eval", files["bench"], "--dataset", "hotpotqa", "--agent", "rag", "--out", str(tmp_path / "run"),
                "--llm", 'fake:["<answer>Christopher Nolan</answer>"]', "--store", f"embedded://{root}?embedder=hash")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["f1"] == 1.0
    assert (root / "store.sqlite").is_file()


# -- issue 65, section 5: what raised an untyped exception is one line -------------------------------------
PACK = "llamacpp:qwen2.5-coder-1.5b"
LONG_NAME = "lora" + "x" * 296
ASK = ["ask", "Who?", "--agent", "direct", "--llm"]
UNTYPED = {  # -> the start of the one line
    "~user in an hf spec": ([*ASK, "hf:~nosuchuser/model"],
                            "error: ModelError: llm: '~nosuchuser/model': '~nosuchuser' cannot be expanded: no such "
                            "user or home directory"),
    "~user in a lora path": ([*ASK, f"{PACK}?lora=file:~nosuchuser/a.gguf"],
                             "error: ModelError: llm: '~nosuchuser/a.gguf': '~nosuchuser' cannot be expanded"),
    "~user in a store path": (["stats", "--store", "embedded://~nosuchuser/s"],
                              "error: InvalidStoreURI: '~nosuchuser/s': '~nosuchuser' cannot be expanded"),
    "a 5,000-digit thread count": ([*ASK, f"{PACK}?threads={'9' * 5000}"],
                                   "error: ModelError: llm: llamacpp: threads must be a positive integer of at most 9 "
                                   "digits, got '99999"),
    "an unclosed IPv6 bracket": (["stats", "--store", "neo4j://u:p@[::1"],
                                 "error: InvalidStoreURI: 'neo4j://u:p@[::1': Invalid IPv6 URL"),
    "a 300-character lora name": ([*ASK, f"{PACK}?lora={LONG_NAME}"],
                                  "error: ModelError: llm: llamacpp: lora must name a shipped adapter (omne-pq2h), "
                                  "got 'loraxxx"),
    "a NaN model timeout": ([*ASK, "fake", "--model-timeout", "nan"],
                            "error: InvalidInput: model_timeout must be a number from 0 to 86,400, got nan"),
}


@pytest.mark.parametrize("case", list(UNTYPED))
def test_what_raised_an_untyped_exception_is_one_short_line(case, capsys, monkeypatch):
    """`~nosuchuser` (pathlib's RuntimeError), int() of 5,000 digits, urlsplit's ValueError, a 300-character name
    echoed whole (a file name too long: OSError), a NaN timeout that failed every call."""
    args, expected = UNTYPED[case]
    code, stderr = run_main(args, capsys, monkeypatch)
    one_line(code, stderr, expected)
    assert stderr.startswith(expected) and len(stderr) < 400 and LONG_NAME not in stderr, stderr


@pytest.mark.parametrize(("text", "expected"), [
    ("[]", "is not a run's record (a JSON list, not an object)"),
    ('{"agent": ', "cannot be read as a run's record (Expecting value"),
])
def test_a_run_json_that_is_no_object_is_refused_in_one_line(files, tmp_path, text, expected, capsys, monkeypatch):
    """It was taken as "the same run" (a list: no key differs) or raised on resume (torn)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text(text, encoding="utf-8")
    code, stderr = run_main(["eval", files["bench"], "--dataset", "hotpotqa", "--agent", "direct", "--llm", "fake",
                             "--store", f"embedded://{tmp_path}/s?embedder=hash", "--out", str(out)], capsys,
                            monkeypatch)
    one_line(code, stderr, f"error: RunMismatch: {out / 'run.json'} {expected}")
    assert not (out / "results.jsonl").exists()


def test_an_out_folder_and_a_model_spec_holding_markup_are_printed_as_they_are(files, tmp_path):
    """`--out 'ex[/bold]'` crashed in rich markup after the export was written; so did `mhqa report` of a run whose
    model spec holds `[/bold]`."""
    pytest.importorskip("datasets")
    run = tmp_path / "r[red]"
    done = mhqa("eval", files["bench"], "--dataset", "hotpotqa", "--agent", "direct", "--llm",
                'fake:["<answer>[/bold]</answer>"]', "--store", f"embedded://{tmp_path}/s?embedder=hash", "--out",
                str(run))
    assert done.returncode == 0, done.stderr
    out = tmp_path / "ex[/bold]"
    exported = mhqa("export", str(run), "--format", "sft", "--out", str(out))
    assert (exported.returncode, exported.stdout) == (0, f"sft: 1 rows -> {out}\n"), exported.stderr
    reported = mhqa("report", str(run))
    assert reported.returncode == 0 and "r[red]" in reported.stdout and "MarkupError" not in reported.stderr, \
        reported.stderr
