"""Neo4jStore against a recording driver: what it sends, how, and how it reads the answers."""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from neo4j.exceptions import ServiceUnavailable

from mhqa_graph import (
    EmbedderMismatch,
    EntityHit,
    EntityNotFound,
    Fact,
    IngestError,
    InvalidInput,
    Passage,
    StoreError,
    StoreLocked,
    StoreUnavailable,
    UnknownCorpus,
    UnknownGraph,
    open_store,
)
from mhqa_graph.embeddings import load_embedder
from mhqa_graph.store import cypher
from mhqa_graph.store.cypher import ALL_STATEMENTS, escape_lucene, lucene_or_query
from mhqa_graph.store.neo4j_backend import MAX_NODE_FACTS, Neo4jStore
from mhqa_graph.testing.recording_driver import RecordedSchema, RecordingDriver, lucene_clauses, server_error
from neo4j import Driver

SPEC = "hash:256"
COLLECTION_ROW = [{"embedder": SPEC, "dim": 256, "size": 5}]
NO_HITS = [{"fetched": 0, "hits": []}]
INJECTIONS = ["}) DETACH DELETE n //", "O'Brien \"quoted\"", "`backtick`", "{braces}", "CALL db.x()", "Zürich ∑ 東京"]
UPGRADE_STATEMENTS = {cypher.TAG_ENTITIES, cypher.TAG_PASSAGES, cypher.FINISH_UPGRADE}
WRITE_STATEMENTS = {*cypher.SCHEMA, *cypher.VECTOR_SCHEMA, cypher.MERGE_COLLECTION, cypher.GROW_COLLECTION,
                    cypher.ADD_ENTITIES, cypher.SET_ENTITY_VECTORS, cypher.ADD_TRIPLES, cypher.ADD_PASSAGES,
                    cypher.SET_PASSAGE_VECTORS, cypher.DROP_ENTITIES, cypher.DROP_PASSAGES, cypher.DROP_COLLECTIONS,
                    cypher.SET_FILE_SHA256, *UPGRADE_STATEMENTS}


def added(params: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"added": len(params["rows"])}]


DEFAULTS: dict[str, Any] = {
    "COLLECTION": COLLECTION_ROW, "MERGE_COLLECTION": COLLECTION_ROW, "ADD_TRIPLES": added, "ADD_PASSAGES": added,
    "ADD_ENTITIES": added, "ENTITY_FULLTEXT": NO_HITS, "ENTITY_VECTOR": NO_HITS, "ENTITY_EXACT": NO_HITS,
    "PASSAGE_FULLTEXT": NO_HITS, "PASSAGE_VECTOR": NO_HITS, "PASSAGE_EXACT": NO_HITS,
    "DROP_ENTITIES": [{"deleted": 0}], "DROP_PASSAGES": [{"deleted": 0}],
    "ENTITY_TOTAL": [{"total": 10**6}], "PASSAGE_TOTAL": [{"total": 10**6}], "SET_FILE_SHA256": [{"updated": 1}],
}


def responder(**answers: Any):
    """Answers by statement name: rows, or a function of the params giving rows."""
    table = {ALL_STATEMENTS[name]: answer for name, answer in {**DEFAULTS, **answers}.items()}

    def respond(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        answer = table.get(query, [])
        return answer(params) if callable(answer) else answer

    return respond


def make_store(embedder: str | None = SPEC, schema: RecordedSchema | None = None, read_only: bool = False,
               **answers: Any) -> tuple[Neo4jStore, RecordingDriver]:
    """A store on a recording driver; `answers` maps statement names to rows or to a function of the params."""
    driver = RecordingDriver(responder(**answers), schema=schema)
    return open_on(driver, embedder, read_only), driver


def open_on(driver: RecordingDriver, embedder: str | None = SPEC, read_only: bool = False) -> Neo4jStore:
    return Neo4jStore(cast(Driver, driver), embedder=embedder, database="mhqa", read_only=read_only)


def schema_file(dimensions: int | None = None) -> RecordedSchema:
    """The catalogue after an administrator applied neo4j/schema.cypher (384 dimensions, or `dimensions`)."""
    schema = RecordedSchema()
    path = Path(__file__).resolve().parent.parent / "neo4j" / "schema.cypher"
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("//"))
    for statement in filter(None, (part.strip() for part in text.split(";"))):
        if dimensions is not None:
            statement = statement.replace("`vector.dimensions`: 384", f"`vector.dimensions`: {dimensions}")
        schema.answer(statement, {})
    return schema


