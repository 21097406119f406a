"""The embedded backend: no server, one directory on disk.

    <dir>/store.sqlite   source of truth: entities, triples, passages, FTS5 lexical indexes
    <dir>/graph.lbug     ladybug graph (Entity nodes, REL edges) for fast neighbourhood queries
    <dir>/vectors/*.faiss one HNSW index per graph (entity names) and per corpus (passages)

SQLite commits first. The ladybug graph and the faiss indexes are derived from it and
carry the SQLite row ids, so after an interrupted write they are caught up on the next
open (rows whose id is above the highest id they hold). Ingestion is idempotent because
SQLite's UNIQUE constraints decide what is new.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa

from ..embeddings import Embedder, load_embedder, resolve_spec
from ..errors import CorruptStore, EmbedderMismatch, EntityNotFound, StoreLocked, UnknownCorpus, UnknownGraph
from ..types import EntityHit, Fact, NodeInfo, Passage, PassageHit, SearchMode, StoreStats, Triple
from .base import KnowledgeStore
from .fusion import candidate_depth, reciprocal_rank_fusion

log = logging.getLogger(__name__)

FORMAT_VERSION = "2"
KEY_SEP = "\x1f"
HNSW_M = 32
HNSW_EF_SEARCH = 256  # 128 gave match_entities recall@10 0.987 vs exact search (bench/store.py, 20k entities)
EMBED_BATCH = 256
MAX_FTS_TERMS = 64
_WORD = re.compile(r"\w+", re.UNICODE)
REBUILD_HINT = "delete the directory and ingest again (mhqa ingest ...)"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS collections(kind TEXT NOT NULL, name TEXT NOT NULL, PRIMARY KEY(kind, name));
CREATE TABLE IF NOT EXISTS entities(
    id INTEGER PRIMARY KEY AUTOINCREMENT, graph TEXT NOT NULL, name TEXT NOT NULL, folded TEXT NOT NULL,
    UNIQUE(graph, name));
CREATE INDEX IF NOT EXISTS entities_folded ON entities(graph, folded);
CREATE TABLE IF NOT EXISTS triples(
    id INTEGER PRIMARY KEY AUTOINCREMENT, graph TEXT NOT NULL,
    subject INTEGER NOT NULL, relation TEXT NOT NULL, object INTEGER NOT NULL,
    UNIQUE(graph, subject, relation, object));
CREATE TABLE IF NOT EXISTS passages(
    id INTEGER PRIMARY KEY AUTOINCREMENT, corpus TEXT NOT NULL, pid TEXT NOT NULL,
    title TEXT NOT NULL, text TEXT NOT NULL, UNIQUE(corpus, pid));
CREATE VIRTUAL TABLE IF NOT EXISTS entities_fts USING fts5(
    name, content='entities', content_rowid='id', tokenize='porter unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE IF NOT EXISTS passages_fts USING fts5(
    title, text, content='passages', content_rowid='id', tokenize='porter unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE IF NOT EXISTS entities_vocab USING fts5vocab(entities_fts, 'row');
CREATE TRIGGER IF NOT EXISTS entities_ai AFTER INSERT ON entities BEGIN
    INSERT INTO entities_fts(rowid, name) VALUES (new.id, new.name); END;
CREATE TRIGGER IF NOT EXISTS passages_ai AFTER INSERT ON passages BEGIN
    INSERT INTO passages_fts(rowid, title, text) VALUES (new.id, new.title, new.text); END;
"""

LADYBUG_SCHEMA = (
    "CREATE NODE TABLE IF NOT EXISTS Entity(key STRING, id INT64, graph STRING, name STRING, PRIMARY KEY(key))",
    "CREATE REL TABLE IF NOT EXISTS REL(FROM Entity TO Entity, relation STRING, tid INT64, src INT64)",
)
# One undirected 1-hop match; `src` (the subject's id, stored on each edge) gives the direction,
# since ladybug's start_node() follows the match order in undirected patterns.
NEIGHBOURS = ("MATCH (a:Entity {key: $key})-[r:REL]-(b:Entity) "
              "RETURN r.relation, b.name, r.src = a.id, b.id = a.id")
# Entity matching queries only the rarest words: a word in more than 2% of names (and at least
# COMMON_TERM_MIN_DOCS) has a long posting list that costs much and ranks little; dense covers it.
MAX_LEXICAL_TERMS = 8
COMMON_TERM_MIN_DOCS = 1000


