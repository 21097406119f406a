"""A faiss HNSW index over SQLite row ids, persisted to one file with a checksum.

The file is faiss's own serialisation followed by a trailer: the sha256 of what precedes it, then
MAGIC. A file whose trailer is missing (written before checksums) is read as it is and rewritten with
one at the next flush; a file that cannot be read, fails its checksum or has the wrong dimension is
`damaged`: the index starts empty (the store refills it from SQLite) and the file is left in place
until a writer replaces it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

import faiss
import numpy as np

log = logging.getLogger(__name__)

HNSW_M = 32
HNSW_EF_SEARCH = 256  # 128 gave match_entities recall@10 0.987 vs exact search (bench/store.py, 20k entities)
MAGIC = b"MHQA-FAISS-SHA256"
DIGEST = 32


def _read(path: Path, dim: int) -> tuple[faiss.Index, bool]:
    """The index in `path` and whether its file has a checksum; ValueError if it is damaged."""
    data = path.read_bytes()
    body, trailer = data[:-len(MAGIC) - DIGEST], data[-len(MAGIC) - DIGEST:]
    checked = trailer.endswith(MAGIC)
    if checked and hashlib.sha256(body).digest() != trailer[:DIGEST]:
        raise ValueError("checksum mismatch")
    try:
        index = faiss.deserialize_index(np.frombuffer(body if checked else data, dtype=np.uint8))
    except RuntimeError as e:
        raise ValueError(str(e).splitlines()[0]) from None
    if not isinstance(index, faiss.IndexIDMap2) or index.d != dim:
        raise ValueError(f"not an id-mapped index of dimension {dim}")
    return index, checked


class VectorIndex:
    """Vectors of one graph's entity names or one corpus's passages, keyed by SQLite row id."""

    def __init__(self, path: Path, dim: int) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.damaged = False
        self.index, checked = self._new(dim), False
        if path.exists():
            try:
                self.index, checked = _read(path, dim)
            except (OSError, ValueError) as e:
                log.warning("vector index %s is damaged (%s); it is rebuilt from the store", path, e)
                self.damaged = True
        self.dirty = path.exists() and not checked  # rewritten (with a checksum) at the next flush
        faiss.downcast_index(self.index.index).hnsw.efSearch = HNSW_EF_SEARCH

    @staticmethod
    def _new(dim: int) -> faiss.IndexIDMap2:
        return faiss.IndexIDMap2(faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT))

    def extent(self) -> tuple[int, int]:
        """(vectors held, highest row id or 0)."""
        with self.lock:
            if self.index.ntotal == 0:
                return 0, 0
            return int(self.index.ntotal), int(faiss.vector_to_array(self.index.id_map).max())

    def reset(self) -> None:
        """Drop every vector (before a rebuild)."""
        with self.lock:
            self.index = self._new(self.index.d)
            faiss.downcast_index(self.index.index).hnsw.efSearch = HNSW_EF_SEARCH
            self.dirty = True

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
        """Write the index if it changed: to a temporary file, with its checksum, then renamed over the old."""
        with self.lock:
            if not self.dirty:
                return
            body = faiss.serialize_index(self.index).tobytes()
            tmp = self.path.with_suffix(".tmp")
            with tmp.open("wb") as f:
                f.write(body)
                f.write(hashlib.sha256(body).digest() + MAGIC)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            self.dirty = self.damaged = False