def calls_of(driver: RecordingDriver, *statements: str) -> list[Any]:
    return [call for call in driver.calls if call.query in statements]


def exercise(store: Neo4jStore, text: str) -> None:
    store.add_triples(text, [(text, text, text), (text, "rel", "other")])
    store.add_passages(text, [Passage(text, text, text)])
    store.match_entities(text, text)
    with pytest.raises(EntityNotFound):
        store.node_info(text, text)
    for mode in ("bm25", "dense", "hybrid"):
        store.search(text, text, mode=mode)
    list(store.passages(text))
    store.set_file_sha256("corpus", text, "0" * 64)
    store.file_sha256("corpus", text)
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
    assert {call.query for call in driver.calls} >= WRITE_STATEMENTS - UPGRADE_STATEMENTS


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
    assert [row["name"] for row in entities] == ["b"]
    [vectors] = [call.parameters["rows"] for call in driver.calls if call.query == cypher.SET_ENTITY_VECTORS]
    assert [row["key"] for row in vectors] == [cypher.key("g", "b")] and len(vectors[0]["embedding"]) == 256
    store.add_passages("c", [Passage("p1", "", "one"), Passage("p2", "T", "two")])
    [rows] = [call.parameters["rows"] for call in driver.calls if call.query == cypher.ADD_PASSAGES]
    assert [(r["pid"], r["i"], r["title"]) for r in rows] == [("p2", 0, "T")]
    [vectors] = [call.parameters["rows"] for call in driver.calls if call.query == cypher.SET_PASSAGE_VECTORS]
    assert [row["key"] for row in vectors] == [cypher.key("c", "p2")]


def test_entity_hits_fuse_lexical_and_semantic() -> None:
    lexical = [{"fetched": 2, "hits": [{"name": "Paris", "score": 3.0}, {"name": "Paris Hilton", "score": 2.0}]}]
    semantic = [{"fetched": 2, "hits": [{"name": "Paris Hilton", "score": 0.9}, {"name": "France", "score": 0.8}]}]
    store, driver = make_store(ENTITY_FULLTEXT=lexical, ENTITY_EXACT=semantic)  # a small graph: exact
    hits = store.match_entities("g", "paris (hilton)", k=3)
    assert [h.name for h in hits] == ["Paris Hilton", "Paris", "France"]
    assert all(isinstance(h, EntityHit) and h.score > 0 for h in hits)
    [fulltext] = [call for call in driver.calls if call.query == cypher.ENTITY_FULLTEXT]
    gid = cypher.collection_gid(cypher.key("graph", "g"))
    assert fulltext.parameters["query"] == rf"+gid:{gid} +(paris OR \(hilton\))"


def test_text_without_words_queries_no_index() -> None:
    store, driver = make_store()
    assert store.match_entities("g", "?!") == [] and store.search("c", "?!", mode="hybrid") == []
    index_queries = {cypher.ENTITY_FULLTEXT, cypher.ENTITY_VECTOR, cypher.PASSAGE_FULLTEXT, cypher.PASSAGE_VECTOR,
                     cypher.ENTITY_EXACT, cypher.PASSAGE_EXACT}
    assert not [call for call in driver.calls if call.query in index_queries]


def test_node_info_facts_keep_direction() -> None:
    facts = [{"relation": "capital of", "other": "France", "direction": "out"},
             {"relation": "born in", "other": "Marie", "direction": "in"}]
    store, driver = make_store(NODE_INFO=[{"facts": facts}])
    info = store.node_info("g", "Paris")
    assert info.facts == [Fact("capital of", "France", "out"), Fact("born in", "Marie", "in")]
    assert info.as_text().splitlines()[1:] == ["- (Paris) -[capital of]-> (France)", "- (Marie) -[born in]-> (Paris)"]
    [call] = [call for call in driver.calls if call.query == cypher.NODE_INFO]
    assert call.parameters == {"key": "g\u001fParis", "limit": MAX_NODE_FACTS}


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
    assert {item.create for item in cypher.SCHEMA_ITEMS} == {*cypher.SCHEMA, *cypher.VECTOR_SCHEMA}


