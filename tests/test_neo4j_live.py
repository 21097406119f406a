"""The Neo4j backend against what only a real server (or a real socket) shows: bad input gives one-line
errors within seconds, and the schema, upgrade, read-only and concurrent-writer paths work on the server
at NEO4J_URI (the recording driver in test_neo4j_recording.py answers in the shape the code expects)."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("neo4j")

from mhqa_graph import Passage, open_store  # noqa: E402
from mhqa_graph.errors import StoreError, StoreLocked, StoreUnavailable  # noqa: E402
from mhqa_graph.store.neo4j_backend import probe  # noqa: E402

live = pytest.mark.neo4j_live


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unavailable(uri: str) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        open_store(uri, embedder="hash")
    return str(info.value), time.monotonic() - started


@pytest.mark.parametrize("scheme", ["neo4j", "bolt"])
def test_a_port_nothing_listens_on_fails_in_one_line_at_once(scheme, capfd):
    message, took = _unavailable(f"{scheme}://127.0.0.1:{_free_port()}")
    assert took < 5 and "\n" not in message and "Connection refused" in message and "server.sh start" in message
    assert capfd.readouterr().err == ""  # the driver's own warning is not printed beside it


def test_a_port_that_does_not_speak_bolt_fails_in_one_line_within_seconds():
    with socket.socket() as server:  # accepts connections and never answers, like a wrong or hung service
        server.bind(("127.0.0.1", 0))
        server.listen()
        accepted: list[socket.socket] = []
        threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
        message, took = _unavailable(f"bolt://127.0.0.1:{server.getsockname()[1]}")
        for conn in accepted:
            conn.close()
    assert took < 10 and "\n" not in message and "handshake" in message


def _live_store(**kwargs):
    store = open_store(os.environ["NEO4J_URI"], embedder="hash", **kwargs)
    store.namespace = f"live{uuid.uuid4().hex[:8]}"
    return store


@live
def test_unknown_database_says_how_to_choose_one():
    message, took = _unavailable(os.environ["NEO4J_URI"].split("?")[0] + "?database=nosuchdb")
    assert took < 5 and "\n" not in message and "no such database" in message and "NEO4J_DATABASE" in message


@live
def test_wrong_password_says_how_to_set_it(monkeypatch):
    monkeypatch.setenv("NEO4J_PASSWORD", "not-the-password")
    reason = probe(os.environ["NEO4J_URI"])
    if reason is not None:  # a server with auth off (neo4j/server.sh without MHQA_NEO4J_PASSWORD) accepts any
        assert "refused the credentials" in reason and "NEO4J_PASSWORD" in reason and "\n" not in reason


@live
def test_read_only_store_reads_and_refuses_writes():
    store = _live_store()
    try:
        store.add_passages("docs", [Passage("p1", "Lviv", "Andrzej Żuławski was born in Lviv.")])
        reader = open_store(os.environ["NEO4J_URI"], embedder="hash", read_only=True)
        reader.namespace = store.namespace
        try:
            assert [h.id for h in reader.search("docs", "Lviv", k=1, mode="bm25")] == ["p1"]
            with pytest.raises(StoreLocked):
                reader.add_passages("docs", [Passage("p2", "x", "y")])
        finally:
            reader.close()
    finally:
        store.drop_namespace()
        store.close()


@live
def test_concurrent_writers_get_disjoint_sequence_numbers_and_sizes_add_up():
    """ADD_PASSAGES locks the collection node with a dummy write before reading next_seq: on a real server
    four writers at once still page every passage exactly once."""
    store = _live_store()
    try:
        store.add_passages("docs", [Passage("seed", "seed", "seed")])  # the collection exists before the race
        batches = [[Passage(f"w{w}-{i}", f"title {w} {i}", f"text {w} {i}") for i in range(1500)] for w in range(4)]
        with ThreadPoolExecutor(4) as pool:
            assert sum(pool.map(lambda b: store.add_passages("docs", b), batches)) == 6000
        ids = [p.id for p in store.passages("docs")]
        assert len(ids) == len(set(ids)) == 6001
        assert store.stats().corpora == {"docs": {"passages": 6001}}
        assert len(store.search("docs", "title text", k=10, mode="bm25")) == 10
    finally:
        store.drop_namespace()
        store.close()


@live
def test_collections_from_before_the_fulltext_key_are_upgraded_on_open():
    """A collection written before `gid` and `size` (and its nodes) is tagged in pages on the next writable open."""
    store = _live_store()
    namespace = store.namespace
    try:
        store.add_triples("kg", [(f"e{i}", "next", f"e{i + 1}") for i in range(2500)])
        store.add_passages("docs", [Passage(f"p{i}", f"Title {i}", f"Lviv passage {i}") for i in range(2500)])
        store._write(lambda tx: tx.run(
            "MATCH (c:Collection {namespace: $ns}) REMOVE c.gid, c.size WITH c "
            "MATCH (n) WHERE (n:Entity AND n.graph = c.scope) OR (n:Passage AND n.corpus = c.scope) REMOVE n.gid",
            ns=namespace).consume())
        store.close()
        store = _live_store()
        store.namespace = namespace
        assert not store._read(lambda tx: tx.run("MATCH (c:Collection {namespace: $ns}) WHERE c.gid IS NULL "
                                                 "RETURN c", ns=namespace).data())
        assert [h.id for h in store.search("docs", "passage 1234", k=1, mode="bm25")] == ["p1234"]
        assert [h.name for h in store.match_entities("kg", "e2345", k=1)] == ["e2345"]
        assert store.stats().graphs == {"kg": {"entities": 2501, "triples": 2500}}
    finally:
        store.drop_namespace()
        store.close()


@live
def test_an_index_of_another_shape_under_our_name_says_what_differs():
    """An older full-text index (no `gid`) under the name the store uses: the store names both shapes and the fix."""
    store = _live_store()
    name = store._indexes["passage_text"]
    try:
        store._write(lambda tx: tx.run(f"DROP INDEX {name}").consume())
        store._write(lambda tx: tx.run(
            f"CREATE FULLTEXT INDEX {name} FOR (p:Passage) ON EACH [p.title, p.text]").consume())
        with pytest.raises(StoreError) as info:
            _live_store().close()
        message = str(info.value)
        assert "FULLTEXT index on :Passage(title, text)" in message and "(gid, title, text)" in message
        assert f"DROP INDEX {name}" in message
    finally:
        store._write(lambda tx: tx.run(f"DROP INDEX {name} IF EXISTS").consume())
        store.close()
        _live_store().close()  # recreates it as this version needs


@live
def test_collections_above_the_exact_limit_use_the_vector_index_with_the_exact_answers(monkeypatch):
    """Exact cosine in Cypher costs ~15 µs per vector (150-300 ms per query at 20,000 on 2 cores, measured with
    bench/store.py), so past EXACT_MAX the shared HNSW index answers; its top 10 must still be the exact one."""
    from mhqa_graph.store import cypher, neo4j_backend

    sent: list[str] = []
    real_run = neo4j_backend._run
    monkeypatch.setattr(neo4j_backend, "_run", lambda tx, statement, params: sent.append(statement) or
                        real_run(tx, statement, params))
    store = _live_store()
    try:
        n = neo4j_backend.EXACT_MAX + 500
        store.add_passages("docs", [Passage(f"p{i}", f"Title {i}", f"passage number {i} about topic {i % 97}")
                                    for i in range(n)])
        store.add_triples("kg", [(f"entity {i}", "next", f"entity {i + 1}") for i in range(n)])
        recall = []  # by score: the hash embedder gives these texts many ties, which either side may break
        for q in (f"passage number {i} about topic {i % 97}" for i in range(0, n, n // 20)):
            sent.clear()
            ann = store.search("docs", q, k=10, mode="dense")
            assert cypher.PASSAGE_VECTOR in sent and cypher.PASSAGE_EXACT not in sent
            exact = store._read(lambda tx, q=q: real_run(tx, cypher.PASSAGE_EXACT, {
                "corpus": store._scope("docs"), "vector": store._vector(q), "k": 10}))[0]["hits"]
            tenth = neo4j_backend._cosine(exact[-1]["score"])
            recall.append(sum(h.score >= tenth - 1e-5 for h in ann) / 10)
        assert sum(recall) / len(recall) >= 0.95, recall
        sent.clear()
        assert store.match_entities("kg", "entity 1234", k=3)[0].name == "entity 1234"
        assert cypher.ENTITY_VECTOR in sent and cypher.ENTITY_EXACT not in sent
    finally:
        store.drop_namespace()
        store.close()


@live
def test_vector_indexes_are_not_quantized_where_the_server_can_say_so():
    """5.23+ quantizes vector indexes by default (scores up to 0.01 off the exact cosine, recall@10 near 0.97 at
    any depth on HotpotQA dev_b): the store creates them without; 5.18-5.22 get the statement without the option."""
    from mhqa_graph.store import neo4j_backend

    store = _live_store()
    try:
        version = store._read(lambda tx: tx.run("CALL dbms.components() YIELD versions RETURN versions[0] AS v")
                              .single()["v"])
        rows = store._read(lambda tx: tx.run("SHOW VECTOR INDEXES YIELD name, options").data())
        ours = {store._indexes["entity_vector"], store._indexes["passage_vector"]}
        for row in rows:
            if row["name"] in ours:
                quantized = row["options"]["indexConfig"].get("vector.quantization.enabled")
                assert quantized is not True or row["name"] in neo4j_backend._QUANTIZED_WARNED, (version, row)
                if tuple(int(x) for x in version.split(".")[:2]) < (5, 23):
                    assert quantized is None, (version, row)
    finally:
        store.close()
