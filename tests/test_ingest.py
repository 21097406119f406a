"""Dataset readers, input files, batched ingest and LLM graph extraction."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import BaseMessage

from mhqa_graph import open_store
from mhqa_graph.errors import IngestError, InvalidInput
from mhqa_graph.ingest.datasets import (
    dataset_passages,
    dataset_triples,
    detect_dataset,
    pathquestion_name,
    pathquestion_original,
    questions,
    read_rows,
)
from mhqa_graph.ingest.extract import extract_graph, parse_triples
from mhqa_graph.ingest.files import passage_id, read_passages_file, read_triples_file
from mhqa_graph.ingest.plans import read_plans_file
from mhqa_graph.ingest.runner import ingest, ingest_dataset
from mhqa_graph.store.base import MAX_NAME_BYTES, KnowledgeStore
from mhqa_graph.testing.fakes import FakeChatModel
from mhqa_graph.types import Fact, Passage


def head_rows(path: Path, n: int) -> list[dict]:
    """The first n rows of a real JSON-list or JSONL data file."""
    if path.suffix == ".json":
        return json.loads(path.read_text(encoding="utf-8"))[:n]
    with open(path, encoding="utf-8") as f:
        return [json.loads(next(f)) for _ in range(n)]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_json(path: Path, rows: list) -> Path:
    path.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[KnowledgeStore]:
    with open_store(f"embedded://{tmp_path}/store?embedder=hash") as st:
        yield st


MUSIQUE = [
    {
        "id": "2hop__1_2",
        "question": "Who founded the company that makes the Walkman?",
        "answer": "Masaru Ibuka",
        "answer_aliases": ["Ibuka Masaru"],
        "answerable": True,
        "question_decomposition": [{"id": 1, "question": "Walkman >> manufacturer", "answer": "Sony",
                                    "paragraph_support_idx": 0},
                                   {"id": 2, "question": "who founded #1", "answer": "Masaru Ibuka",
                                    "paragraph_support_idx": 1}],
        "paragraphs": [
            {"idx": 0, "title": "Walkman", "paragraph_text": "Walkman is a brand of portable players by Sony.",
             "is_supporting": True},
            {"idx": 1, "title": "Sony", "paragraph_text": "Sony was founded by Masaru Ibuka and Akio Morita.",
             "is_supporting": True},
            {"idx": 2, "title": "Discman", "paragraph_text": "The Discman is a portable CD player.",
             "is_supporting": False},
        ],
    },
    {
        "id": "2hop__3_4",
        "question": "Where is the company that makes the Discman based?",
        "answer": "Tokyo",
        "answer_aliases": [],
        "answerable": True,
        "question_decomposition": [],
        "paragraphs": [
            {"idx": 0, "title": "Discman", "paragraph_text": "The Discman is a portable CD player.",
             "is_supporting": True},
        ],
    },
]


# -- rows --------------------------------------------------------------------------------------


def test_read_rows_json_list_and_jsonl_agree(tmp_path: Path) -> None:
    rows = [{"a": 1}, {"a": 2}]
    listed = list(read_rows(write_json(tmp_path / "x.json", rows)))
    lines = list(read_rows(write_jsonl(tmp_path / "x.jsonl", rows)))
    assert listed == lines == [(1, {"a": 1}), (2, {"a": 2})]


def test_read_rows_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n\n{"a": \n{"a": 3}\n', encoding="utf-8")
    with pytest.raises(IngestError) as err:
        list(read_rows(path))
    assert (err.value.path, err.value.line) == (str(path), 3)
    assert f"{path}:3:" in str(err.value)
    items = list(read_rows(path, yield_errors=True))
    assert [type(i).__name__ for i in items] == ["tuple", "IngestError", "tuple"]


def test_missing_file_is_an_ingest_error(tmp_path: Path) -> None:
    with pytest.raises(IngestError, match="cannot read"):
        list(dataset_passages("hotpotqa", tmp_path / "nope.jsonl"))


def test_unknown_dataset() -> None:
    with pytest.raises(InvalidInput):
        dataset_passages("squad", "x.jsonl")


# -- HotpotQA ----------------------------------------------------------------------------------


def test_hotpotqa_hf_and_original_layouts_agree(sample: Path, tmp_path: Path) -> None:
    rows = head_rows(sample / "hotpotqa" / "demo.jsonl", 3)
    original = [{**r, "_id": r["id"],
                 "context": [[t, s] for t, s in zip(r["context"]["title"], r["context"]["sentences"], strict=True)],
                 "supporting_facts": [[t, i] for t, i in zip(r["supporting_facts"]["title"],
                                                               r["supporting_facts"]["sent_id"], strict=True)]}
                for r in rows]
    for r in original:
        del r["id"]
    hf = list(dataset_passages("hotpotqa", write_jsonl(tmp_path / "hf.jsonl", rows)))
    orig = list(dataset_passages("hotpotqa", write_json(tmp_path / "orig.json", original)))
    assert hf == orig
    assert len(hf) == len({(t, "".join(s)) for r in rows for t, s in zip(r["context"]["title"],
                                                                          r["context"]["sentences"], strict=True)})
    # Sentences carry their leading spaces: joined with "" they read as one paragraph.
    title, sents = rows[0]["context"]["title"][0], rows[0]["context"]["sentences"][0]
    assert hf[0] == Passage(passage_id(title, "".join(sents).strip()), title, "".join(sents).strip())
    assert ".  " not in hf[0].text and " They" in hf[0].text
    q_hf = list(questions("hotpotqa", tmp_path / "hf.jsonl"))
    assert q_hf == list(questions("hotpotqa", tmp_path / "orig.json"))
    assert q_hf[0].answers == (rows[0]["answer"],) and q_hf[0].hops == 2
    assert len(q_hf[0].supporting_ids) == 2 and set(q_hf[0].supporting_ids) <= {p.id for p in hf}
    assert detect_dataset(tmp_path / "hf.jsonl") == detect_dataset(tmp_path / "orig.json") == "hotpotqa"


def test_equal_paragraphs_of_different_rows_collapse(sample: Path, tmp_path: Path) -> None:
    row = head_rows(sample / "hotpotqa" / "demo.jsonl", 1)[0]
    path = write_jsonl(tmp_path / "dup.jsonl", [row, {**row, "id": "other"}])
    assert len(list(dataset_passages("hotpotqa", path))) == len(set(row["context"]["title"]))


def test_malformed_hotpotqa_row(tmp_path: Path) -> None:
    good = {"id": "1", "question": "q", "answer": "a", "context": {"title": ["T"], "sentences": [["A b."]]}}
    path = write_jsonl(tmp_path / "h.jsonl", [good, {"id": "2", "question": "q"}, {**good, "context": 5}])
    with pytest.raises(IngestError, match="missing field 'context'") as err:
        list(dataset_passages("hotpotqa", path))
    assert (err.value.path, err.value.line) == (str(path), 2)
    items = list(dataset_passages("hotpotqa", path, yield_errors=True))
    assert [getattr(i, "line", None) for i in items] == [None, 2, 3]
    assert items[0] == Passage(passage_id("T", "A b."), "T", "A b.")


# -- 2WikiMultihopQA ---------------------------------------------------------------------------


def test_2wiki_context_as_jsonl_and_json_list(data_dir: Path, tmp_path: Path) -> None:
    rows = head_rows(data_dir / "2wikimultihopqa" / "dev_context.jsonl", 3)
    jsonl = write_jsonl(tmp_path / "c.jsonl", rows)
    listed = write_json(tmp_path / "c.json", rows)
    passages = list(dataset_passages("2wiki", jsonl))
    assert passages == list(dataset_passages("2wiki", listed))
    assert len(passages) == len({(t, tuple(s)) for r in rows for t, s in r["context"]})
    title, sents = rows[0]["context"][0]
    assert passages[0].text == " ".join(sents)  # 2Wiki sentences have no leading space
    triples = list(dataset_triples("2wiki", listed))
    assert triples == list(dict.fromkeys(tuple(e) for r in rows for e in r["evidences"]))
    item = next(iter(questions("2wiki", jsonl)))
    # the compared films are named in the question; their directors (bridge entities) are not given away
    assert item.topic_entities == ("Forbidden Ground", "Free Guy")
    assert item.hops == len(rows[0]["evidences"]) and item.supporting_ids


def test_2wiki_gold_chain_has_a_hop_per_evidence_with_its_passage(data_dir: Path, tmp_path: Path) -> None:
    rows = head_rows(data_dir / "2wikimultihopqa" / "dev_context.jsonl", 20)
    items = list(questions("2wiki", write_jsonl(tmp_path / "c.jsonl", rows)))
    for row, item in zip(rows, items):
        assert [h.triples[0] for h in item.chain] == [tuple(e) for e in row["evidences"]]
        assert [h.answer for h in item.chain] == [e[2] for e in row["evidences"]]
        assert all(set(h.passage_ids) <= set(item.supporting_ids) for h in item.chain)
    with_passages = sum(all(h.passage_ids for h in i.chain) for i in items)
    assert with_passages >= 15  # a supporting paragraph per hop where the subject has its own paragraph


def test_2wiki_train_qa_pairs_give_sub_questions(data_dir: Path, tmp_path: Path) -> None:
    rows = head_rows(data_dir / "2wikimultihopqa" / "train_context.json", 5)
    item = next(iter(questions("2wiki", write_json(tmp_path / "t.json", rows))))
    assert [h.question for h in item.chain] == [p["question"] for p in rows[0]["qa_pairs"]]
    assert [h.answer for h in item.chain] == ["Dillon Francis", "October 5, 1987"]


def test_hotpotqa_chain_is_the_supporting_paragraphs(sample: Path) -> None:
    item = next(iter(questions("hotpotqa", sample / "hotpotqa" / "demo.jsonl")))
    assert [h.passage_ids[0] for h in item.chain] == list(item.supporting_ids)
    assert len(item.chain) == 2 and all(h.answer is None for h in item.chain)


def test_2wiki_train_context_rows(data_dir: Path, tmp_path: Path) -> None:
    path = write_json(tmp_path / "t.json", head_rows(data_dir / "2wikimultihopqa" / "train_context.json", 2))
    assert list(dataset_passages("2wiki", path)) and list(dataset_triples("2wiki", path))


def test_2wiki_evidences_only_file(sample: Path) -> None:
    """The bundled evidences file (no paragraphs): its README's 78 distinct triples of 40 rows."""
    path = sample / "2wikimultihopqa" / "demo_evidences.json"
    rows = json.loads(path.read_text(encoding="utf-8"))
    assert list(dataset_passages("2wiki", path)) == []
    triples = list(dataset_triples("2wiki", path))
    assert triples == list(dict.fromkeys(tuple(e) for r in rows for e in r["evidences"]))
    assert (len(rows), len(triples)) == (40, 78)