def test_passage_hits_per_mode() -> None:
    bm25 = [{"fetched": 2, "hits": [{"id": "a", "title": "A", "text": "ta", "score": 2.5},
                                    {"id": "b", "title": "B", "text": "tb", "score": 1.5}]}]
    dense = [{"fetched": 1, "hits": [{"id": "b", "title": "B", "text": "tb", "score": 0.75}]}]
    store, _ = make_store(PASSAGE_FULLTEXT=bm25, PASSAGE_EXACT=dense)
    assert [(h.id, h.score) for h in store.search("c", "q", k=2, mode="bm25")] == [("a", 2.5), ("b", 1.5)]
    [hit] = store.search("c", "q", k=2, mode="dense")
    assert (hit.id, hit.title, hit.text, hit.score) == ("b", "B", "tb", 0.5)  # Neo4j (1 + cos) / 2 -> cos
    assert [h.id for h in store.search("c", "q", k=2, mode="hybrid")] == ["b", "a"]


def test_vector_queries_fetch_deeper_then_go_exact_when_the_cap_leaves_too_few() -> None:
    def few(params: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"fetched": params["fetch"], "hits": [{"id": "a", "title": "", "text": "", "score": 1.0}]}]

    exact = [{"fetched": 3, "hits": [{"id": i, "title": "", "text": "", "score": 0.9} for i in "xyz"]}]
    big = [{"embedder": SPEC, "dim": 256, "size": 500_000}]
    store, driver = make_store(COLLECTION=big, PASSAGE_TOTAL=[{"total": 1_000_000}], PASSAGE_VECTOR=few,
                               PASSAGE_EXACT=exact)
    assert [h.id for h in store.search("c", "q", k=3, mode="dense")] == ["x", "y", "z"]
    fetches = [call.parameters["fetch"] for call in calls_of(driver, cypher.PASSAGE_VECTOR)]
    assert fetches == sorted(fetches) and len(fetches) > 1 and fetches[-1] == 10_000
    [call] = calls_of(driver, cypher.PASSAGE_EXACT)
    assert call.parameters["corpus"] == "c" and call.parameters["k"] == 3


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
    assert many.count(" OR ") == cypher.MAX_TOKENS - 1


# -- must fix 1: the vector index dimension is checked -----------------------------------------------
def test_schema_file_then_another_embedder_raises_embedder_mismatch_with_the_fix() -> None:
    driver = RecordingDriver(responder(), schema=schema_file())  # schema.cypher: 384 dimensions
    with pytest.raises(EmbedderMismatch, match=r"'passage_embedding'|'entity_embedding'") as info:
        open_on(driver)  # hash:256
    message = str(info.value)
    assert "384 dimensions, but embedder 'hash:256' makes 256" in message and "\n" not in message
    assert "DROP INDEX entity_embedding; DROP INDEX passage_embedding" in message
    assert calls_of(driver, cypher.SHOW_VECTOR_INDEXES)
    assert not calls_of(driver, *cypher.VECTOR_SCHEMA)  # nothing was missing, so nothing was created
    open_on(driver, "hash:384")  # the embedder the schema was made for opens


def test_an_emptied_database_keeps_its_index_dimension() -> None:
    schema = RecordedSchema()
    make_store(embedder="hash:384", schema=schema)  # creates the vector indexes at 384
    with pytest.raises(EmbedderMismatch, match="384 dimensions"):  # every collection dropped: EMBEDDERS is empty
        make_store(embedder=SPEC, schema=schema)


def test_without_the_check_searches_would_fail_on_the_dimension() -> None:
    """What the check prevents: the server refuses a query vector of another dimension."""
    schema = schema_file()
    store, _ = make_store(embedder="hash:384", schema=schema,
                               COLLECTION=[{"embedder": SPEC, "dim": 256, "size": 10**6}])
    store._embedder = load_embedder(SPEC)  # as if the check had been skipped
    with pytest.raises(StoreError, match="Index query vector has 256 dimensions, but indexed vectors have 384"):
        store.search("c", "q", mode="dense")


