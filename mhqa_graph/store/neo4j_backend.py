"""The knowledge store on a Neo4j 5 server, through the official `neo4j` driver.

Every statement is a constant of `cypher.py`; user data travels only in parameters.
Reads run in `execute_read`, writes in `execute_write`, in batches of `BATCH` rows.
All collections of a database share one embedder (the vector indexes have one dimension).
Set `namespace` to keep a store's graphs and corpora apart from others in the same database.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np
from neo4j.exceptions import AuthError, ConfigurationError, DriverError, Neo4jError, ServiceUnavailable, SessionExpired

from neo4j import Driver, GraphDatabase, ManagedTransaction

from ..embeddings import Embedder, load_embedder
from ..errors import (
    EmbedderMismatch,
    EntityNotFound,
    InvalidInput,
    InvalidStoreURI,
    StoreError,
    StoreUnavailable,
    UnknownCorpus,
    UnknownGraph,
)
from ..types import EntityHit, Fact, NodeInfo, Passage, PassageHit, SearchMode, StoreStats, Triple
from . import cypher
from .base import KnowledgeStore
from .fusion import candidate_depth, reciprocal_rank_fusion

BATCH = 1000  # rows per UNWIND statement
MAX_FETCH = 10_000  # deepest index query when filtering the shared indexes to one graph/corpus
TIMEOUT_S = 5.0  # connect, pool acquisition and transaction retry budget
INDEX_WAIT_S = 60

T = TypeVar("T")
Row = dict[str, Any]


@contextmanager
def _driver_errors(uri: str) -> Iterator[None]:
    """Turn driver exceptions into store errors."""
    try:
        yield
    except (ServiceUnavailable, SessionExpired, AuthError) as e:
        raise StoreUnavailable(
            f"Neo4j at {uri} is unavailable ({type(e).__name__}: {e}); is the server up (see neo4j/README.md) "
            "and are NEO4J_USER / NEO4J_PASSWORD right?"
        ) from e
    except (Neo4jError, DriverError) as e:
        raise StoreError(f"Neo4j at {uri}: {type(e).__name__}: {e}") from e


def _batches(items: Sequence[T], size: int = BATCH) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _run(tx: ManagedTransaction, statement: str, params: Row) -> list[Row]:
    return tx.run(statement, params).data()


def _index_hits(tx: ManagedTransaction, statement: str, k: int, params: Row) -> list[Row]:
    """Top-k hits of a shared index filtered to one graph/corpus, fetching deeper while too few match."""
    fetch = min(2 * k, MAX_FETCH)
    while True:
        row = _run(tx, statement, {**params, "k": k, "fetch": fetch})[0]
        if len(row["hits"]) >= k or row["fetched"] < fetch or fetch >= MAX_FETCH:
            return sorted(row["hits"], key=lambda h: -h["score"])
        fetch = min(4 * fetch, MAX_FETCH)


def _add_triples_tx(tx: ManagedTransaction, graph: str, entities: list[Row], triples: list[Row]) -> int:
    for rows in _batches(entities):
        _run(tx, cypher.ADD_ENTITIES, {"graph": graph, "rows": rows})
    return _run(tx, cypher.ADD_TRIPLES, {"rows": triples})[0]["added"]


def _cosine(neo4j_score: float) -> float:
    """Neo4j reports cosine similarity as (1 + cos) / 2; the store API reports cos."""
    return 2.0 * neo4j_score - 1.0


def _passage_text(p: Passage) -> str:
    return f"{p.title}: {p.text}"  # as the embedded backend embeds passages


class Neo4jStore(KnowledgeStore):
    """A `KnowledgeStore` on a Neo4j 5 database. Open with `open_store("neo4j://host:7687")`."""

    backend = "neo4j"

    def __init__(self, driver: Driver, *, embedder: str | None = None, database: str | None = None,
                 uri: str = "neo4j://") -> None:
        """Use an open `driver`; creates the schema if missing. `embedder=None` reuses the stored one."""
        self.uri = uri
        self.namespace = ""  # a non-empty namespace isolates this store's collections, e.g. per test
        self._driver = driver
        self._database = database
        self._embedder = self._pick_embedder(embedder)
        self.ensure_schema()

    @classmethod
    def from_uri(cls, uri: str, embedder: str | None = None, database: str | None = None) -> Neo4jStore:
        """Connect with NEO4J_USER / NEO4J_PASSWORD (default neo4j/neo4j); database: arg, else NEO4J_DATABASE."""
        target = urlsplit(uri)._replace(query="", fragment="").geturl()
        auth = (os.environ.get("NEO4J_USER", "neo4j"), os.environ.get("NEO4J_PASSWORD", "neo4j"))
        try:
            driver = GraphDatabase.driver(target, auth=auth, connection_timeout=TIMEOUT_S,
                                          connection_acquisition_timeout=TIMEOUT_S,
                                          max_transaction_retry_time=TIMEOUT_S)
        except (ConfigurationError, ValueError) as e:
            raise InvalidStoreURI(f"{uri!r}: {e}") from e
        try:
            with _driver_errors(target):
                driver.verify_connectivity()
            return cls(driver, embedder=embedder, database=database or os.environ.get("NEO4J_DATABASE") or None,
                       uri=uri)
        except BaseException:
            driver.close()
            raise

    def close(self) -> None:
        self._driver.close()

    # -- plumbing ----------------------------------------------------------------------------
    def _read(self, fn: Callable[..., T], *args: Any) -> T:
        with _driver_errors(self.uri), self._driver.session(database=self._database) as session:
            return session.execute_read(fn, *args)

    def _write(self, fn: Callable[..., T], *args: Any) -> T:
        with _driver_errors(self.uri), self._driver.session(database=self._database) as session:
            return session.execute_write(fn, *args)

    def _pick_embedder(self, spec: str | None) -> Embedder:
        stored = {row["embedder"] for row in self._read(_run, cypher.EMBEDDERS, {})}
        if len(stored) > 1:
            raise EmbedderMismatch(f"collections of this database use several embedders: {sorted(stored)}")
        if stored and spec in (None, "", "auto"):
            spec = next(iter(stored))
        embedder = load_embedder(spec)
        if stored and embedder.spec not in stored:
            raise EmbedderMismatch(f"this database was built with embedder {next(iter(stored))!r}, "
                                   f"not {embedder.spec!r}; open it with that embedder or use another database")
        return embedder

    def _scope(self, name: str) -> str:
        """How a graph/corpus name is stored: prefixed by the namespace, if any."""
        return cypher.key(self.namespace, name) if self.namespace else name

    def _check_collection(self, kind: str, name: str, rows: list[Row]) -> None:
        if not rows:
            raise UnknownGraph(name, self.uri) if kind == "graph" else UnknownCorpus(name, self.uri)
        if rows[0]["embedder"] != self._embedder.spec:
            raise EmbedderMismatch(f"{kind} {name!r} was built with embedder {rows[0]['embedder']!r}, "
                                   f"not {self._embedder.spec!r}")

    def _require(self, tx: ManagedTransaction, kind: str, name: str) -> None:
        """Inside a read: raise UnknownGraph/UnknownCorpus unless the collection exists."""
        collection = cypher.key(kind, self._scope(name))
        self._check_collection(kind, name, _run(tx, cypher.COLLECTION, {"collection": collection}))

    def _merge_collection(self, kind: str, name: str) -> None:
        scope = self._scope(name)
        params = {"collection": cypher.key(kind, scope), "kind": kind, "namespace": self.namespace, "name": name,
                  "scope": scope, "embedder": self._embedder.spec, "dim": self._embedder.dim}
        self._check_collection(kind, name, self._write(_run, cypher.MERGE_COLLECTION, params))

    def ensure_schema(self) -> None:
        """Create missing constraints and indexes; vector indexes get the embedder's dimension."""
        for statement in cypher.SCHEMA:
            self._write(_run, statement, {})
        for statement in cypher.VECTOR_SCHEMA:
            self._write(_run, statement, {"dimensions": self._embedder.dim})
        self._read(_run, cypher.AWAIT_INDEXES, {"seconds": INDEX_WAIT_S})

    def _vector(self, text: str) -> list[float] | None:
        """The query embedding; None if it is all zeros, which Neo4j's cosine index rejects."""
        vector = self._embedder.embed([text])[0]
        return vector.tolist() if np.any(vector) else None

    # -- writing -----------------------------------------------------------------------------
    def _add_triples(self, graph: str, triples: list[Triple]) -> int:
        self._merge_collection("graph", graph)
        scope = self._scope(graph)
        added = 0
        for batch in _batches(triples):
            names = list(dict.fromkeys(n for s, _, o in batch for n in (s, o)))
            keys = [cypher.key(scope, n) for n in names]
            existing = {r["key"] for r in self._read(_run, cypher.EXISTING_ENTITIES, {"keys": keys})}
            new = [(n, k) for n, k in zip(names, keys, strict=True) if k not in existing]
            vectors = self._embedder.embed([n for n, _ in new])
            entities = [{"key": k, "name": n, "folded": n.casefold(), "embedding": v.tolist()}
                        for (n, k), v in zip(new, vectors, strict=True)]
            rows = [{"subject": cypher.key(scope, s), "relation": r, "object": cypher.key(scope, o)}
                    for s, r, o in batch]
            added += self._write(_add_triples_tx, scope, entities, rows)
        return added

    def _add_passages(self, corpus: str, passages: list[Passage]) -> int:
        self._merge_collection("corpus", corpus)
        scope = self._scope(corpus)
        added = 0
        for batch in _batches(passages):
            keys = [cypher.key(scope, p.id) for p in batch]
            existing = {r["key"] for r in self._read(_run, cypher.EXISTING_PASSAGES, {"keys": keys})}
            new = [(p, k) for p, k in zip(batch, keys, strict=True) if k not in existing]
            if not new:
                continue
            vectors = self._embedder.embed([_passage_text(p) for p, _ in new])
            rows = [{"key": k, "pid": p.id, "i": i, "title": p.title, "text": p.text, "embedding": v.tolist()}
                    for i, ((p, k), v) in enumerate(zip(new, vectors, strict=True))]
            params = {"collection": cypher.key("corpus", scope), "corpus": scope, "rows": rows}
            added += self._write(_run, cypher.ADD_PASSAGES, params)[0]["added"]
        return added

    # -- reading -----------------------------------------------------------------------------
    def _match_entities(self, graph: str, text: str, k: int) -> list[EntityHit]:
        depth = candidate_depth(k)
        scope = self._scope(graph)
        query = cypher.lucene_or_query(text)
        vector = self._vector(text)

        def rankings(tx: ManagedTransaction) -> list[list[str]]:
            self._require(tx, "graph", graph)
            semantic, lexical = [], []
            if vector is not None:
                semantic = _index_hits(tx, cypher.ENTITY_VECTOR, depth, {"vector": vector, "graph": scope})
            if query:
                lexical = _index_hits(tx, cypher.ENTITY_FULLTEXT, depth, {"query": query, "graph": scope})
            return [[h["name"] for h in semantic], [h["name"] for h in lexical]]

        fused = reciprocal_rank_fusion(self._read(rankings))
        return [EntityHit(str(name), score) for name, score in fused[:k]]

    def _node_info(self, graph: str, name: str) -> NodeInfo:
        scope = self._scope(graph)

        def lookup(tx: ManagedTransaction) -> tuple[str, list[Row]]:
            """The node's name and facts; a name differing only in case is accepted when unambiguous."""
            self._require(tx, "graph", graph)
            actual = name
            rows = _run(tx, cypher.NODE_INFO, {"key": cypher.key(scope, name)})
            if not rows:
                found = _run(tx, cypher.ENTITIES_BY_FOLDED, {"graph": scope, "folded": name.casefold()})
                if len(found) != 1:
                    raise EntityNotFound(graph, name)
                actual = found[0]["name"]
                rows = _run(tx, cypher.NODE_INFO, {"key": cypher.key(scope, actual)})
            return actual, rows[0]["facts"]

        actual, facts = self._read(lookup)
        ordered = sorted({Fact(f["relation"], f["other"], f["direction"]) for f in facts},
                         key=lambda f: (f.direction != "out", f.relation, f.other))
        return NodeInfo(graph, actual, ordered)

    def _search(self, corpus: str, query: str, k: int, mode: SearchMode) -> list[PassageHit]:
        depth = candidate_depth(k) if mode == "hybrid" else k
        scope = self._scope(corpus)
        lucene = cypher.lucene_or_query(query) if mode != "dense" else None
        vector = self._vector(query) if mode != "bm25" else None

        def hits(tx: ManagedTransaction) -> tuple[list[Row], list[Row]]:
            self._require(tx, "corpus", corpus)
            bm25, dense = [], []
            if lucene:
                bm25 = _index_hits(tx, cypher.PASSAGE_FULLTEXT, depth, {"query": lucene, "corpus": scope})
            if vector is not None:
                dense = _index_hits(tx, cypher.PASSAGE_VECTOR, depth, {"vector": vector, "corpus": scope})
            return bm25, [{**h, "score": _cosine(h["score"])} for h in dense]

        bm25, dense = self._read(hits)
        if mode != "hybrid":
            ranked = bm25 if mode == "bm25" else dense
            return [PassageHit(h["id"], h["title"], h["text"], h["score"]) for h in ranked[:k]]
        by_id = {h["id"]: h for h in dense + bm25}
        fused = reciprocal_rank_fusion([[h["id"] for h in bm25], [h["id"] for h in dense]])
        return [PassageHit(str(pid), by_id[pid]["title"], by_id[pid]["text"], score) for pid, score in fused[:k]]

    def _passages(self, corpus: str) -> Iterator[Passage]:
        self._read(self._require, "corpus", corpus)
        return self._iter_passages(corpus)

    def _iter_passages(self, corpus: str) -> Iterator[Passage]:
        scope, after = self._scope(corpus), -1
        while True:
            rows = self._read(_run, cypher.PASSAGES_PAGE, {"corpus": scope, "after": after, "limit": BATCH})
            yield from (Passage(r["id"], r["title"], r["text"]) for r in rows)
            if len(rows) < BATCH:
                return
            after = rows[-1]["seq"]

    def _collection_names(self, kind: str) -> list[str]:
        rows = self._read(_run, cypher.COLLECTION_NAMES, {"namespace": self.namespace, "kind": kind})
        return [r["name"] for r in rows]

    def _stats(self) -> StoreStats:
        rows = self._read(_run, cypher.STATS, {"namespace": self.namespace})
        graphs = {r["name"]: {"entities": r["entities"], "triples": r["triples"]} for r in rows if r["kind"] == "graph"}
        corpora = {r["name"]: {"passages": r["passages"]} for r in rows if r["kind"] == "corpus"}
        return StoreStats(self.backend, graphs, corpora)

    def drop_namespace(self) -> None:
        """Delete every graph and corpus of this store's (non-empty) namespace."""
        if not self.namespace:
            raise InvalidInput("drop_namespace needs a namespace; it never drops the default one")
        params = {"namespace": self.namespace, "limit": BATCH}
        for statement in (cypher.DROP_ENTITIES, cypher.DROP_PASSAGES):
            while self._write(_run, statement, params)[0]["deleted"]:
                pass
        self._write(_run, cypher.DROP_COLLECTIONS, {"namespace": self.namespace})
