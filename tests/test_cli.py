"""The `mhqa` command line, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def mhqa(*args: str, store: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mhqa_graph.cli", *args]
    if store is not None:
        cmd += ["--store", f"embedded://{store}?embedder=hash"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture
def hotpot_rows(data_dir, tmp_path) -> Path:
    lines = (data_dir / "hotpotqa" / "dev_a.jsonl").read_text(encoding="utf-8").splitlines()[:5]
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
    assert "UnknownGraph" in done.stderr and "Traceback" not in done.stderr
    debug = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "--debug", "query", "node", "nope", "x",
                            "--store", f"embedded://{store}?embedder=hash"], capture_output=True, text=True)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    bad_uri = mhqa("stats", "--store", "ftp://nowhere")
    assert bad_uri.returncode == 2 and "InvalidStoreURI" in bad_uri.stderr


def test_models_list():
    rows = json.loads(mhqa("models", "list", "--json").stdout)
    assert {r["name"] for r in rows} >= {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "all-minilm-l6-v2"}
    assert all(r["extra"] in ("models", "models-qwen") for r in rows)
