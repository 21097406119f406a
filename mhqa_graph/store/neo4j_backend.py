"""The knowledge store on a Neo4j server (5.18 or later), through the official `neo4j` driver.

Every statement is a constant of `cypher.py`; user data travels only in parameters.
Reads run in `execute_read`, writes in `execute_write`, in batches of `BATCH` rows, all in
sessions that share one bookmark manager, so on a cluster or Aura a read sees the store's earlier writes.
All collections of a database share one embedder (the vector indexes have one dimension).
Set `namespace` to keep a store's graphs and corpora apart from others in the same database.

Searches stay inside one graph or corpus however small a share of the database it is: full-text
queries carry the collection's key (`+gid:<key>`), and vector queries are exact (cosine over the
collection's nodes) for small collections, or when the shared vector index, fetched to `MAX_FETCH`,
still holds too few of the collection's nodes.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

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
    StoreLocked,
    StoreUnavailable,
    UnknownCorpus,
    UnknownGraph,
)
from ..types import EntityHit, Fact, NodeInfo, Passage, PassageHit, SearchMode, StoreStats, Triple
from . import cypher
from .base import MAX_NODE_FACTS, KnowledgeStore
from .fusion import candidate_depth, reciprocal_rank_fusion

log = logging.getLogger(__name__)
# The driver logs a refused connection as a warning too; without this, an application with no logging set up
# would print it to stderr beside the StoreUnavailable message. Handlers the application adds still get it.
logging.getLogger("neo4j").addHandler(logging.NullHandler())

BATCH = 1000  # rows per UNWIND statement
MAX_FETCH = 10_000  # deepest vector index query when keeping one graph's/corpus's neighbours
EXACT_MAX = 2_000  # collections up to this size get exact nearest neighbours (~15 µs a vector), not the index
MIN_FETCH = 100  # the shallowest vector index query: Lucene's HNSW searches only as wide as it fetches
_QUANTIZED_WARNED: set[str] = set()  # quantized vector indexes already warned about, once per process
MIN_TOKENS = 16  # the shortest full-text query the too-many-clauses retry goes down to
TIMEOUT_S = 5.0  # connect, pool acquisition and transaction retry budget
INDEX_WAIT_S = 60  # how long opening waits for populating indexes, in all

FORBIDDEN = "Neo.ClientError.Security.Forbidden"
CREDENTIALS_EXPIRED = "Neo.ClientError.Security.CredentialsExpired"
DATABASE_NOT_FOUND = "Neo.ClientError.Database.DatabaseNotFound"
_TOO_MANY_CLAUSES = re.compile(r"too ?many ?(nested ?)?clauses|maxClauseCount", re.IGNORECASE)

T = TypeVar("T")
Row = dict[str, Any]


class _TooManyClauses(StoreError):
    """Lucene refused a full-text query as too long; the caller retries with a shorter one."""


def _one_line(e: BaseException, limit: int = 400) -> str:
    """The driver's message on one line, with the cause it wraps (a routing failure hides the refused connection
    in an exception group), cut to `limit` characters."""
    parts, seen, todo = [], set(), [e]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        text = " ".join(str(getattr(current, "message", None) or current).split())
        if text and not any(text in p for p in parts) and not isinstance(current, BaseExceptionGroup):
            parts.append(text)
        todo.extend(getattr(current, "exceptions", ()))
        todo.extend(c for c in (current.__cause__, current.__context__) if c is not None)
    line = ": ".join(parts)
    return line if len(line) <= limit else line[:limit - 3] + "..."


@contextmanager
def _driver_errors(uri: str, credentials: str) -> Iterator[None]:
    """Turn driver exceptions into store errors with one-line messages; `credentials` says whose they were."""
    try:
        yield
    except AuthError as e:
        raise StoreUnavailable(
            f"Neo4j at {uri} is unavailable: it refused the credentials ({credentials}); set NEO4J_USER / "
            "NEO4J_PASSWORD to a user and password of this server") from e
    except (ServiceUnavailable, SessionExpired) as e:
        raise StoreUnavailable(
            f"Neo4j at {uri} is unavailable ({type(e).__name__}: {_one_line(e)}); is the server up (bash "
            "neo4j/server.sh start, or see neo4j/README.md), on this host and port?") from e
    except Neo4jError as e:
        if e.code == CREDENTIALS_EXPIRED:
            raise StoreUnavailable(
                f"Neo4j at {uri} is unavailable: the password ({credentials}) has expired and must be changed; "
                "run `ALTER CURRENT USER SET PASSWORD FROM '<old>' TO '<new>'` in cypher-shell, then set "
                "NEO4J_PASSWORD to the new one") from e
        if e.code == DATABASE_NOT_FOUND:
            raise StoreUnavailable(
                f"Neo4j at {uri} has no such database ({_one_line(e, 200)}); set NEO4J_DATABASE or ?database= to one "
                "that SHOW DATABASES lists, or leave both unset for the server's default") from e
        if _TOO_MANY_CLAUSES.search(e.message or ""):
            raise _TooManyClauses(f"Neo4j at {uri}: full-text query too long: {e.message}") from e
        raise StoreError(f"Neo4j at {uri}: {type(e).__name__}: {e}") from e
    except DriverError as e:
        raise StoreError(f"Neo4j at {uri}: {type(e).__name__}: {_one_line(e)}") from e


def _batches(items: Sequence[T], size: int = BATCH) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _run(tx: ManagedTransaction, statement: str, params: Row) -> list[Row]:
    return tx.run(statement, params).data()


def _vector_rows(keys: Sequence[str], vectors: np.ndarray) -> list[Row]:
    """Rows for SET_*_VECTORS: 32-bit embeddings, leaving out all-zero ones (no cosine similarity exists for them)."""
    return [{"key": k, "embedding": v.astype(np.float32).tolist()}
            for k, v in zip(keys, vectors, strict=True) if np.any(v)]


def _cosine(neo4j_score: float) -> float:
    """Neo4j reports cosine similarity as (1 + cos) / 2; the store API reports cos."""
    return 2.0 * neo4j_score - 1.0


def _passage_text(p: Passage) -> str:
    return f"{p.title}: {p.text}"  # as the embedded backend embeds passages


def _describe(type_: str, labels: Sequence[str], properties: Sequence[str]) -> str:
    return f"a {type_} index on :{'|'.join(labels)}({', '.join(properties)})"


def _connect(uri: str) -> tuple[Driver, str, str]:
    """A driver for `uri` (query and fragment dropped) with NEO4J_USER / NEO4J_PASSWORD, the URI it targets,
    and whose credentials those are, for messages."""
    target = urlsplit(uri)._replace(query="", fragment="").geturl()
    user, password = os.environ.get("NEO4J_USER", "neo4j"), os.environ.get("NEO4J_PASSWORD")
    credentials = f"user {user!r}" + ("" if password else ", and NEO4J_PASSWORD is not set, so the default "
                                      "password 'neo4j' was sent, which Neo4j 5 never accepts")
    try:
        driver = GraphDatabase.driver(target, auth=(user, password or "neo4j"), connection_timeout=TIMEOUT_S,
                                      connection_acquisition_timeout=TIMEOUT_S, max_transaction_retry_time=TIMEOUT_S)
    except (ConfigurationError, ValueError) as e:
        raise InvalidStoreURI(f"{uri!r}: {e}") from e
    return driver, target, credentials


def probe(uri: str) -> str | None:
    """None if the server at `uri` answers `RETURN 1` with NEO4J_USER / NEO4J_PASSWORD, else why not, in one line."""
    database = parse_qs(urlsplit(uri).query).get("database", [None])[-1]
    try:
        driver, target, credentials = _connect(uri)
    except InvalidStoreURI as e:
        return str(e)
    try:
        with _driver_errors(target, credentials), driver.session(
                database=database or os.environ.get("NEO4J_DATABASE") or None) as session:
            session.run(cypher.PING).consume()
        return None
    except StoreError as e:
        return str(e).splitlines()[0]
    finally:
        driver.close()


class Neo4jStore(KnowledgeStore):
    """A `KnowledgeStore` on a Neo4j database. Open with `open_store("neo4j://host:7687")`."""

    backend = "neo4j"

    def __init__(self, driver: Driver, *, embedder: str | None = None, database: str | None = None,
                 uri: str = "neo4j://", read_only: bool = False, credentials: str = "the driver's auth") -> None:
        """Use an open `driver`; creates the schema where missing. `embedder=None` reuses the stored one.

        `read_only` sends no writes at all (add_* raise StoreLocked) and needs the schema in place."""
        self.uri = uri
        self.namespace = ""  # a non-empty namespace isolates this store's collections, e.g. per test
        self.read_only = read_only
        self.populating: dict[str, float] = {}  # this store's indexes still populating -> percent done
        self._driver = driver
        self._database = database
        self._credentials = credentials
        self._bookmarks = GraphDatabase.bookmark_manager()  # one for every session: causal consistency
        self._indexes: dict[str, str] = {}  # role (SchemaItem.role) -> the index's name in this database
        self._embedder = self._pick_embedder(embedder)
        self.ensure_schema()
        self._upgrade_collections()

    @classmethod
    def from_uri(cls, uri: str, embedder: str | None = None, database: str | None = None,
                 read_only: bool = False) -> Neo4jStore:
        """Connect with NEO4J_USER / NEO4J_PASSWORD (default neo4j/neo4j); database: arg, else NEO4J_DATABASE."""
        driver, target, credentials = _connect(uri)
        try:
            with _driver_errors(target, credentials):
                driver.verify_connectivity()
            return cls(driver, embedder=embedder, database=database or os.environ.get("NEO4J_DATABASE") or None,
                       uri=uri, read_only=read_only, credentials=credentials)
        except BaseException:
            driver.close()
            raise

    def close(self) -> None:
        self._driver.close()

    # -- plumbing ----------------------------------------------------------------------------
    def _read(self, fn: Callable[..., T], *args: Any) -> T:
        with _driver_errors(self.uri, self._credentials), self._driver.session(
                database=self._database, bookmark_manager=self._bookmarks) as session:
            return session.execute_read(fn, *args)

    def _write(self, fn: Callable[..., T], *args: Any) -> T:
        if self.read_only:
            raise StoreLocked(f"{self.uri} is open read-only")
        with _driver_errors(self.uri, self._credentials), self._driver.session(
                database=self._database, bookmark_manager=self._bookmarks) as session:
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

    def _check_collection(self, kind: str, name: str, rows: list[Row]) -> Row:
        if not rows:
            raise UnknownGraph(name, self.uri) if kind == "graph" else UnknownCorpus(name, self.uri)
        if rows[0]["embedder"] != self._embedder.spec:
            raise EmbedderMismatch(f"{kind} {name!r} was built with embedder {rows[0]['embedder']!r}, "
                                   f"not {self._embedder.spec!r}")
        return rows[0]

    def _require(self, tx: ManagedTransaction, kind: str, name: str) -> Row:
        """Inside a read: the collection's row; UnknownGraph/UnknownCorpus unless it exists."""
        collection = cypher.key(kind, self._scope(name))
        return self._check_collection(kind, name, _run(tx, cypher.COLLECTION, {"collection": collection}))

    def _merge_collection(self, kind: str, name: str) -> None:
        scope = self._scope(name)
        collection = cypher.key(kind, scope)
        params = {"collection": collection, "kind": kind, "namespace": self.namespace, "name": name, "scope": scope,
                  "embedder": self._embedder.spec, "dim": self._embedder.dim,
                  "gid": cypher.collection_gid(collection)}
        self._check_collection(kind, name, self._write(_run, cypher.MERGE_COLLECTION, params))

    # -- schema ------------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create the constraints and indexes that are missing, and only those (SHOW first), so a user
        without schema rights can open a database an administrator prepared; check that the vector
        indexes fit the embedder; wait up to INDEX_WAIT_S for populating indexes, then warn and go on."""
        missing = self._missing_schema()
        if missing and self.read_only:
            raise StoreError(f"{self.uri} lacks {', '.join(item.name for item in missing)}; open it once without "
                             "read_only, or have an administrator apply neo4j/schema.cypher")
        for item in missing:
            params = {"dimensions": self._embedder.dim} if item.type == "VECTOR" else {}
            try:
                try:
                    self._write(_run, item.create, params)
                except StoreError as e:
                    if not (item.fallback and isinstance(e.__cause__, Neo4jError)
                            and e.__cause__.code != FORBIDDEN and "quantization" in str(e.__cause__.message)):
                        raise
                    log.info("%s refuses vector.quantization.enabled (before 5.23); creating %s without it",
                             self.uri, item.name)
                    self._write(_run, item.fallback, params)
            except StoreError as e:
                if isinstance(e.__cause__, Neo4jError) and e.__cause__.code == FORBIDDEN:
                    raise StoreError(f"cannot create {item.name} on {self.uri}: this user has no schema rights; have "
                                     "an administrator apply neo4j/schema.cypher (see neo4j/README.md)") from e
                raise
        if missing:
            self._missing_schema()  # resolves the indexes created just now
        self._check_vector_indexes()
        self._await_indexes()

    def _missing_schema(self) -> list[cypher.SchemaItem]:
        """The schema items this database lacks; records the names of the indexes queries use."""
        constraints = self._read(_run, cypher.SHOW_CONSTRAINTS, {})
        indexes = self._read(_run, cypher.SHOW_INDEXES, {})
        missing = []
        for item in cypher.SCHEMA_ITEMS:
            if item.type == "UNIQUENESS":
                if not any(c["name"] == item.name or ("UNIQUENESS" in str(c["type"])
                                                      and c["labelsOrTypes"] == [item.label]
                                                      and c["properties"] == list(item.properties))
                           for c in constraints):
                    missing.append(item)
                continue
            row = self._find_index(item, indexes)
            if row is None:
                missing.append(item)
            elif item.role:
                self._indexes[item.role] = row["name"]
        return missing

    def _find_index(self, item: cypher.SchemaItem, indexes: list[Row]) -> Row | None:
        """The index that serves `item` (any name); StoreError if its name holds a different index."""
        for row in indexes:
            if (row["type"], row["labelsOrTypes"], row["properties"]) == (item.type, [item.label],
                                                                           list(item.properties)):
                return row
        for row in indexes:
            if row["name"] == item.name:
                found = _describe(row["type"], row["labelsOrTypes"] or [], row["properties"] or [])
                raise StoreError(
                    f"index {item.name!r} on {self.uri} is {found}, not "
                    f"{_describe(item.type, [item.label], item.properties)} as this version of mhqa-graph needs; "
                    f"drop it (DROP INDEX {item.name}) and open the store again to recreate it")
        return None

    def _check_vector_indexes(self) -> None:
        """EmbedderMismatch unless both vector indexes have the embedder's dimension and cosine similarity."""
        rows = {row["name"]: row for row in self._read(_run, cypher.SHOW_VECTOR_INDEXES, {})}
        dim, spec = self._embedder.dim, self._embedder.spec
        for item in cypher.SCHEMA_ITEMS:
            if item.type != "VECTOR":
                continue
            row = rows.get(self._indexes.get(item.role, ""))
            if row is None:
                raise StoreError(f"{self.uri} has no vector index on :{item.label}({item.properties[0]}); open the "
                                 "store once without read_only, or apply neo4j/schema.cypher")
            config = (row.get("options") or {}).get("indexConfig") or {}
            dimensions, similarity = config.get("vector.dimensions"), config.get("vector.similarity_function")
            if dimensions is not None and int(dimensions) != dim:
                raise EmbedderMismatch(
                    f"vector index {row['name']!r} on :{item.label}({item.properties[0]}) of {self.uri} has "
                    f"{dimensions} dimensions, but embedder {spec!r} makes {dim}: open the store with the "
                    f"{dimensions}-dimension embedder it was built for (?embedder=...), or drop both vector indexes "
                    f"(DROP INDEX {self._indexes['entity_vector']}; DROP INDEX {self._indexes['passage_vector']}) "
                    "and open it again to recreate them, or use another database")
            if config.get("vector.quantization.enabled") is True and row["name"] not in _QUANTIZED_WARNED:
                _QUANTIZED_WARNED.add(row["name"])
                log.warning("vector index %r of %s quantizes its vectors (the default of Neo4j 5.23+): searches over "
                            "large collections lose some recall; DROP INDEX %s and open the store again to recreate "
                            "it without", row["name"], self.uri, row["name"])
            if similarity is not None and str(similarity).lower() != "cosine":
                raise StoreError(f"vector index {row['name']!r} of {self.uri} uses {similarity} similarity, not "
                                 f"cosine; drop it (DROP INDEX {row['name']}) and open the store again")

    def _await_indexes(self) -> None:
        """Wait for this store's populating indexes; warn about any still populating after INDEX_WAIT_S."""
        self._refresh_populating()
        deadline = time.monotonic() + INDEX_WAIT_S
        for name in list(self.populating):
            seconds = max(1, int(deadline - time.monotonic()))
            try:
                self._read(_run, cypher.AWAIT_INDEX, {"name": name, "seconds": seconds})
            except StoreError as e:
                log.debug("waiting for index %s: %s", name, e)
        if self._refresh_populating():
            log.warning("indexes of %s are still populating (%s); until they are ONLINE, vector searches are exact "
                        "and full-text rankings are left out", self.uri,
                        ", ".join(f"{n} {p:.0f}%" for n, p in self.populating.items()))

    def _refresh_populating(self) -> dict[str, float]:
        """Re-read which of this store's indexes are not ONLINE yet; StoreError for a FAILED one."""
        ours, populating = set(self._indexes.values()), {}
        for row in self._read(_run, cypher.SHOW_INDEXES, {}):
            if row["name"] not in ours or row["state"] == "ONLINE":
                continue
            if row["state"] == "FAILED":
                raise StoreError(f"index {row['name']!r} of {self.uri} FAILED to populate; drop it (DROP INDEX "
                                 f"{row['name']}) and open the store again to recreate it")
            populating[row["name"]] = float(row.get("populationPercent") or 0.0)
        self.populating = populating
        return populating

    def _text_index(self, role: str, required: bool) -> str | None:
        """The full-text index for `role`; None while it populates (or StoreUnavailable if `required`)."""
        name, populating = self._indexes[role], self.populating  # one snapshot: other threads refresh it
        if name not in populating:
            return name
        state = f"full-text index {name!r} of {self.uri} is still populating ({populating[name]:.0f}%)"
        if required:
            raise StoreUnavailable(f"{state}; bm25 search works once it is ONLINE (SHOW INDEXES), dense and hybrid "
                                   "search work now")
        log.warning("%s; its lexical ranking is left out of these results", state)
        return None

    def _upgrade_collections(self) -> None:
        """Give collections written before `gid` and `size` existed their full-text key and size."""
        rows = self._read(_run, cypher.COLLECTIONS_WITHOUT_GID, {})
        if rows and self.read_only:
            log.warning("%s has %d collections without a full-text key, so their bm25 search finds nothing; open "
                        "it once without read_only to add it", self.uri, len(rows))
            return
        for row in rows:
            gid, scope, size = cypher.collection_gid(row["collection"]), row["scope"], 0
            if row["kind"] == "graph":
                statement, after, extra = cypher.TAG_ENTITIES, "", {"prefix": scope + cypher.SEP}
            else:
                statement, after, extra = cypher.TAG_PASSAGES, -1, {}
            while True:
                page = self._write(_run, statement, {"scope": scope, "after": after, "limit": BATCH, "gid": gid,
                                                     **extra})[0]
                size += page["tagged"]
                if page["tagged"] < BATCH:
                    break
                after = page["last"]
            self._write(_run, cypher.FINISH_UPGRADE, {"collection": row["collection"], "gid": gid, "size": size})

    def _vector(self, text: str) -> list[float] | None:
        """The query embedding; None if it is all zeros, which cosine similarity rejects."""
        vector = self._embedder.embed([text])[0]
        return vector.tolist() if np.any(vector) else None

    # -- writing -----------------------------------------------------------------------------
    def _add_triples(self, graph: str, triples: list[Triple]) -> int:
        self._merge_collection("graph", graph)
        scope = self._scope(graph)
        collection = cypher.key("graph", scope)
        gid = cypher.collection_gid(collection)

        def add(tx: ManagedTransaction, entities: list[Row], vectors: list[Row], triples: list[Row]) -> int:
            added = 0
            for rows in _batches(entities):
                added += _run(tx, cypher.ADD_ENTITIES, {"graph": scope, "gid": gid, "rows": rows})[0]["added"]
            for rows in _batches(vectors):
                _run(tx, cypher.SET_ENTITY_VECTORS, {"rows": rows})
            if added:
                _run(tx, cypher.GROW_COLLECTION, {"collection": collection, "added": added})
            return _run(tx, cypher.ADD_TRIPLES, {"rows": triples})[0]["added"]

        added = 0
        for batch in _batches(triples):
            names = list(dict.fromkeys(n for s, _, o in batch for n in (s, o)))
            keys = [cypher.key(scope, n) for n in names]
            existing = {r["key"] for r in self._read(_run, cypher.EXISTING_ENTITIES, {"keys": keys})}
            new = [(n, k) for n, k in zip(names, keys, strict=True) if k not in existing]
            entities = [{"key": k, "name": n, "folded": n.casefold()} for n, k in new]
            vectors = _vector_rows([k for _, k in new], self._embedder.embed([n for n, _ in new]))
            rows = [{"subject": cypher.key(scope, s), "relation": r, "object": cypher.key(scope, o)}
                    for s, r, o in batch]
            added += self._write(add, entities, vectors, rows)
        return added

    def _add_passages(self, corpus: str, passages: list[Passage]) -> int:
        self._merge_collection("corpus", corpus)
        scope = self._scope(corpus)
        collection = cypher.key("corpus", scope)

        def add(tx: ManagedTransaction, rows: list[Row], vectors: list[Row]) -> int:
            params = {"collection": collection, "corpus": scope, "gid": cypher.collection_gid(collection),
                      "rows": rows}
            added = _run(tx, cypher.ADD_PASSAGES, params)[0]["added"]
            if vectors:
                _run(tx, cypher.SET_PASSAGE_VECTORS, {"rows": vectors})
            return added

        added = 0
        for batch in _batches(passages):
            keys = [cypher.key(scope, p.id) for p in batch]
            existing = {r["key"] for r in self._read(_run, cypher.EXISTING_PASSAGES, {"keys": keys})}
            new = [(p, k) for p, k in zip(batch, keys, strict=True) if k not in existing]
            if not new:
                continue
            rows = [{"key": k, "pid": p.id, "i": i, "title": p.title, "text": p.text} for i, (p, k) in enumerate(new)]
            vectors = _vector_rows([k for _, k in new], self._embedder.embed([_passage_text(p) for p, _ in new]))
            added += self._write(add, rows, vectors)
        return added

    def _set_file_sha256(self, kind: str, name: str, sha256: str) -> None:
        params = {"collection": cypher.key(kind, self._scope(name)), "sha256": sha256}
        if not self._write(_run, cypher.SET_FILE_SHA256, params)[0]["updated"]:
            raise UnknownGraph(name, self.uri) if kind == "graph" else UnknownCorpus(name, self.uri)

    # -- reading -----------------------------------------------------------------------------
    def _file_sha256(self, kind: str, name: str) -> str | None:
        rows = self._read(_run, cypher.COLLECTION, {"collection": cypher.key(kind, self._scope(name))})
        return rows[0].get("file_sha256") if rows else None

    def _shorter_on_too_many_clauses(self, fn: Callable[[ManagedTransaction, int], T]) -> T:
        """Run the read `fn(tx, max_tokens)`, retrying with a quarter of the tokens when Lucene refuses the
        full-text query as too many clauses (its limit can be lower than the default 1024)."""
        max_tokens = cypher.MAX_TOKENS
        while True:
            try:
                return self._read(fn, max_tokens)
            except _TooManyClauses as e:
                if max_tokens <= MIN_TOKENS:
                    raise StoreError(f"{e}; even {max_tokens} terms are too many") from e
                max_tokens = max(MIN_TOKENS, max_tokens // 4)
                log.info("full-text query too long for %s; retrying with %d terms", self.uri, max_tokens)

    def _nearest(self, tx: ManagedTransaction, kind: str, collection: Row, vector: list[float], k: int,
                 params: Row) -> list[Row]:
        """The collection's k nearest nodes: exact for a small collection or a populating index, else the
        shared index fetched deep enough for the collection's share of it, and exact if even MAX_FETCH is not."""
        if kind == "graph":
            role, ann, exact, total_query = "entity_vector", cypher.ENTITY_VECTOR, cypher.ENTITY_EXACT, \
                cypher.ENTITY_TOTAL
        else:
            role, ann, exact, total_query = "passage_vector", cypher.PASSAGE_VECTOR, cypher.PASSAGE_EXACT, \
                cypher.PASSAGE_TOTAL
        index, size = self._indexes[role], collection.get("size")
        if index in self.populating or (size is not None and size <= EXACT_MAX):
            return _run(tx, exact, {**params, "vector": vector, "k": k})[0]["hits"]
        fetch = max(2 * k, MIN_FETCH)
        if size:
            wanted = math.ceil(2 * k * _run(tx, total_query, {})[0]["total"] / size)
            if wanted > MAX_FETCH:
                return _run(tx, exact, {**params, "vector": vector, "k": k})[0]["hits"]
            fetch = max(fetch, wanted)
        while True:
            row = _run(tx, ann, {**params, "index": index, "vector": vector, "k": k, "fetch": fetch})[0]
            if len(row["hits"]) >= k or row["fetched"] < fetch:
                return sorted(row["hits"], key=lambda h: -h["score"])
            if fetch >= MAX_FETCH:
                return _run(tx, exact, {**params, "vector": vector, "k": k})[0]["hits"]
            fetch = min(4 * fetch, MAX_FETCH)

    def _match_entities(self, graph: str, text: str, k: int) -> list[EntityHit]:
        if self.populating:
            self._refresh_populating()
        depth = candidate_depth(k)
        scope = self._scope(graph)
        gid = cypher.collection_gid(cypher.key("graph", scope))
        vector = self._vector(text)
        index = self._text_index("entity_text", required=False)

        def rankings(tx: ManagedTransaction, max_tokens: int) -> list[list[str]]:
            collection = self._require(tx, "graph", graph)
            semantic, lexical = [], []
            if vector is not None:
                semantic = self._nearest(tx, "graph", collection, vector, depth, {"graph": scope})
            query = cypher.lucene_or_query(text, max_tokens) if index else None
            if query:
                params = {"index": index, "query": cypher.in_collection(gid, query), "k": depth, "graph": scope}
                lexical = _run(tx, cypher.ENTITY_FULLTEXT, params)[0]["hits"]
            return [[h["name"] for h in semantic], [h["name"] for h in sorted(lexical, key=lambda h: -h["score"])]]

        fused = reciprocal_rank_fusion(self._shorter_on_too_many_clauses(rankings))
        return [EntityHit(str(name), score) for name, score in fused[:k]]

    def _node_info(self, graph: str, name: str) -> NodeInfo:
        scope = self._scope(graph)

        def lookup(tx: ManagedTransaction) -> tuple[str, Row]:
            """The node's name and facts; a name differing only in case is accepted when unambiguous."""
            self._require(tx, "graph", graph)
            actual = name
            rows = _run(tx, cypher.NODE_INFO, {"key": cypher.key(scope, name), "limit": MAX_NODE_FACTS})
            if not rows:
                found = _run(tx, cypher.ENTITIES_BY_FOLDED, {"graph": scope, "folded": name.casefold()})
                if len(found) != 1:
                    raise EntityNotFound(graph, name)
                actual = found[0]["name"]
                rows = _run(tx, cypher.NODE_INFO, {"key": cypher.key(scope, actual), "limit": MAX_NODE_FACTS})
            return actual, rows[0]

        actual, row = self._read(lookup)
        facts = row["facts"]
        if row.get("degree", 0) > len(facts):
            log.info("entity %r of graph %r has %d facts; node_info returns %d (MAX_NODE_FACTS each way)",
                     actual, graph, row["degree"], len(facts))
        ordered = sorted({Fact(f["relation"], f["other"], f["direction"]) for f in facts},
                         key=lambda f: (f.direction != "out", f.relation, f.other))
        return NodeInfo(graph, actual, ordered)

    def _search(self, corpus: str, query: str, k: int, mode: SearchMode) -> list[PassageHit]:
        if self.populating:
            self._refresh_populating()
        depth = candidate_depth(k) if mode == "hybrid" else k
        scope = self._scope(corpus)
        gid = cypher.collection_gid(cypher.key("corpus", scope))
        vector = self._vector(query) if mode != "bm25" else None
        index = self._text_index("passage_text", required=mode == "bm25") if mode != "dense" else None

        def hits(tx: ManagedTransaction, max_tokens: int) -> tuple[list[Row], list[Row]]:
            collection = self._require(tx, "corpus", corpus)
            bm25, dense = [], []
            lucene = cypher.lucene_or_query(query, max_tokens) if index else None
            if lucene:
                params = {"index": index, "query": cypher.in_collection(gid, lucene), "k": depth, "corpus": scope}
                bm25 = sorted(_run(tx, cypher.PASSAGE_FULLTEXT, params)[0]["hits"], key=lambda h: -h["score"])
            if vector is not None:
                dense = self._nearest(tx, "corpus", collection, vector, depth, {"corpus": scope})
            return bm25, [{**h, "score": _cosine(h["score"])} for h in dense]

        bm25, dense = self._shorter_on_too_many_clauses(hits)
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
