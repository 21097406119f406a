"""The embedded backend: no server, one directory on disk.

    <dir>/store.sqlite   source of truth: entities, triples, passages, FTS5 lexical indexes
    <dir>/vectors/*.faiss one HNSW index per graph (entity names) and per corpus (passages)
    <dir>/store.lock     the writer's lock

SQLite commits first. The faiss indexes are derived from it and carry the SQLite row ids. When an index is
loaded, its count and highest id are checked against SQLite: one that is behind (an interrupted write) is caught
up with the rows above its highest id; one that is ahead or disagrees (SQLite lost its last commits, a damaged
file) is rebuilt. Ingestion is idempotent because SQLite's UNIQUE constraints decide what is new.

`node_info` reads SQLite's indexes, capped at MAX_NODE_FACTS facts each way (bounded for a hub). A writer holds
an exclusive lock on store.lock (the operating system's, dropped when the process dies): a second writer, in this
process or another, gets StoreLocked. A reader (`read_only=True`) takes no lock: it reads SQLite (WAL lets it
read beside a writer) and catches its vector indexes up in memory, never touching a file. The ladybug graph an
older version kept (graph.lbug) is read by nothing; a writer's open deletes it. SQLite errors become typed:
StoreBusy (retry), StoreUnavailable, CorruptStore.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import shutil
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import numpy as np
from filelock import FileLock, Timeout

from ..embeddings import Embedder, check_spec, load_embedder, resolve_spec
from ..errors import (
    CorruptStore,
    EmbedderMismatch,
    EntityNotFound,
    StoreBusy,
    StoreError,
    StoreLocked,
    StoreUnavailable,
    UnknownCorpus,
    UnknownGraph,
)
from ..types import EntityHit, Fact, NodeInfo, Passage, PassageHit, SearchMode, StoreStats, Triple
from .base import KEY_SEPARATOR, MAX_NODE_FACTS, KnowledgeStore
from .fusion import candidate_depth, reciprocal_rank_fusion
from .pool import Pool
from .vectors import VectorIndex

log = logging.getLogger(__name__)

FORMAT_VERSION = "2"
LOCK_FILE = "store.lock"
OLD_GRAPH = "graph.lbug"  # an older version's ladybug graph, with its siblings graph.lbug.*
EMBED_BATCH = 256
MAX_FTS_TERMS = 64
_WORD = re.compile(r"\w+", re.UNICODE)
NEW_STORE_HINT = "ingest into a new directory instead (mhqa ingest ... --store embedded:///new/dir)"
POOL_SIZE = 16  # idle connections kept per store

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
CREATE INDEX IF NOT EXISTS triples_object ON triples(graph, object);
"""

# node_info: the entity's facts one way, first in (relation, other name) order, at most `limit`. A top-N sort in
# SQLite: a hub costs its degree in time but only `limit` rows in memory. A self-loop is both out and in.
SQL_FACTS = {
    "out": "SELECT t.relation, o.name FROM entities e JOIN triples t ON t.graph = e.graph AND t.subject = e.id "
           "JOIN entities o ON o.id = t.object WHERE e.graph = ? AND e.name = ? ORDER BY t.relation, o.name LIMIT ?",
    # without the hint SQLite's planner scans the graph's triples through the UNIQUE index
    "in": "SELECT t.relation, s.name FROM entities e JOIN triples t INDEXED BY triples_object "
          "ON t.graph = e.graph AND t.object = e.id JOIN entities s ON s.id = t.subject "
          "WHERE e.graph = ? AND e.name = ? ORDER BY t.relation, s.name LIMIT ?",
}
# a store written before triples_object existed, opened read-only (a writer adds the index on opening)
SQL_FACTS_UNINDEXED = SQL_FACTS | {"in": SQL_FACTS["in"].replace(" INDEXED BY triples_object", "")}
# what each kind of vector index embeds: (table, collection column, text)
VECTOR_SOURCES = {"graph": ("entities", "graph", "name"), "corpus": ("passages", "corpus", "title || ': ' || text")}
# Entity matching queries only the rarest words: a word in more than 2% of names (and at least
# COMMON_TERM_MIN_DOCS) has a long posting list that costs much and ranks little; dense covers it.
MAX_LEXICAL_TERMS = 8
COMMON_TERM_MIN_DOCS = 1000