def test_2wiki_dev_evidences_graph_size(data_dir: Path) -> None:
    """The README's numbers for the evidence graph of the whole dev file."""
    triples = list(dataset_triples("2wiki", data_dir / "2wikimultihopqa" / "dev_evidences.json"))
    assert len(triples) == 6589
    assert len({x for s, _, o in triples for x in (s, o)}) == 9021
    assert len({r for _, r, _ in triples}) == 33


def test_malformed_2wiki_evidence(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "e.jsonl", [{"evidences": [["a", "r", "b"]]}, {"evidences": [["a", "r"]]}])
    with pytest.raises(IngestError, match="subject, relation, object") as err:
        list(dataset_triples("2wiki", path))
    assert err.value.line == 2


# -- MuSiQue -----------------------------------------------------------------------------------


def test_musique(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", MUSIQUE)
    passages = list(dataset_passages("musique", path))
    assert [p.title for p in passages] == ["Walkman", "Sony", "Discman"]  # Discman of row 2 collapses
    first, second = questions("musique", path)
    assert first.answers == ("Masaru Ibuka", "Ibuka Masaru")
    assert first.hops == 2 and first.type == "2hop"
    assert first.supporting_titles == ("Walkman", "Sony")
    assert first.supporting_ids == tuple(p.id for p in passages[:2])
    assert second.supporting_ids == (passages[2].id,)
    assert [(h.question, h.answer, h.passage_ids) for h in first.chain] == [
        ("Walkman >> manufacturer", "Sony", (passages[0].id,)), ("who founded #1", "Masaru Ibuka", (passages[1].id,))]
    assert second.chain == ()
    assert list(dataset_triples("musique", path)) == []
    assert detect_dataset(path) == "musique"


# -- PathQuestion ------------------------------------------------------------------------------


@pytest.mark.parametrize("kb", ["2H-kb.txt", "3H-kb.txt"])
def test_pathquestion_names_are_a_bijection(data_dir: Path, kb: str) -> None:
    lines = (data_dir / "pathquestion" / kb).read_text(encoding="utf-8").splitlines()
    names = {x for line in lines for x in line.split("\t")}
    assert not any(" " in n for n in names)
    readable = {pathquestion_name(n) for n in names}
    assert len(readable) == len(names)
    assert {pathquestion_original(r) for r in readable} == names
    triples = list(dataset_triples("pathquestion", data_dir / "pathquestion" / kb))
    assert len(triples) == len(set(lines))
    assert all("_" not in x for t in triples for x in t)


def test_pathquestion_question_file_uses_sibling_kb(pq_2h: dict[str, list[str]], tmp_path: Path) -> None:
    kb_lines, q_lines = pq_2h["2H-kb.txt"], pq_2h["PQ-2H.txt"]
    qfile = tmp_path / "PQ-2H.txt"
    qfile.write_text("\n".join(q_lines) + "\n", encoding="utf-8")
    with pytest.raises(IngestError, match="2H-kb.txt"):
        list(dataset_triples("pathquestion", qfile))
    (tmp_path / "2H-kb.txt").write_text("\n".join(kb_lines) + "\n", encoding="utf-8")
    assert list(dataset_triples("pathquestion", qfile)) == [
        tuple(pathquestion_name(x) for x in line.split("\t")) for line in kb_lines]
    item = next(iter(questions("pathquestion", qfile)))
    assert item.hops == 2 and item.id == "PQ-2H-1"
    assert "_" not in item.question and item.topic_entities[0] in item.question
    spouse, nationality = item.chain  # frederica#spouse#ernest_augustus_i#nationality#united_kingdom
    assert spouse.triples == (("frederica of mecklenburg-strelitz", "spouse", "ernest augustus i of hanover"),)
    assert spouse.answer == "ernest augustus i of hanover" and nationality.answer == "united kingdom"
    assert nationality.triples[0][0] == spouse.answer
    assert detect_dataset(qfile) == "pathquestion"


def test_pathquestion_alternative_answers(tmp_path: Path) -> None:
    path = tmp_path / "PQ-3H.txt"
    path.write_text("who is a_b 's child ?\tc_d(c_d/e_f/)\ta_b#children#c_d#<end>#c_d\nbroken line\n",
                    encoding="utf-8")
    item, bad = questions("pathquestion", path, yield_errors=True)
    assert item.answers == ("c d", "e f") and item.question == "who is a b 's child ?"
    assert item.topic_entities == ("a b",) and item.hops == 1
    assert isinstance(bad, IngestError) and bad.line == 2


PQL_KB = ["Khanty_people\t__people__ethnicity__languages_spoken\tKhanty_Language",
          "Tinted_Windows\t__music__album__release_type\tAlbum"]
PQL_QUESTION = ("what language do khanty_people speak ?\tKhanty_Language(Khanty_Language)\t"
                "Khanty_people#__people__ethnicity__languages_spoken#Khanty_Language")


def test_pathquestion_large_names_read_one_way_in_ingest_check_and_chain(tmp_path: Path) -> None:
    """PathQuestion-Large's Freebase relations (`__a__b__c`) read as single-spaced names by ingest, the store's
    built-from check and the gold chains alike, so a store built from the file is reused (issue 64, 2)."""
    from mhqa_graph.eval.environments import check_built_from, prepare

    (tmp_path / "PQL2-KB.txt").write_text("\n".join(PQL_KB) + "\n", encoding="utf-8")
    qfile = tmp_path / "PQL-2H.txt"
    qfile.write_text(PQL_QUESTION + "\n", encoding="utf-8")
    assert pathquestion_name("__people__ethnicity__languages_spoken") == "people ethnicity languages spoken"
    triples = list(dataset_triples("pathquestion", qfile))
    assert triples[0] == ("Khanty people", "people ethnicity languages spoken", "Khanty Language")
    [item] = questions("pathquestion", qfile)
    assert item.chain[0].triples == (triples[0],) and item.answers == ("Khanty Language",)
    with open_store(f"embedded://{tmp_path}/store?embedder=hash") as store:
        assert prepare(store, "pathquestion", qfile, "pql")["ingested"]
        [fact] = store.node_info("pql", "Khanty people").facts
        assert fact.relation == "people ethnicity languages spoken"
        check_built_from(store, "pql", qfile, [], triples)  # the check of a store that records no sha256
        assert not prepare(store, "pathquestion", qfile, "pql")["ingested"]  # reused, not refused

# -- generic files -----------------------------------------------------------------------------


def test_read_triples_file_formats(tmp_path: Path) -> None:
    want = [("a", "r", "b"), ("c", "s", "1990")]
    tsv = tmp_path / "t.tsv"
    tsv.write_text("a\tr\tb\n\n c \ts\t1990\n", encoding="utf-8")
    objects = write_json(tmp_path / "o.json", [{"subject": "a", "relation": "r", "object": "b"},
                                               {"subject": "c", "relation": "s", "object": 1990}])
    arrays = write_json(tmp_path / "a.json", [["a", "r", "b"], ["c", "s", "1990"]])
    arrays_jsonl = write_jsonl(tmp_path / "a.jsonl", [["a", "r", "b"], ["c", "s", "1990"]])
    for path in (tsv, objects, arrays, arrays_jsonl):
        assert list(read_triples_file(path)) == want, path


def test_read_triples_file_bad_line(tmp_path: Path) -> None:
    tsv = tmp_path / "t.tsv"
    tsv.write_text("a\tr\tb\na\tr\n", encoding="utf-8")
    with pytest.raises(IngestError) as err:
        list(read_triples_file(tsv))
    assert str(err.value).startswith(f"{tsv}:2:")


def test_read_passages_file(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"id": "p1", "title": "T", "text": "Hello."}, {"text": "No id."},
                                              {"title": "no text"}, {"id": 7, "text": "Int id."}])
    items = list(read_passages_file(path, yield_errors=True))
    assert items[0] == Passage("p1", "T", "Hello.")
    assert items[1] == Passage(passage_id("", "No id."), "", "No id.")
    assert isinstance(items[2], IngestError) and items[2].line == 3
    assert items[3].id == "7"