def fts_query(text: str) -> str | None:
    """A safe FTS5 query: every word of `text` as a quoted term, OR-ed. None if no words."""
    terms = list(dict.fromkeys(w.lower() for w in _WORD.findall(text)))[:MAX_FTS_TERMS]
    return " OR ".join(f'"{t}"' for t in terms) if terms else None


def entity_key(graph: str, name: str) -> str:
    return f"{graph}{KEY_SEP}{name}"


class _VectorIndex:
    """A faiss HNSW index over SQLite row ids, persisted to one file."""

    def __init__(self, path: Path, dim: int) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.dirty = False
        if path.exists():
            try:
                self.index = faiss.read_index(str(path))
            except RuntimeError:
                log.warning("vector index %s unreadable; rebuilding it from the store", path)
                path.unlink()
                self.index = self._new(dim)
        else:
            self.index = self._new(dim)
        faiss.downcast_index(self.index.index).hnsw.efSearch = HNSW_EF_SEARCH

    @staticmethod
    def _new(dim: int) -> faiss.IndexIDMap2:
        return faiss.IndexIDMap2(faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT))

    def max_id(self) -> int:
        if self.index.ntotal == 0:
            return 0
        return int(faiss.vector_to_array(self.index.id_map).max())

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        with self.lock:
            self.index.add_with_ids(vectors, ids.astype(np.int64))
            self.dirty = True

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        with self.lock:
            if self.index.ntotal == 0:
                return []
            scores, ids = self.index.search(vector.reshape(1, -1), min(k, self.index.ntotal))
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]

    def flush(self) -> None:
        with self.lock:
            if not self.dirty:
                return
            tmp = self.path.with_suffix(".tmp")
            faiss.write_index(self.index, str(tmp))
            os.replace(tmp, self.path)
            self.dirty = False