def fts_query(text: str) -> str | None:
    """A safe FTS5 query: every word of `text` as a quoted term, OR-ed. None if no words."""
    terms = list(dict.fromkeys(w.lower() for w in _WORD.findall(text)))[:MAX_FTS_TERMS]
    return " OR ".join(f'"{t}"' for t in terms) if terms else None


def store_error(path: Path, exc: sqlite3.Error) -> StoreError | None:
    """The typed error of a SQLite failure on `path`: busy (retry), unavailable, or damaged; None for a
    programming error (a bad statement, a constraint), which stays as it is."""
    msg = str(exc)
    if isinstance(exc, sqlite3.OperationalError):
        if "locked" in msg or "busy" in msg:
            return StoreBusy(f"{path}: {msg}; another process is writing the store, retry in a moment")
        return StoreUnavailable(f"{path}: {msg}")
    if type(exc) is sqlite3.DatabaseError:  # SQLITE_CORRUPT, SQLITE_NOTADB
        return CorruptStore(f"{path} is damaged ({msg}); restore it from a copy, or {NEW_STORE_HINT}")
    return None


@contextmanager
def sqlite_errors(path: Path) -> Iterator[None]:
    """Raise SQLite's errors on `path` as `store_error` says."""
    try:
        yield
    except sqlite3.Error as exc:
        typed = store_error(path, exc)
        if typed is None:
            raise
        raise typed from exc


F = TypeVar("F", bound=Callable[..., Any])