# -- runner ------------------------------------------------------------------------------------


def test_ingest_dataset_is_idempotent(store: KnowledgeStore, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", MUSIQUE)
    done: list[int] = []
    report = ingest_dataset(store, "musique", path, "mq", batch_size=2, progress=done.append)
    assert (report.passages_seen, report.passages_added, report.triples_seen) == (3, 3, 0)
    assert done and done[-1] == 3
    assert ingest_dataset(store, "musique", path, "mq").passages_added == 0
    assert "mq" not in store.stats().graphs  # no triples, no graph


def test_ingest_dataset_2wiki_passages_and_triples(store: KnowledgeStore, data_dir: Path, tmp_path: Path) -> None:
    rows = head_rows(data_dir / "2wikimultihopqa" / "dev_context.jsonl", 2)
    report = ingest_dataset(store, "2wiki", write_jsonl(tmp_path / "c.jsonl", rows), "w")
    assert report.passages_added == store.stats().corpora["w"]["passages"] > 0
    assert report.triples_added == store.stats().graphs["w"]["triples"] > 0


def test_failure_keeps_rows_before_it(store: KnowledgeStore, tmp_path: Path) -> None:
    rows = [MUSIQUE[0], {"id": "bad"}, MUSIQUE[1]]
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    with pytest.raises(IngestError) as err:
        ingest_dataset(store, "musique", path, "mq", batch_size=100)
    assert err.value.line == 2
    assert store.stats().corpora["mq"]["passages"] == 3  # row 1 was written, though its batch was not full


def test_skip_bad_counts_each_bad_row_once(store: KnowledgeStore, tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    good = {"context": [["T", ["One.", "Two."]]], "evidences": [["T", "r", "x"]]}
    path.write_text(json.dumps(good) + "\n{oops\n" + json.dumps({"context": 3, "evidences": 3}) + "\n",
                    encoding="utf-8")
    report = ingest_dataset(store, "2wiki", path, "w", skip_bad=True)
    assert report.skipped_bad == 2 and len(report.errors) == 2
    assert report.errors[0].startswith(f"{path}:2:")
    assert (report.passages_added, report.triples_added) == (1, 1)
    assert {p.id: p for p in store.passages("w")}[passage_id("T", "One. Two.")].text == "One. Two."


def test_a_name_over_the_byte_cap_is_a_bad_row_of_every_reader(store: KnowledgeStore, tmp_path: Path) -> None:
    """A passage id, triple part, 2Wiki evidence or plan id over MAX_NAME_BYTES of UTF-8 is a bad row at its line,
    as Neo4j would refuse it: skip_bad keeps the other rows; without it, the CLI says so in one line (issue 65)."""
    long = "é" * (MAX_NAME_BYTES // 2 + 1)  # 513 characters, 1,026 bytes
    passages = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "text": "A."}, {"id": long, "text": "B."},
                                                  {"id": "c", "text": "C."}])
    triples = tmp_path / "t.tsv"
    triples.write_text(f"a\tr\tb\n{long}\tr\tb\nc\tr\td\n", encoding="utf-8")
    report = ingest(store, corpus="c", passages=read_passages_file(passages, yield_errors=True), graph="g",
                    triples=read_triples_file(triples, yield_errors=True), skip_bad=True)
    assert [e.split(": ")[0] for e in report.errors] == [f"{passages}:2", f"{triples}:2"]
    assert all("1,026 bytes" in e for e in report.errors)
    assert [p.id for p in store.passages("c")] == ["a", "c"] and store.stats().graphs["g"]["triples"] == 2
    wiki = write_jsonl(tmp_path / "w.jsonl", [{"context": [["T", ["One."]]], "evidences": [["T", "r", "x"]]},
                                              {"context": [["U", ["Two."]]], "evidences": [["U", "r", long]]}])
    report = ingest_dataset(store, "2wiki", wiki, "w", skip_bad=True)
    assert report.skipped_bad == 1 and report.triples_added == 1 and report.errors[0].startswith(f"{wiki}:2: ")
    plans = write_jsonl(tmp_path / "plans.jsonl", [{"id": long, "question": "Who?", "subgoals": ["Find who."]}])
    [bad] = read_plans_file(plans, yield_errors=True)
    assert isinstance(bad, IngestError) and bad.line == 1 and "1,026 bytes" in str(bad)
    done = subprocess.run([sys.executable, "-m", "mhqa_graph.cli", "ingest", "passages", str(passages), "--corpus",
                           "d", "--store", f"embedded://{tmp_path}/cli?embedder=hash"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(f"error: IngestError: {passages}:2: ")
    assert len(done.stderr.strip().splitlines()) == 1


def test_ingest_files(store: KnowledgeStore, tmp_path: Path) -> None:
    tsv = tmp_path / "kb.tsv"
    tsv.write_text("a\tr\tb\nbroken\na\tr\tb\nb\tr\tc\n", encoding="utf-8")
    report = ingest(store, graph="g", triples=read_triples_file(tsv, yield_errors=True), skip_bad=True, batch_size=1)
    assert (report.triples_seen, report.triples_added, report.skipped_bad) == (3, 2, 1)
    with pytest.raises(InvalidInput):
        ingest(store, triples=[("a", "r", "b")])
    with pytest.raises(InvalidInput):
        ingest(store, graph="g", triples=[], batch_size=0)


# -- extraction --------------------------------------------------------------------------------


def test_parse_triples_is_tolerant() -> None:
    answer = """<think>maybe x | y | z</think>
Here are the facts:
subject | relation | object
|---|---|---|
1. Barack Obama | born in | "Honolulu"
- (Sony | founded by | Masaru Ibuka)
* only | two
a | b | c | d
| Free Guy | release year | 2021 |
x | y | """ + "z" * 500
    triples, skipped = parse_triples(answer)
    assert triples == [("Barack Obama", "born in", "Honolulu"), ("Sony", "founded by", "Masaru Ibuka"),
                       ("Free Guy", "release year", "2021")]
    assert skipped == 5


def test_extract_graph_with_fake_llm(store: KnowledgeStore, tmp_path: Path) -> None:
    store.add_passages("mq", [Passage("1", "Sony", "Sony was founded by Masaru Ibuka."),
                              Passage("2", "Walkman", "The Walkman is made by Sony."),
                              Passage("3", "Broken", "The model fails here.")])

    def respond(messages: list[BaseMessage]) -> str:
        prompt = messages[-1].text
        if "Masaru" in prompt:
            return "Sony | founded by | Masaru Ibuka\nI hope this helps!"
        if "Walkman is made" in prompt:
            return "1. Walkman | manufacturer | Sony\n2. Sony | founded by | Masaru Ibuka"
        raise RuntimeError("model down")

    report = extract_graph(store, "mq", "kg", FakeChatModel(respond=respond), batch_size=2)
    assert (report.passages, report.failed, report.lines_skipped) == (3, 1, 1)
    assert (report.triples_seen, report.triples_added) == (3, 2)
    assert "model down" in report.errors[0]
    assert set(store.node_info("kg", "Sony").facts) == {
        Fact("founded by", "Masaru Ibuka", "out"), Fact("manufacturer", "Walkman", "in")}
    assert extract_graph(store, "mq", "kg", FakeChatModel(respond=respond), limit=1).passages == 1