class EmbeddedStore(KnowledgeStore):
    backend = "embedded"

    def __init__(self, root: Path, embedder: str | None = None, read_only: bool = False) -> None:
        self.root = Path(root)
        self.uri = f"embedded://{self.root.resolve()}"
        self.read_only = read_only
        self._write_lock = threading.RLock()
        self._local = threading.local()
        self._thread_conns: list = []  # per-thread SQLite and ladybug connections, closed in close()
        self._vectors: dict[tuple[str, str], _VectorIndex] = {}
        self._closed = False
        self._open_files()
        self._embedder: Embedder | None = None
        if embedder not in (None, "", "auto") or not self._meta("embedder") or not read_only:
            self._embedder = self._resolve_embedder(embedder)  # a mismatch fails the open
        if not read_only:
            self._catch_up()

    @property
    def embedder(self) -> Embedder:
        """The store's embedder; a read-only open loads it on first use (`stats` never does)."""
        if self._embedder is None:
            with self._write_lock:
                if self._embedder is None:
                    self._embedder = self._resolve_embedder(None)
        return self._embedder

    # -- opening ----------------------------------------------------------------
    def _open_files(self) -> None:
        sqlite_path = self.root / "store.sqlite"
        if self.root.exists() and not sqlite_path.exists() and any(self.root.iterdir()):
            raise CorruptStore(f"{self.root} is not an mhqa store (no store.sqlite); {REBUILD_HINT}")
        if self.read_only and not sqlite_path.exists():
            raise CorruptStore(f"{self.root} holds no store to open read-only")
        (self.root / "vectors").mkdir(parents=True, exist_ok=True)
        try:
            self._db = self._connect()
            if not self.read_only:
                self._db.executescript(SCHEMA)
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (FORMAT_VERSION,))
                self._db.commit()
            fmt = self._meta("format")
        except sqlite3.DatabaseError as e:
            raise CorruptStore(f"{sqlite_path}: {e}; {REBUILD_HINT}") from e
        if fmt != FORMAT_VERSION:
            raise CorruptStore(
                f"{self.root}: store format {fmt!r}, this version reads {FORMAT_VERSION!r}; {REBUILD_HINT}")
        try:
            import ladybug

            self._graph_db = ladybug.Database(str(self.root / "graph.lbug"), read_only=self.read_only)
            self._ladybug = ladybug
            if not self.read_only:
                conn = self._graph()
                for stmt in LADYBUG_SCHEMA:
                    conn.execute(stmt)
        except RuntimeError as e:
            msg = str(e)
            if "lock" in msg.lower():
                raise StoreLocked(f"{self.root} is open for writing in another process ({msg})") from e
            raise CorruptStore(f"{self.root / 'graph.lbug'}: {msg}; {REBUILD_HINT}") from e

    def _connect(self) -> sqlite3.Connection:
        path = self.root / "store.sqlite"
        uri = f"file:{path}?mode=ro" if self.read_only else f"file:{path}"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=30)
        if not self.read_only:
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _resolve_embedder(self, spec: str | None) -> Embedder:
        stored = self._meta("embedder")
        if stored and spec not in (None, "", "auto"):
            wanted = load_embedder(spec).spec
            if wanted != stored:
                raise EmbedderMismatch(f"{self.root} was built with embedder {stored!r}, not {wanted!r}")
        embedder = load_embedder(stored or resolve_spec(spec))
        if not stored and not self.read_only:
            with self._write_lock:
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('embedder', ?)", (embedder.spec,))
                self._db.commit()
        return embedder

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    # -- per-thread connections -------------------------------------------------
    def _read(self) -> sqlite3.Connection:
        conn = getattr(self._local, "sqlite", None)
        if conn is None:
            conn = self._local.sqlite = self._connect()
            self._thread_conns.append(conn)
        return conn

    def _graph(self):  # -> ladybug.Connection
        conn = getattr(self._local, "graph", None)
        if conn is None:
            conn = self._local.graph = self._ladybug.Connection(self._graph_db)
            self._thread_conns.append(conn)
        return conn

    def _vector_index(self, kind: str, name: str) -> _VectorIndex:
        key = (kind, name)
        if key not in self._vectors:
            with self._write_lock:
                if key not in self._vectors:
                    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
                    path = self.root / "vectors" / f"{kind}-{digest}.faiss"
                    self._vectors[key] = _VectorIndex(path, self.embedder.dim)
        return self._vectors[key]

    # -- catching derived indexes up with SQLite ----------------------------------
    def _catch_up(self) -> None:
        with self._write_lock:
            self._sync_graph()
            for kind, name in self._db.execute("SELECT kind, name FROM collections").fetchall():
                self._sync_vectors(kind, name)
                self._vector_index(kind, name).flush()

    def _sync_graph(self) -> None:
        conn = self._graph()
        max_entity = conn.execute("MATCH (e:Entity) RETURN coalesce(max(e.id), 0)").get_next()[0]
        rows = self._db.execute(
            "SELECT id, graph, name FROM entities WHERE id > ? ORDER BY id", (max_entity,)).fetchall()
        if rows:
            ids, graphs, names = zip(*rows)
            nodes = pa.table({"key": [entity_key(g, n) for g, n in zip(graphs, names)],
                              "id": pa.array(ids, pa.int64()), "graph": list(graphs), "name": list(names)})
            conn.execute("COPY Entity FROM $rows", {"rows": nodes})
        max_triple = conn.execute("MATCH ()-[r:REL]->() RETURN coalesce(max(r.tid), 0)").get_next()[0]
        rows = self._db.execute(
            "SELECT t.id, t.graph, s.name, t.relation, o.name, t.subject FROM triples t "
            "JOIN entities s ON s.id = t.subject JOIN entities o ON o.id = t.object "
            "WHERE t.id > ? ORDER BY t.id", (max_triple,)).fetchall()
        if rows:
            tids, graphs, subjects, relations, objects, subject_ids = zip(*rows)
            edges = pa.table({"from": [entity_key(g, s) for g, s in zip(graphs, subjects)],
                              "to": [entity_key(g, o) for g, o in zip(graphs, objects)],
                              "relation": list(relations), "tid": pa.array(tids, pa.int64()),
                              "src": pa.array(subject_ids, pa.int64())})
            conn.execute("COPY REL FROM $rows", {"rows": edges})

    def _sync_vectors(self, kind: str, name: str) -> None:
        index = self._vector_index(kind, name)
        start = index.max_id()
        if kind == "graph":
            sql = "SELECT id, name FROM entities WHERE graph = ? AND id > ? ORDER BY id"
        else:
            sql = "SELECT id, title || ': ' || text FROM passages WHERE corpus = ? AND id > ? ORDER BY id"
        cursor = self._db.execute(sql, (name, start))
        while batch := cursor.fetchmany(EMBED_BATCH):
            ids, texts = zip(*batch)
            index.add(np.asarray(ids, dtype=np.int64), self.embedder.embed(list(texts)))

    # -- writing -----------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.read_only:
            raise StoreLocked(f"{self.root} is open read-only")

    def _add_triples(self, graph: str, triples: list[Triple]) -> int:
        self._check_writable()
        with self._write_lock:
            db = self._db
            with db:
                db.execute("INSERT OR IGNORE INTO collections VALUES ('graph', ?)", (graph,))
                names = list(dict.fromkeys(n for s, _, o in triples for n in (s, o)))
                db.executemany("INSERT OR IGNORE INTO entities(graph, name, folded) VALUES (?, ?, ?)",
                               [(graph, n, n.casefold()) for n in names])
                ids = self._entity_ids(db, graph, names)
                added = db.executemany(
                    "INSERT OR IGNORE INTO triples(graph, subject, relation, object) VALUES (?, ?, ?, ?)",
                    [(graph, ids[s], r, ids[o]) for s, r, o in triples]).rowcount
            self._sync_graph()
            self._sync_vectors("graph", graph)
            self._vector_index("graph", graph).flush()
        return added

    @staticmethod
    def _entity_ids(db: sqlite3.Connection, graph: str, names: list[str]) -> dict[str, int]:
        ids: dict[str, int] = {}
        for i in range(0, len(names), 500):
            chunk = names[i:i + 500]
            marks = ",".join("?" * len(chunk))
            ids.update((n, i_) for i_, n in db.execute(
                f"SELECT id, name FROM entities WHERE graph = ? AND name IN ({marks})", (graph, *chunk)))
        return ids

    def _add_passages(self, corpus: str, passages: list[Passage]) -> int:
        self._check_writable()
        with self._write_lock:
            db = self._db
            with db:
                db.execute("INSERT OR IGNORE INTO collections VALUES ('corpus', ?)", (corpus,))
                added = db.executemany("INSERT OR IGNORE INTO passages(corpus, pid, title, text) VALUES (?, ?, ?, ?)",
                                       [(corpus, p.id, p.title, p.text) for p in passages]).rowcount
            self._sync_vectors("corpus", corpus)
            self._vector_index("corpus", corpus).flush()
        return added

    # -- reading -----------------------------------------------------------------
    def _require(self, kind: str, name: str) -> None:
        row = self._read().execute("SELECT 1 FROM collections WHERE kind = ? AND name = ?", (kind, name)).fetchone()
        if row is None:
            raise UnknownGraph(name, self.uri) if kind == "graph" else UnknownCorpus(name, self.uri)

    def _match_entities(self, graph: str, text: str, k: int) -> list[EntityHit]:
        self._require("graph", graph)
        depth = candidate_depth(k)
        dense = [i for i, _ in self._vector_index("graph", graph).search(self.embedder.embed([text])[0], depth)]
        fused = reciprocal_rank_fusion([dense, self.lexical_entities(graph, text, depth)])[:k]
        names = self._names([int(i) for i, _ in fused])
        return [EntityHit(name=names[int(i)], score=score) for i, score in fused]

    def lexical_entities(self, graph: str, text: str, depth: int) -> list[int]:
        """Entity ids ranked by BM25 over names, querying only the rarest words of `text`."""
        words = list(dict.fromkeys(w.lower() for w in _WORD.findall(text)))
        if not words:
            return []
        db = self._read()
        marks = ",".join("?" * len(words))
        df = dict(db.execute(f"SELECT term, doc FROM entities_vocab WHERE term IN ({marks})", words).fetchall())
        common = max(COMMON_TERM_MIN_DOCS, (db.execute("SELECT max(id) FROM entities").fetchone()[0] or 0) // 50)
        words = sorted(words, key=lambda w: df.get(w, 0))
        words = ([w for w in words if df.get(w, 0) <= common] or words[:1])[:MAX_LEXICAL_TERMS]
        q = fts_query(" ".join(words))
        return [r[0] for r in db.execute(
            "SELECT e.id FROM entities_fts JOIN entities e ON e.id = entities_fts.rowid "
            "WHERE entities_fts MATCH ? AND e.graph = ? ORDER BY rank LIMIT ?", (q, graph, depth))]

    def _names(self, ids: list[int]) -> dict[int, str]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        return dict(self._read().execute(f"SELECT id, name FROM entities WHERE id IN ({marks})", ids).fetchall())

    def _node_info(self, graph: str, name: str) -> NodeInfo:
        rows = self._graph().execute(NEIGHBOURS, {"key": entity_key(graph, name)}).get_all()
        if not rows:
            found = self._read().execute(
                "SELECT name FROM entities WHERE graph = ? AND folded = ? LIMIT 2", (graph, name.casefold())).fetchall()
            names = [n for (n,) in found]
            if len(names) == 1 and names[0] != name:  # tolerate a case-only difference when unambiguous
                return self._node_info(graph, names[0])
            if name not in names:
                self._require("graph", graph)
                raise EntityNotFound(graph, name)
        found_facts = {Fact(relation=r, other=o, direction="out" if out else "in") for r, o, out, _ in rows}
        found_facts |= {Fact(relation=r, other=o, direction="in") for r, o, out, loop in rows if loop}
        facts = sorted(found_facts,
                       key=lambda f: (f.direction != "out", f.relation, f.other))
        return NodeInfo(graph=graph, name=name, facts=facts)

    def _search(self, corpus: str, query: str, k: int, mode: SearchMode) -> list[PassageHit]:
        self._require("corpus", corpus)
        depth = k if mode != "hybrid" else candidate_depth(k)
        rankings: list[list[tuple[int, float]]] = []
        if mode in ("bm25", "hybrid"):
            q = fts_query(query)
            rankings.append([] if q is None else [(i, -s) for i, s in self._read().execute(
                "SELECT p.id, bm25(passages_fts) FROM passages_fts JOIN passages p ON p.id = passages_fts.rowid "
                "WHERE passages_fts MATCH ? AND p.corpus = ? ORDER BY bm25(passages_fts) LIMIT ?", (q, corpus, depth))])
        if mode in ("dense", "hybrid"):
            rankings.append(self._vector_index("corpus", corpus).search(self.embedder.embed([query])[0], depth))
        if mode == "hybrid":
            scored = reciprocal_rank_fusion([[i for i, _ in r] for r in rankings])[:k]
        else:
            scored = rankings[0][:k]
        return self._passage_hits(scored)

    def _passage_hits(self, scored: list[tuple[int, float]]) -> list[PassageHit]:
        if not scored:
            return []
        marks = ",".join("?" * len(scored))
        rows = {r[0]: r[1:] for r in self._read().execute(
            f"SELECT id, pid, title, text FROM passages WHERE id IN ({marks})", [int(i) for i, _ in scored])}
        return [PassageHit(id=rows[i][0], title=rows[i][1], text=rows[i][2], score=float(s)) for i, s in scored]

    def _passages(self, corpus: str) -> Iterator[Passage]:
        self._require("corpus", corpus)
        cursor = self._connect().execute(
            "SELECT pid, title, text FROM passages WHERE corpus = ? ORDER BY id", (corpus,))
        for pid, title, text in cursor:
            yield Passage(id=pid, title=title, text=text)

    def _collection_names(self, kind: str) -> list[str]:
        return [n for (n,) in self._read().execute(
            "SELECT name FROM collections WHERE kind = ? ORDER BY name", (kind,))]

    def _stats(self) -> StoreStats:
        db = self._read()
        graphs = {n: {"entities": 0, "triples": 0} for (n,) in db.execute(
            "SELECT name FROM collections WHERE kind = 'graph'")}
        for g, n in db.execute("SELECT graph, count(*) FROM entities GROUP BY graph"):
            graphs[g]["entities"] = n
        for g, n in db.execute("SELECT graph, count(*) FROM triples GROUP BY graph"):
            graphs[g]["triples"] = n
        corpora = {n: {"passages": 0} for (n,) in db.execute("SELECT name FROM collections WHERE kind = 'corpus'")}
        for c, n in db.execute("SELECT corpus, count(*) FROM passages GROUP BY corpus"):
            corpora[c]["passages"] = n
        return StoreStats(backend=self.backend, graphs=graphs, corpora=corpora)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.read_only:
            for index in self._vectors.values():
                index.flush()
        for conn in self._thread_conns:  # ladybug keeps its file lock while any connection lives
            conn.close()
        self._db.close()
        self._graph_db.close()

