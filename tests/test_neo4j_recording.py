"""Neo4jStore against a recording driver: what it sends, how, and how it reads the answers."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, cast

import pytest
from neo4j.exceptions import ServiceUnavailable

from mhqa_graph import (
    EmbedderMismatch,
    EntityHit,
    EntityNotFound,
    Fact,
    InvalidInput,
    Passage,
    StoreUnavailable,
    UnknownCorpus,
    UnknownGraph,
    open_store,
)
from mhqa_graph.store import cypher
from mhqa_graph.store.cypher import ALL_STATEMENTS, escape_lucene, lucene_or_query
from mhqa_graph.store.neo4j_backend import Neo4jStore
from mhqa_graph.testing.recording_driver import RecordingDriver
from neo4j import Driver

SPEC = "hash:256"
COLLECTION_ROW = [{"embedder": SPEC, "dim": 256}]
NO_HITS = [{"fetched": 0, "hits": []}]
INJECTIONS = ["}) DETACH DELETE n //", "O'Brien \"quoted\"", "`backtick`", "{braces}", "CALL db.x()", "Zürich ∑ 東京"]
WRITE_STATEMENTS = {*cypher.SCHEMA, *cypher.VECTOR_SCHEMA, cypher.MERGE_COLLECTION, cypher.ADD_ENTITIES,
                    cypher.ADD_TRIPLES, cypher.ADD_PASSAGES, cypher.DROP_ENTITIES, cypher.DROP_PASSAGES,
                    cypher.DROP_COLLECTIONS}


def added(params: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"added": len(params["rows"])}]


DEFAULTS: dict[str, Any] = {
    "COLLECTION": COLLECTION_ROW, "MERGE_COLLECTION": COLLECTION_ROW, "ADD_TRIPLES": added, "ADD_PASSAGES": added,
    "ENTITY_FULLTEXT": NO_HITS, "ENTITY_VECTOR": NO_HITS, "PASSAGE_FULLTEXT": NO_HITS, "PASSAGE_VECTOR": NO_HITS,
    "DROP_ENTITIES": [{"deleted": 0}], "DROP_PASSAGES": [{"deleted": 0}],
}


def make_store(embedder: str | None = SPEC, **answers: Any) -> tuple[Neo4jStore, RecordingDriver]:
    """A store on a recording driver; `answers` maps statement names to rows or to a function of the params."""
    table = {ALL_STATEMENTS[name]: answer for name, answer in {**DEFAULTS, **answers}.items()}

    def respond(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        answer = table.get(query, [])
        return answer(params) if callable(answer) else answer

    driver = RecordingDriver(respond)
    return Neo4jStore(cast(Driver, driver), embedder=embedder, database="mhqa"), driver


def exercise(store: Neo4jStore, text: str) -> None:
    store.add_triples(text, [(text, text, text), (text, "rel", "other")])
    store.add_passages(text, [Passage(text, text, text)])
    store.match_entities(text, text)
    with pytest.raises(EntityNotFound):
        store.node_info(text, text)
    for mode in ("bm25", "dense", "hybrid"):
        store.search(text, text, mode=mode)
    list(store.passages(text))
    store.stats()
    store.graphs()
    store.namespace = text
    store.drop_namespace()


@pytest.mark.parametrize("text", INJECTIONS)
def test_user_data_only_in_parameters(text: str) -> None:
    store, driver = make_store()
    exercise(store, text)
    statements = set(ALL_STATEMENTS.values())
    assert all(call.query in statements for call in driver.calls)
    assert all(text not in call.query for call in driver.calls)
    [entities] = [call.parameters["rows"] for call in driver.calls if call.query == cypher.ADD_ENTITIES]
    assert [row["name"] for row in entities] == [text, "other"]
    assert {call.database for call in driver.calls} == {"mhqa"}


def test_parameters_match_each_statement() -> None:
    store, driver = make_store()
    exercise(store, "x")
    for call in driver.calls:
        assert set(re.findall(r"\$(\w+)", call.query)) == set(call.parameters), call.query


def test_reads_use_read_access_and_writes_write_access() -> None:
    store, driver = make_store()
    exercise(store, "x")
    for call in driver.calls:
        assert call.access_mode == ("WRITE" if call.query in WRITE_STATEMENTS else "READ"), call.query
    assert {call.query for call in driver.calls} >= WRITE_STATEMENTS


def test_writes_are_unwind_batches() -> None:
    store, driver = make_store()
    triples = [(f"s{i}", "r", f"o{i}") for i in range(2500)]
    assert store.add_triples("g", triples) == 2500
    batches = [call.parameters["rows"] for call in driver.calls if call.query == cypher.ADD_TRIPLES]
    assert [len(rows) for rows in batches] == [1000, 1000, 500]
    assert all(len(call.parameters["rows"]) <= 1000 for call in driver.calls if call.query == cypher.ADD_ENTITIES)
    assert store.add_passages("c", [Passage(str(i), "", f"text {i}") for i in range(2500)]) == 2500
    sizes = [len(call.parameters["rows"]) for call in driver.calls if call.query == cypher.ADD_PASSAGES]
    assert sizes == [1000, 1000, 500]


def test_only_new_entities_and_passages_are_embedded() -> None:
    store, driver = make_store(EXISTING_ENTITIES=[{"key": cypher.key("g", "a")}],
                               EXISTING_PASSAGES=[{"key": cypher.key("c", "p1")}])
    store.add_triples("g", [("a", "r", "b")])
    [entities] = [call.parameters["rows"] for call in driver.calls if call.query == cypher.ADD_ENTITIES]
    assert [row["name"] for row in entities] == ["b"] and len(entities[0]["embedding"]) == 256
    store.add_passages("c", [Passage("p1", "", "one"), Passage("p2", "T", "two")])
    [rows] = [call.parameters["rows"] for call in driver.calls if call.query == cypher.ADD_PASSAGES]
    assert [(r["pid"], r["i"], r["title"]) for r in rows] == [("p2", 0, "T")]


def test_entity_hits_fuse_lexical_and_semantic() -> None:
    lexical = [{"fetched": 2, "hits": [{"name": "Paris", "score": 3.0}, {"name": "Paris Hilton", "score": 2.0}]}]
    semantic = [{"fetched": 2, "hits": [{"name": "Paris Hilton", "score": 0.9}, {"name": "France", "score": 0.8}]}]
    store, driver = make_store(ENTITY_FULLTEXT=lexical, ENTITY_VECTOR=semantic)
    hits = store.match_entities("g", "paris (hilton)", k=3)
    assert [h.name for h in hits] == ["Paris Hilton", "Paris", "France"]
    assert all(isinstance(h, EntityHit) and h.score > 0 for h in hits)
    [fulltext] = [call for call in driver.calls if call.query == cypher.ENTITY_FULLTEXT]
    assert fulltext.parameters["query"] == r"paris OR \(hilton\)"


def test_text_without_words_queries_no_index() -> None:
    store, driver = make_store()
    assert store.match_entities("g", "?!") == [] and store.search("c", "?!", mode="hybrid") == []
    index_queries = {cypher.ENTITY_FULLTEXT, cypher.ENTITY_VECTOR, cypher.PASSAGE_FULLTEXT, cypher.PASSAGE_VECTOR}
    assert not [call for call in driver.calls if call.query in index_queries]


def test_node_info_facts_keep_direction() -> None:
    facts = [{"relation": "capital of", "other": "France", "direction": "out"},
             {"relation": "born in", "other": "Marie", "direction": "in"}]
    store, driver = make_store(NODE_INFO=[{"facts": facts}])
    info = store.node_info("g", "Paris")
    assert info.facts == [Fact("capital of", "France", "out"), Fact("born in", "Marie", "in")]
    assert info.as_text().splitlines()[1:] == ["- (Paris) -[capital of]-> (France)", "- (Marie) -[born in]-> (Paris)"]
    [call] = [call for call in driver.calls if call.query == cypher.NODE_INFO]
    assert call.parameters == {"key": "g\u001fParis"}


def test_node_info_tolerates_case_when_unambiguous() -> None:
    facts = [{"relation": "in", "other": "France", "direction": "out"}]
    right = cypher.key("g", "Paris")
    store, _ = make_store(NODE_INFO=lambda params: [{"facts": facts}] if params["key"] == right else [],
                          ENTITIES_BY_FOLDED=[{"name": "Paris"}])
    info = store.node_info("g", "PARIS")
    assert (info.name, info.facts) == ("Paris", [Fact("in", "France", "out")])
    store, _ = make_store(ENTITIES_BY_FOLDED=[{"name": "Paris"}, {"name": "PARIS"}])
    with pytest.raises(EntityNotFound):
        store.node_info("g", "paris")


def test_namespace_scopes_every_collection() -> None:
    store, driver = make_store()
    store.namespace = "t1"
    store.add_triples("g", [("a", "r", "b")])
    store.stats()
    [merge] = [call.parameters for call in driver.calls if call.query == cypher.MERGE_COLLECTION]
    assert (merge["collection"], merge["namespace"], merge["name"], merge["scope"]) == (
        "graph\u001ft1\u001fg", "t1", "g", "t1\u001fg")
    [entities] = [call.parameters for call in driver.calls if call.query == cypher.ADD_ENTITIES]
    assert entities["graph"] == "t1\u001fg" and entities["rows"][0]["key"] == "t1\u001fg\u001fa"
    [stats] = [call.parameters for call in driver.calls if call.query == cypher.STATS]
    assert stats == {"namespace": "t1"}


def test_drop_namespace_deletes_in_batches_and_spares_the_default() -> None:
    left = [2500]

    def delete(params: dict[str, Any]) -> list[dict[str, Any]]:
        deleted = min(left[0], params["limit"])
        left[0] -= deleted
        return [{"deleted": deleted}]

    store, driver = make_store(DROP_ENTITIES=delete)
    with pytest.raises(InvalidInput):
        store.drop_namespace()
    store.namespace = "t1"
    store.drop_namespace()
    assert [call.query for call in driver.calls].count(cypher.DROP_ENTITIES) == 4
    assert driver.calls[-1].query == cypher.DROP_COLLECTIONS


def test_schema_file_matches_the_code() -> None:
    path = Path(__file__).resolve().parent.parent / "neo4j" / "schema.cypher"
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("//"))
    in_file = {part.strip() for part in text.split(";") if part.strip()}
    assert in_file == {*cypher.SCHEMA, *(s.replace("$dimensions", "384") for s in cypher.VECTOR_SCHEMA)}


def test_passage_hits_per_mode() -> None:
    bm25 = [{"fetched": 2, "hits": [{"id": "a", "title": "A", "text": "ta", "score": 2.5},
                                    {"id": "b", "title": "B", "text": "tb", "score": 1.5}]}]
    dense = [{"fetched": 1, "hits": [{"id": "b", "title": "B", "text": "tb", "score": 0.75}]}]
    store, _ = make_store(PASSAGE_FULLTEXT=bm25, PASSAGE_VECTOR=dense)
    assert [(h.id, h.score) for h in store.search("c", "q", k=2, mode="bm25")] == [("a", 2.5), ("b", 1.5)]
    [hit] = store.search("c", "q", k=2, mode="dense")
    assert (hit.id, hit.title, hit.text, hit.score) == ("b", "B", "tb", 0.5)  # Neo4j (1 + cos) / 2 -> cos
    assert [h.id for h in store.search("c", "q", k=2, mode="hybrid")] == ["b", "a"]


def test_index_queries_fetch_deeper_when_filtering_leaves_too_few() -> None:
    def few(params: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"fetched": params["fetch"], "hits": [{"id": "a", "title": "", "text": "", "score": 1.0}]}]

    store, driver = make_store(PASSAGE_FULLTEXT=few)
    assert len(store.search("c", "q", k=3, mode="bm25")) == 1
    fetches = [call.parameters["fetch"] for call in driver.calls if call.query == cypher.PASSAGE_FULLTEXT]
    assert fetches == sorted(fetches) and len(fetches) > 1 and fetches[-1] == 10_000


def test_passages_page_in_insertion_order() -> None:
    def page(params: dict[str, Any]) -> list[dict[str, Any]]:
        start = params["after"] + 1
        stop = min(start + params["limit"], 1003)
        return [{"id": str(i), "title": "", "text": "", "seq": i} for i in range(start, stop)]

    store, driver = make_store(PASSAGES_PAGE=page)
    assert [p.id for p in store.passages("c")] == [str(i) for i in range(1003)]
    assert [call.parameters["after"] for call in driver.calls if call.query == cypher.PASSAGES_PAGE] == [-1, 999]


def test_stats() -> None:
    rows = [{"kind": "graph", "name": "g", "entities": 3, "triples": 2, "passages": 0},
            {"kind": "corpus", "name": "c", "entities": 0, "triples": 0, "passages": 5}]
    store, _ = make_store(STATS=rows)
    stats = store.stats()
    assert (stats.backend, stats.graphs, stats.corpora) == ("neo4j", {"g": {"entities": 3, "triples": 2}},
                                                           {"c": {"passages": 5}})


def test_collection_names_do_not_count_contents() -> None:
    store, driver = make_store(COLLECTION_NAMES=lambda params: [{"name": f"{params['kind']}-a"}])
    opened = len(driver.calls)
    assert store.graphs() == ["graph-a"] and store.corpora() == ["corpus-a"]
    assert [(c.query, c.access_mode) for c in driver.calls[opened:]] == [(cypher.COLLECTION_NAMES, "READ")] * 2


def test_unknown_graph_and_corpus() -> None:
    store, _ = make_store(COLLECTION=[])
    with pytest.raises(UnknownGraph):
        store.match_entities("nope", "x")
    with pytest.raises(UnknownGraph):
        store.node_info("nope", "x")
    with pytest.raises(UnknownCorpus):
        store.search("nope", "x")
    with pytest.raises(UnknownCorpus):
        store.passages("nope")


def test_entity_not_found() -> None:
    store, _ = make_store(NODE_INFO=[])
    with pytest.raises(EntityNotFound):
        store.node_info("g", "nobody")


def test_embedder_is_stored_and_checked() -> None:
    stored = [{"embedder": "hash:64", "dim": 64}]
    with pytest.raises(EmbedderMismatch):
        make_store(embedder=SPEC, EMBEDDERS=stored)
    store, driver = make_store(embedder=None, EMBEDDERS=stored)
    vector_ddl = [call.parameters for call in driver.calls if call.query in cypher.VECTOR_SCHEMA]
    assert vector_ddl == [{"dimensions": 64}, {"dimensions": 64}]
    with pytest.raises(EmbedderMismatch):  # the collection was built with hash:256
        store.search("c", "q")


def test_driver_unavailable_becomes_store_unavailable() -> None:
    store, driver = make_store()

    def down(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        raise ServiceUnavailable("connection refused")

    driver.responder = down
    with pytest.raises(StoreUnavailable, match="unavailable"):
        store.stats()


@pytest.mark.parametrize("uri", ["neo4j://127.0.0.1:1", "bolt://127.0.0.1:1?embedder=hash:256"])
def test_unreachable_server_fails_fast(uri: str) -> None:
    start = time.monotonic()
    with pytest.raises(StoreUnavailable):
        open_store(uri, embedder=SPEC)
    assert time.monotonic() - start < 6


@pytest.mark.parametrize(("text", "escaped"), [
    ("a+b-c", r"a\+b\-c"),
    ("x && y || !z", r"x \&\& y \|\| \!z"),
    ("(a){b}[c]", r"\(a\)\{b\}\[c\]"),
    ('^"~*?:\\/', r'\^\"\~\*\?\:\\\/'),
    ("cats AND dogs OR NOT birds", "cats and dogs or not birds"),
    ("ANDROID ORBIT NOTE", "ANDROID ORBIT NOTE"),
])
def test_escape_lucene(text: str, escaped: str) -> None:
    assert escape_lucene(text) == escaped


def test_lucene_or_query() -> None:
    assert lucene_or_query("who wrote Hamlet? who") == r"who OR wrote OR Hamlet\?"
    assert lucene_or_query("}) DETACH DELETE n //") == "DETACH OR DELETE OR n"
    assert lucene_or_query("  ?! // ") is None
    many = lucene_or_query(" ".join(f"w{i}" for i in range(5000))) or ""
    assert many.count(" OR ") == cypher.MAX_TERMS - 1