def test_an_existing_vector_index_of_another_name_is_used() -> None:
    schema = RecordedSchema()
    schema.add_index("my_passage_vectors", "VECTOR", "Passage", ["embedding"], dimensions=256)
    big = [{"embedder": SPEC, "dim": 256, "size": 10**6}]
    store, driver = make_store(schema=schema, COLLECTION=big, PASSAGE_TOTAL=[{"total": 10**6}])
    assert "passage_embedding" not in {i["name"] for i in schema.indexes}
    store.search("c", "q", mode="dense")
    assert {c.parameters["index"] for c in calls_of(driver, cypher.PASSAGE_VECTOR)} == {"my_passage_vectors"}


# -- must fix 2: a small collection of a populated database finds its own ---------------------------
class PopulatedServer:
    """Answers data statements as a server holding another corpus of `big` passages would: Lucene
    honours `+gid:` and its limit, the vector index returns the nearest nodes of every corpus (the big
    corpus's first), exact search covers one corpus. Writes of the store are applied."""

    def __init__(self, big: int = 50_000) -> None:
        self.collections: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        gid = cypher.collection_gid(cypher.key("corpus", "big"))
        for i in range(big):
            self.nodes[f"big{i}"] = {"corpus": "big", "gid": gid, "pid": f"b{i}", "title": "Lviv",
                                     "text": f"Andrzej Żuławski was born in the city of Lviv ({i}).", "embedding": None}

    def respond(self, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        s = ALL_STATEMENTS
        if query == s["MERGE_COLLECTION"]:
            self.collections.setdefault(params["collection"], {"embedder": params["embedder"], "dim": params["dim"],
                                                               "size": 0})
            return [self.collections[params["collection"]]]
        if query == s["COLLECTION"]:
            return [self.collections[params["collection"]]] if params["collection"] in self.collections else []
        if query == s["ADD_PASSAGES"]:
            for row in params["rows"]:
                self.nodes[row["key"]] = {"corpus": params["corpus"], "gid": params["gid"], "pid": row["pid"],
                                          "title": row["title"], "text": row["text"], "embedding": None}
            self.collections[params["collection"]]["size"] += len(params["rows"])
            return [{"added": len(params["rows"])}]
        if query == s["SET_PASSAGE_VECTORS"]:
            for row in params["rows"]:
                self.nodes[row["key"]]["embedding"] = np.asarray(row["embedding"])
            return [{"updated": len(params["rows"])}]
        if query == s["PASSAGE_TOTAL"]:
            return [{"total": len(self.nodes)}]
        if query == s["PASSAGE_FULLTEXT"]:
            gid, inner = re.fullmatch(r"\+gid:(\w+) \+\((.*)\)", params["query"]).groups()  # type: ignore[union-attr]
            words = set(re.findall(r"\w+", inner.lower())) - {"or"}
            scored = [(len(words & set(re.findall(r"\w+", f"{n['title']} {n['text']}".lower()))), n)
                      for n in self.nodes.values() if n["gid"] == gid]
            ranked = sorted((x for x in scored if x[0]), key=lambda x: -x[0])[:params["k"]]
            return [self._hits([n for _, n in ranked], [float(score) for score, _ in ranked], params["corpus"])]
        if query == s["PASSAGE_VECTOR"]:
            fetched = list(self.nodes.values())[:params["fetch"]]  # the big corpus is nearest
            return [{**self._hits(fetched, [0.99] * len(fetched), params["corpus"]), "fetched": len(fetched)}]
        if query == s["PASSAGE_EXACT"]:
            vector = np.asarray(params["vector"])
            own = [n for n in self.nodes.values() if n["corpus"] == params["corpus"] and n["embedding"] is not None]
            scores = [(1 + float(n["embedding"] @ vector) / np.linalg.norm(n["embedding"]) / np.linalg.norm(vector))
                      / 2 for n in own]
            ranked = sorted(zip(scores, range(len(own)), own), key=lambda x: -x[0])[:params["k"]]
            return [self._hits([n for _, _, n in ranked], [score for score, _, _ in ranked], params["corpus"])]
        return []

    @staticmethod
    def _hits(nodes: list[dict[str, Any]], scores: list[float], corpus: str) -> dict[str, Any]:
        hits = [{"id": n["pid"], "title": n["title"], "text": n["text"], "score": score}
                for n, score in zip(nodes, scores) if n["corpus"] == corpus]
        return {"fetched": len(nodes), "hits": hits}


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_a_small_corpus_finds_its_own_passages_in_a_populated_database(mode: str) -> None:
    from mhqa_graph.testing.conformance import PASSAGES

    server = PopulatedServer()
    driver = RecordingDriver(server.respond)
    store = open_on(driver)
    store.add_passages("small", PASSAGES)
    hits = store.search("small", "Which city was Andrzej Żuławski born in?", k=3, mode=mode)
    assert "p3" in [h.id for h in hits] and {h.id for h in hits} <= {p.id for p in PASSAGES}
    small = cypher.collection_gid(cypher.key("corpus", "small"))
    assert all(c.parameters["query"].startswith(f"+gid:{small} +(") for c in calls_of(driver, cypher.PASSAGE_FULLTEXT))
    [stored] = {c.parameters["gid"] for c in calls_of(driver, cypher.ADD_PASSAGES)}
    assert stored == small


def test_every_index_query_carries_its_collection() -> None:
    store, driver = make_store()
    store.namespace = "t1"
    store.match_entities("g", "paris")
    store.search("c", "paris")
    [entity] = calls_of(driver, cypher.ENTITY_FULLTEXT)
    [passage] = calls_of(driver, cypher.PASSAGE_FULLTEXT)
    graph, corpus = (cypher.collection_gid(cypher.key(kind, cypher.key("t1", name))) for kind, name in
                     (("graph", "g"), ("corpus", "c")))
    assert entity.parameters["query"] == f"+gid:{graph} +(paris)"
    assert passage.parameters["query"] == f"+gid:{corpus} +(paris)"
    assert (entity.parameters["graph"], passage.parameters["corpus"]) == ("t1\u001fg", "t1\u001fc")
    assert calls_of(driver, cypher.ENTITY_EXACT)[0].parameters["graph"] == "t1\u001fg"  # a small graph: exact


# -- must fix 3: causal consistency ---------------------------------------------------------------
def test_sessions_share_one_bookmark_manager_so_a_read_follows_the_write_before_it() -> None:
    """As on a cluster: a follower answers a read only with what the bookmarks it got make it wait for."""
    driver = RecordingDriver()
    merged: list[int] = []

    def number(bookmark: str | None) -> int:
        return int(bookmark.rsplit(":", 1)[1]) if bookmark else 0

    def follower(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        if query == cypher.MERGE_COLLECTION:
            merged.append(len(driver.transactions) - 1)
            return COLLECTION_ROW
        if query == cypher.COLLECTION:  # a later bookmark of the database implies the earlier ones
            write = number(driver.transactions[merged[0]].bookmark) if merged else None
            seen = write is not None and any(number(b) >= write for b in driver.transactions[-1].bookmarks)
            return COLLECTION_ROW if seen else []
        return responder()(query, params)

    driver.responder = follower
    store = open_on(driver)
    store.add_passages("c", [Passage("p1", "", "one")])
    store.search("c", "one")
    managers = {id(session.bookmark_manager) for session in driver.sessions}
    assert len(managers) == 1 and driver.sessions[0].bookmark_manager is not None
    for before, after in itertools.pairwise(driver.transactions):
        assert before.bookmark in after.bookmarks
    assert open_on(driver)._bookmarks is not store._bookmarks  # one manager per store


# -- must fix 4: Lucene's clause limit --------------------------------------------------------------
LONG_QUESTIONS = {
    "cjk": "".join(chr(0x4E00 + i) for i in range(3000)) + "？",
    "hyphenated": " ".join(f"state-of-the-art-{i}" for i in range(400)),
    "mixed": " ".join(f"東京{i}-tower" for i in range(500)),
}


@pytest.mark.parametrize("name", LONG_QUESTIONS)
def test_long_questions_stay_under_the_clause_limit(name: str) -> None:
    store, driver = make_store()  # the driver refuses queries over 1024 clauses, as Lucene does
    store.search("c", LONG_QUESTIONS[name], mode="bm25")
    store.match_entities("g", LONG_QUESTIONS[name])
    for call in calls_of(driver, cypher.PASSAGE_FULLTEXT, cypher.ENTITY_FULLTEXT):
        fields = 3 if call.query == cypher.PASSAGE_FULLTEXT else 2
        assert lucene_clauses(call.parameters["query"], fields) <= 1024


def test_a_lower_clause_limit_is_met_by_a_shorter_retry() -> None:
    driver = RecordingDriver(responder(), max_clauses=200)
    store = open_on(driver)
    store.search("c", " ".join(f"word{i}" for i in range(1000)), mode="bm25")
    queries = [c.parameters["query"] for c in calls_of(driver, cypher.PASSAGE_FULLTEXT)]
    assert len(queries) == 2 and lucene_clauses(queries[1], 3) <= 200 < lucene_clauses(queries[0], 3)
    driver.max_clauses = 10
    with pytest.raises(StoreError, match="too many"):
        store.search("c", " ".join(f"word{i}" for i in range(1000)), mode="bm25")


def test_analysed_tokens_count_cjk_characters_one_by_one() -> None:
    assert cypher.analysed_tokens("東京タワー tower-bridge x_1") == 5 + 2 + 1
    assert lucene_or_query("東京タワー", max_tokens=2) == "東京"
    assert lucene_or_query("a-b-c d", max_tokens=2) == r"a\-b"


# -- should fix --------------------------------------------------------------------------------------
def test_a_prepared_database_opens_without_schema_rights() -> None:
    schema = schema_file(256)
    schema.schema_rights = False
    store, driver = make_store(schema=schema)
    assert {c.access_mode for c in driver.calls} == {"READ"}
    assert {c.query for c in driver.calls} >= {cypher.SHOW_INDEXES, cypher.SHOW_CONSTRAINTS}


def test_missing_schema_without_rights_says_what_to_do() -> None:
    with pytest.raises(StoreError, match="no schema rights.*neo4j/schema.cypher"):
        make_store(schema=RecordedSchema(schema_rights=False))


def test_read_only_sends_no_writes() -> None:
    store, driver = make_store(schema=schema_file(256), read_only=True)
    store.search("c", "q")
    with pytest.raises(StoreLocked, match="read-only"):
        store.add_passages("c", [Passage("p", "", "x")])
    assert {c.access_mode for c in driver.calls} == {"READ"}
    with pytest.raises(StoreError, match="lacks .*entity_embedding"):
        make_store(read_only=True)


def test_read_only_is_passed_through_open_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from mhqa_graph.store import neo4j_backend

    driver = RecordingDriver(responder(), schema=schema_file(256))
    monkeypatch.setattr(neo4j_backend.GraphDatabase, "driver", lambda *args, **kwargs: driver)
    store = open_store("neo4j://localhost:7687", embedder=SPEC, read_only=True)
    assert isinstance(store, Neo4jStore) and store.read_only


def test_an_index_of_an_older_version_is_named_with_its_fix() -> None:
    schema = RecordedSchema()
    schema.add_index("entity_name_ft", "FULLTEXT", "Entity", ["name"])
    with pytest.raises(StoreError, match=r"DROP INDEX entity_name_ft"):
        make_store(schema=schema)


def test_populating_indexes_warn_and_searches_go_on(caplog: pytest.LogCaptureFixture) -> None:
    schema = RecordedSchema(new_index_state="POPULATING", awaited_indexes_come_online=False)
    dense = [{"fetched": 1, "hits": [{"id": "b", "title": "B", "text": "tb", "score": 0.75}]}]
    bm25 = [{"fetched": 1, "hits": [{"id": "a", "title": "A", "text": "ta", "score": 2.0}]}]
    big = [{"embedder": SPEC, "dim": 256, "size": 10**6}]
    with caplog.at_level(logging.WARNING):
        store, driver = make_store(schema=schema, COLLECTION=big, PASSAGE_EXACT=dense, PASSAGE_FULLTEXT=bm25)
    assert "still populating" in caplog.text
    assert {"passage_text_ft", "passage_embedding"} <= set(store.populating)
    assert [h.id for h in store.search("c", "q", k=2)] == ["b"]  # exact vectors; the lexical ranking waits
    assert "lexical ranking is left out" in caplog.text
    with pytest.raises(StoreUnavailable, match="still populating"):
        store.search("c", "q", mode="bm25")
    for index in schema.indexes:
        index.update(state="ONLINE", populationPercent=100.0)
    assert [h.id for h in store.search("c", "q", k=2, mode="bm25")] == ["a"] and store.populating == {}


def test_vectors_are_32_bit_and_zero_vectors_are_left_out() -> None:
    store, driver = make_store()
    store.add_passages("c", [Passage("p1", "T", "some words"), Passage("p2", "", "?!")])
    [call] = calls_of(driver, cypher.SET_PASSAGE_VECTORS)
    assert [row["key"] for row in call.parameters["rows"]] == [cypher.key("c", "p1")]
    assert all(float(np.float32(x)) == x for x in call.parameters["rows"][0]["embedding"])
    assert "db.create.setNodeVectorProperty" in call.query


def test_stats_read_degrees_and_node_info_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    assert "(s)-[:REL]->()" in cypher.STATS and "]->(:Entity)" not in cypher.STATS
    assert cypher.NODE_INFO.count("ORDER BY r.relation, m.name LIMIT $limit") == 2  # the embedded store's facts
    facts = [{"relation": "r", "other": f"o{i}", "direction": "out"} for i in range(MAX_NODE_FACTS)]
    store, _ = make_store(NODE_INFO=[{"facts": facts, "degree": 50_000}])
    with caplog.at_level(logging.INFO):
        assert len(store.node_info("g", "hub").facts) == MAX_NODE_FACTS
    assert "has 50000 facts" in caplog.text


def test_default_password_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from mhqa_graph.store import neo4j_backend

    monkeypatch.delenv("NEO4J_PASSWORD", raising=False)
    driver = RecordingDriver(connect_error=server_error("Neo.ClientError.Security.Unauthorized", "unauthorized"))
    monkeypatch.setattr(neo4j_backend.GraphDatabase, "driver", lambda *args, **kwargs: driver)
    with pytest.raises(StoreUnavailable, match="NEO4J_PASSWORD is not set.*Neo4j 5 never accepts") as info:
        Neo4jStore.from_uri("neo4j://localhost:7687", embedder=SPEC)
    assert "\n" not in str(info.value)


def test_expired_credentials_say_how_to_change_them() -> None:
    store, driver = make_store()

    def expired(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        raise server_error("Neo.ClientError.Security.CredentialsExpired",
                           "The credentials you provided were valid, but must be changed before you can use this "
                           "instance.")

    driver.responder = expired
    with pytest.raises(StoreUnavailable, match="has expired.*ALTER CURRENT USER.*NEO4J_PASSWORD") as info:
        store.stats()
    assert "\n" not in str(info.value)


def test_collections_of_an_older_version_get_their_key_and_size() -> None:
    old = [{"collection": "corpus\u001fold", "kind": "corpus", "scope": "old"}]
    pages = iter([{"tagged": 1000, "last": 999}, {"tagged": 5, "last": 1004}])
    store, driver = make_store(COLLECTIONS_WITHOUT_GID=old, TAG_PASSAGES=lambda params: [next(pages)])
    assert [c.parameters["after"] for c in calls_of(driver, cypher.TAG_PASSAGES)] == [-1, 999]
    [finish] = calls_of(driver, cypher.FINISH_UPGRADE)
    assert finish.parameters == {"collection": "corpus\u001fold", "gid": cypher.collection_gid("corpus\u001fold"),
                                 "size": 1005}


def test_compose_file_keeps_the_password_out_of_docker_inspect() -> None:
    compose = (Path(__file__).resolve().parent.parent / "neo4j" / "docker-compose.yml").read_text()
    assert "NEO4J_PASSWORD" not in compose and "NEO4J_AUTH:" not in compose
    assert "NEO4J_AUTH_FILE: /run/secrets/" in compose and "secrets:" in compose


def test_a_name_too_long_for_a_range_index_is_a_bad_row_not_a_failed_batch(tmp_path: Path) -> None:
    """Neo4j fails a key over about 8 KB, and with it the whole batch's transaction (the recording driver does too):
    the shared cap refuses the name before any write, so a 10 KB passage id or entity name in a 1,001-row file is one
    bad row; skip_bad writes the other 1,000, without it the rows before it are written and an IngestError names
    its line (issue 65)."""
    from mhqa_graph.ingest.files import read_passages_file, read_triples_file
    from mhqa_graph.ingest.runner import ingest

    long = "n" * 10_000
    store, driver = make_store()
    with pytest.raises(StoreError, match="too large to index"):
        store._add_passages("c", [Passage(long, "t", "x")])  # past the shared layer: what the server does
    driver.calls.clear()
    with pytest.raises(InvalidInput, match="10,000 bytes"):
        store.add_passages("c", [Passage("p1", "t", "x"), Passage(long, "t", "x")])
    assert not calls_of(driver, cypher.MERGE_COLLECTION, cypher.ADD_PASSAGES)
    passages, triples = tmp_path / "p.jsonl", tmp_path / "t.tsv"
    passages.write_text("".join(json.dumps({"id": long if i == 500 else f"p{i}", "text": f"Passage {i}."}) + "\n"
                                for i in range(1001)), encoding="utf-8")
    triples.write_text("".join(f"{long if i == 500 else f'e{i}'}\tr\tx{i}\n" for i in range(1001)), encoding="utf-8")
    report = ingest(store, corpus="c", passages=read_passages_file(passages, yield_errors=True), graph="g",
                    triples=read_triples_file(triples, yield_errors=True), skip_bad=True)
    assert report.skipped_bad == 2 and report.errors[0].startswith(f"{passages}:501: ")
    assert report.errors[1].startswith(f"{triples}:501: ") and "10,000 bytes" in report.errors[1]
    for statement in (cypher.ADD_PASSAGES, cypher.ADD_TRIPLES):
        assert sum(len(call.parameters["rows"]) for call in calls_of(driver, statement)) == 1000
    store, driver = make_store()
    with pytest.raises(IngestError, match=f"^{re.escape(str(passages))}:501: .*10,000 bytes"):
        ingest(store, corpus="c", passages=read_passages_file(passages, yield_errors=True))
    assert sum(len(call.parameters["rows"]) for call in calls_of(driver, cypher.ADD_PASSAGES)) == 500


def test_the_file_sha256_is_a_property_of_the_collection_set_in_a_write() -> None:
    store, driver = make_store(COLLECTION=[{**COLLECTION_ROW[0], "file_sha256": "c" * 64}])
    store.set_file_sha256("corpus", "env", "c" * 64)
    [call] = calls_of(driver, cypher.SET_FILE_SHA256)
    assert call.parameters == {"collection": "corpus\u001fenv", "sha256": "c" * 64} and call.access_mode == "WRITE"
    assert store.file_sha256("corpus", "env") == "c" * 64
    assert make_store()[0].file_sha256("graph", "env") is None  # a collection built before it was kept
    missing, _ = make_store(SET_FILE_SHA256=[{"updated": 0}])
    with pytest.raises(UnknownGraph):
        missing.set_file_sha256("graph", "nope", "c" * 64)
    reader, _ = make_store(schema=schema_file(256), read_only=True)
    with pytest.raises(StoreLocked):
        reader.set_file_sha256("corpus", "env", "c" * 64)


@pytest.mark.parametrize("spec", ["hash:0", "hash:-3", "hash:4097", f"hash:{10**12}", "hash:x", "hash:"])
def test_an_embedder_of_no_or_too_many_dimensions_is_refused_before_any_write(spec: str) -> None:
    driver = RecordingDriver(responder())
    with pytest.raises(InvalidInput, match=r"1\.\.4096"):
        open_on(driver, spec)
    assert not [call for call in driver.calls if call.access_mode == "WRITE"]
