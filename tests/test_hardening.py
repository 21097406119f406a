"""Regression tests of the probe findings of issue 45: store paths, JSON readers, torn exports, symlinks."""

import json
import os
import subprocess
import sys

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