def typed_errors(method: F) -> F:
    """`method` of an EmbeddedStore with SQLite's errors raised as `store_error` says."""
    @functools.wraps(method)
    def wrapper(self: EmbeddedStore, *args: Any, **kwargs: Any) -> Any:
        with sqlite_errors(self.root / "store.sqlite"):
            return method(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


class EmbeddedStore(KnowledgeStore):
    backend = "embedded"

    def __init__(self, root: Path, embedder: str | None = None, read_only: bool = False) -> None:
        check_spec(embedder)  # before anything is made
        self.root = Path(root)
        # percent-encoded, so that open_store(store.uri) opens this folder even if its name holds '#', '?' or '%'
        self.uri = f"embedded://{quote(str(self.root.resolve()), safe='/')}"
        self.read_only = read_only
        self._write_lock = threading.RLock()
        self._sqlite: Pool[sqlite3.Connection] = Pool(self._connect, POOL_SIZE)
        self._lock: FileLock | None = None  # a writer's, held until close
        self._vectors: dict[tuple[str, str], VectorIndex] = {}
        self._closed = False
        self._embedder: Embedder | None = None
        try:
            self._open_files()
            if embedder not in (None, "", "auto") or not self._meta("embedder") or not read_only:
                self._embedder = self._resolve_embedder(embedder)  # a mismatch fails the open
            if not read_only:
                self._catch_up()
        except BaseException:
            self.close()
            raise

    @property
    def embedder(self) -> Embedder:
        """The store's embedder; a read-only open loads it on first use (`stats` never does)."""
        if self._embedder is None:
            with self._write_lock:
                if self._embedder is None:
                    self._embedder = self._resolve_embedder(None)
        return self._embedder

    # -- opening ----------------------------------------------------------------
    @typed_errors
    def _open_files(self) -> None:
        sqlite_path = self.root / "store.sqlite"
        names = {p.name for p in self.root.iterdir()} if self.root.is_dir() else set()  # one look: a writer may be
        if names and sqlite_path.name not in names and names - {LOCK_FILE}:              # creating the store now
            raise CorruptStore(f"{self.root} is not an mhqa store (no store.sqlite); give an empty or new directory")
        if self.read_only and not sqlite_path.exists():
            raise CorruptStore(f"{self.root} holds no store to open read-only")
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.read_only:
            self._lock_writer()
        self._db = self._connect()
        if not self.read_only:
            self._db.executescript(SCHEMA)
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (FORMAT_VERSION,))
            self._db.commit()
        try:
            fmt = self._meta("format")
        except sqlite3.OperationalError as e:
            if "no such table" not in str(e):
                raise
            raise StoreBusy(f"{sqlite_path} holds no mhqa tables yet: another process is creating the store "
                            "(retry in a moment), or it is not an mhqa store") from e
        if fmt != FORMAT_VERSION:
            raise CorruptStore(f"{self.root}: store format {fmt!r}, this version reads {FORMAT_VERSION!r}; "
                               f"{NEW_STORE_HINT}")
        indexed = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'triples_object'")
        self._facts_sql = SQL_FACTS if indexed.fetchone() else SQL_FACTS_UNINDEXED
        if not self.read_only:
            (self.root / "vectors").mkdir(exist_ok=True)
            for part in self.root.glob(f"{OLD_GRAPH}*"):
                log.info("deleting %s: an older version's graph, which nothing reads", part)
                shutil.rmtree(part) if part.is_dir() else part.unlink()

    def _lock_writer(self) -> None:
        """Take the store's writer lock, or raise StoreLocked if another writer holds it."""
        lock = FileLock(self.root / LOCK_FILE, timeout=0, thread_local=False)  # close() may run on any thread
        try:
            lock.acquire()
        except Timeout:
            raise StoreLocked(f"{self.root} is open for writing elsewhere (another process or store object)") \
                from None
        self._lock = lock

    def _connect(self) -> sqlite3.Connection:
        path = self.root / "store.sqlite"
        # a SQLite URI: the path percent-encoded, or a '#', '?' or '%' in a folder name would end or change it
        where = quote(str(path), safe="/")
        uri = f"file:{where}?mode=ro" if self.read_only else f"file:{where}"
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

    def _vector_index(self, kind: str, name: str) -> VectorIndex:
        """The collection's vector index, loaded once, checked against SQLite and caught up."""
        key = (kind, name)
        if key not in self._vectors:
            with self._write_lock:
                if key not in self._vectors:
                    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
                    index = VectorIndex(self.root / "vectors" / f"{kind}-{digest}.faiss", self.embedder.dim)
                    self._sync_vectors(kind, name, index, check=True)
                    self._vectors[key] = index
        return self._vectors[key]

    # -- keeping derived indexes in agreement with SQLite ---------------------------
    def _agrees(self, table: str, held: int, top: int, where: str = "", params: tuple = ()) -> bool:
        """Whether an index holding `held` rows of `table` (those matching `where`), the highest `top`, holds
        exactly the rows of SQLite up to `top`: if so, it is at most behind and can be caught up."""
        db = self._db
        count = db.execute(f"SELECT count(*) FROM {table} WHERE id <= ? {where}", (top, *params)).fetchone()[0]
        highest = db.execute(f"SELECT coalesce(max(id), 0) FROM {table} WHERE 1 {where}", params).fetchone()[0]
        return count == held and top <= highest

    @typed_errors
    def _catch_up(self) -> None:
        with self._write_lock:
            for tmp in (self.root / "vectors").glob("*.tmp"):  # left by a writer killed mid-flush
                tmp.unlink()
            for kind, name in self._db.execute("SELECT kind, name FROM collections").fetchall():
                self._vector_index(kind, name).flush()

    def _sync_vectors(self, kind: str, name: str, index: VectorIndex, check: bool = False) -> None:
        """Add the collection's rows above the index's highest id; with `check`, first rebuild an index that
        is damaged, ahead of SQLite or missing rows."""
        table, column, text = VECTOR_SOURCES[kind]
        held, start = index.extent()
        if check and (index.damaged or not self._agrees(table, held, start, f"AND {column} = ?", (name,))):
            if held:
                log.warning("vector index %s disagrees with store.sqlite; it is rebuilt", index.path)
            index.reset()
            start = 0
        cursor = self._db.execute(
            f"SELECT id, {text} FROM {table} WHERE {column} = ? AND id > ? ORDER BY id", (name, start))
        while batch := cursor.fetchmany(EMBED_BATCH):
            ids, texts = zip(*batch)
            index.add(np.asarray(ids, dtype=np.int64), self.embedder.embed(list(texts)))

    # -- writing -----------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.read_only:
            raise StoreLocked(f"{self.root} is open read-only")

    @typed_errors
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
            self._flush_vectors("graph", graph)
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

    @typed_errors
    def _add_passages(self, corpus: str, passages: list[Passage]) -> int:
        self._check_writable()
        with self._write_lock:
            db = self._db
            with db:
                db.execute("INSERT OR IGNORE INTO collections VALUES ('corpus', ?)", (corpus,))
                added = db.executemany("INSERT OR IGNORE INTO passages(corpus, pid, title, text) VALUES (?, ?, ?, ?)",
                                       [(corpus, p.id, p.title, p.text) for p in passages]).rowcount
            self._flush_vectors("corpus", corpus)
        return added

    @staticmethod
    def _file_key(kind: str, name: str) -> str:
        """The `meta` key of a collection's file sha256 (names never hold the separator)."""
        return KEY_SEPARATOR.join(("file_sha256", kind, name))

    @typed_errors
    def _set_file_sha256(self, kind: str, name: str, sha256: str) -> None:
        self._check_writable()
        with self._write_lock, self._db as db:
            self._require(db, kind, name)
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (self._file_key(kind, name), sha256))

    @typed_errors
    def _file_sha256(self, kind: str, name: str) -> str | None:
        with self._sqlite.lend() as db:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (self._file_key(kind, name),)).fetchone()
        return row[0] if row else None

    def _flush_vectors(self, kind: str, name: str) -> None:
        """Catch the collection's vector index up with what was just committed, and write it."""
        index = self._vector_index(kind, name)
        self._sync_vectors(kind, name, index)
        index.flush()

    # -- reading -----------------------------------------------------------------
    def _require(self, db: sqlite3.Connection, kind: str, name: str) -> None:
        row = db.execute("SELECT 1 FROM collections WHERE kind = ? AND name = ?", (kind, name)).fetchone()
        if row is None:
            raise UnknownGraph(name, self.uri) if kind == "graph" else UnknownCorpus(name, self.uri)

    @typed_errors
    def _match_entities(self, graph: str, text: str, k: int) -> list[EntityHit]:
        with self._sqlite.lend() as db:
            self._require(db, "graph", graph)
            depth = candidate_depth(k)
            dense = [i for i, _ in self._vector_index("graph", graph).search(self.embedder.embed([text])[0], depth)]
            fused = reciprocal_rank_fusion([dense, self._lexical_entities(db, graph, text, depth)])[:k]
            names = self._names(db, [int(i) for i, _ in fused])
        return [EntityHit(name=names[int(i)], score=score) for i, score in fused if int(i) in names]

    @typed_errors
    def lexical_entities(self, graph: str, text: str, depth: int) -> list[int]:
        """Entity ids ranked by BM25 over names, querying only the rarest words of `text`."""
        with self._sqlite.lend() as db:
            return self._lexical_entities(db, graph, text, depth)

    @staticmethod
    def _lexical_entities(db: sqlite3.Connection, graph: str, text: str, depth: int) -> list[int]:
        words = list(dict.fromkeys(w.lower() for w in _WORD.findall(text)))
        if not words:
            return []
        marks = ",".join("?" * len(words))
        df = dict(db.execute(f"SELECT term, doc FROM entities_vocab WHERE term IN ({marks})", words).fetchall())
        common = max(COMMON_TERM_MIN_DOCS, (db.execute("SELECT max(id) FROM entities").fetchone()[0] or 0) // 50)
        words = sorted(words, key=lambda w: df.get(w, 0))
        words = ([w for w in words if df.get(w, 0) <= common] or words[:1])[:MAX_LEXICAL_TERMS]
        q = fts_query(" ".join(words))
        return [r[0] for r in db.execute(
            "SELECT e.id FROM entities_fts JOIN entities e ON e.id = entities_fts.rowid "
            "WHERE entities_fts MATCH ? AND e.graph = ? ORDER BY rank LIMIT ?", (q, graph, depth))]

    @staticmethod
    def _names(db: sqlite3.Connection, ids: list[int]) -> dict[int, str]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        return dict(db.execute(f"SELECT id, name FROM entities WHERE id IN ({marks})", ids).fetchall())

    @typed_errors
    def _node_info(self, graph: str, name: str) -> NodeInfo:
        with self._sqlite.lend() as db:
            facts = [Fact(relation=r, other=o, direction=way)  # type: ignore[arg-type]
                     for way, sql in self._facts_sql.items() for r, o in db.execute(sql, (graph, name, MAX_NODE_FACTS))]
            if not facts:
                found = db.execute("SELECT name FROM entities WHERE graph = ? AND folded = ? LIMIT 2",
                                   (graph, name.casefold())).fetchall()
                names = [n for (n,) in found]
                if len(names) == 1 and names[0] != name:  # tolerate a case-only difference when unambiguous
                    return self._node_info(graph, names[0])
                if name not in names:
                    self._require(db, "graph", graph)
                    raise EntityNotFound(graph, name)
        return NodeInfo(graph=graph, name=name, facts=facts)

    @typed_errors
    def _search(self, corpus: str, query: str, k: int, mode: SearchMode) -> list[PassageHit]:
        with self._sqlite.lend() as db:
            self._require(db, "corpus", corpus)
            depth = k if mode != "hybrid" else candidate_depth(k)
            rankings: list[list[tuple[int, float]]] = []
            if mode in ("bm25", "hybrid"):
                q = fts_query(query)
                rankings.append([] if q is None else [(i, -s) for i, s in db.execute(
                    "SELECT p.id, bm25(passages_fts) FROM passages_fts JOIN passages p ON p.id = passages_fts.rowid "
                    "WHERE passages_fts MATCH ? AND p.corpus = ? ORDER BY bm25(passages_fts) LIMIT ?",
                    (q, corpus, depth))])
            if mode in ("dense", "hybrid"):
                rankings.append(self._vector_index("corpus", corpus).search(self.embedder.embed([query])[0], depth))
            if mode == "hybrid":
                scored = reciprocal_rank_fusion([[i for i, _ in r] for r in rankings])[:k]
            else:
                scored = rankings[0][:k]
            return self._passage_hits(db, scored)

    @staticmethod
    def _passage_hits(db: sqlite3.Connection, scored: list[tuple[int, float]]) -> list[PassageHit]:
        if not scored:
            return []
        marks = ",".join("?" * len(scored))
        rows = {r[0]: r[1:] for r in db.execute(
            f"SELECT id, pid, title, text FROM passages WHERE id IN ({marks})", [int(i) for i, _ in scored])}
        return [PassageHit(id=rows[i][0], title=rows[i][1], text=rows[i][2], score=float(s))
                for i, s in scored if i in rows]

    def _passages(self, corpus: str) -> Iterator[Passage]:
        with sqlite_errors(self.root / "store.sqlite"), closing(self._connect()) as conn:
            self._require(conn, "corpus", corpus)
            for pid, title, text in conn.execute(
                    "SELECT pid, title, text FROM passages WHERE corpus = ? ORDER BY id", (corpus,)):
                yield Passage(id=pid, title=title, text=text)

    @typed_errors
    def _collection_names(self, kind: str) -> list[str]:
        with self._sqlite.lend() as db:
            return [n for (n,) in db.execute("SELECT name FROM collections WHERE kind = ? ORDER BY name", (kind,))]

    @typed_errors
    def _stats(self) -> StoreStats:
        with self._sqlite.lend() as db:
            graphs = {n: {"entities": 0, "triples": 0} for (n,) in db.execute(
                "SELECT name FROM collections WHERE kind = 'graph'")}
            for g, n in db.execute("SELECT graph, count(*) FROM entities GROUP BY graph"):
                graphs[g]["entities"] = n
            for g, n in db.execute("SELECT graph, count(*) FROM triples GROUP BY graph"):
                graphs[g]["triples"] = n
            corpora = {n: {"passages": 0} for (n,) in db.execute(
                "SELECT name FROM collections WHERE kind = 'corpus'")}
            for c, n in db.execute("SELECT corpus, count(*) FROM passages GROUP BY corpus"):
                corpora[c]["passages"] = n
        return StoreStats(backend=self.backend, graphs=graphs, corpora=corpora)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if not self.read_only:
                for index in self._vectors.values():
                    index.flush()
        finally:
            self._sqlite.close()
            if getattr(self, "_db", None) is not None:
                self._db.close()
            if self._lock is not None:
                self._lock.release()
