"""Text embedders for dense search and entity matching.

Specs: "all-minilm-l6-v2" (the offline pack, needs the `models` extra), "hash" or
"hash:<dim>" (dependency-free feature hashing, for tests; 1 <= dim <= MAX_DIM), "auto" (the pack when
installed, else "hash"). Vectors are float32 and L2-normalised, so inner product = cosine.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from typing import Protocol

import numpy as np

from .errors import InvalidInput, ModelError, ModelNotInstalled

log = logging.getLogger(__name__)

_TOKEN = re.compile(r"\w+", re.UNICODE)
# The most dimensions a hash embedder may have: as many as Neo4j's vector indexes take (4,096), 16 KB a vector.
MAX_DIM = 4096


class Embedder(Protocol):
    spec: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray: ...


def _normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


class HashEmbedder:
    """Signed feature hashing of words and character trigrams. Deterministic, no model."""

    def __init__(self, dim: int = 256) -> None:
        if not isinstance(dim, int) or isinstance(dim, bool) or not 1 <= dim <= MAX_DIM:
            raise InvalidInput(f"a hash embedder's dimension must be an integer in 1..{MAX_DIM}, got {dim!r}")
        self.dim = dim
        self.spec = f"hash:{dim}"

    def _features(self, text: str) -> list[str]:
        words = _TOKEN.findall(text.lower())
        grams = [f"#{w[i:i + 3]}" for w in words for i in range(max(1, len(w) - 2))]
        return words + grams

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feat in self._features(text):
                h = int.from_bytes(hashlib.blake2b(feat.encode(), digest_size=8).digest(), "little")
                out[row, h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
        return _normalise(out)


class SentenceTransformerEmbedder:
    """A sentence-transformers model loaded from a local folder, on the CPU."""

    def __init__(self, spec: str, folder: str, batch_size: int = 64) -> None:
        from sentence_transformers import SentenceTransformer  # heavy: imported only here
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        self.spec = spec
        self._model = SentenceTransformer(folder, device="cpu", local_files_only=True)
        self.dim = int(self._model.get_embedding_dimension())
        self._batch_size = batch_size
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            vectors = self._model.encode(list(texts), batch_size=self._batch_size, convert_to_numpy=True,
                                         normalize_embeddings=True, show_progress_bar=False)
        return _normalise(vectors)


_cache: dict[str, Embedder] = {}
_cache_lock = threading.Lock()


def resolve_spec(spec: str | None) -> str:
    """Turn "auto"/None into a concrete spec."""
    from .models.packs import pack_installed

    if spec in (None, "", "auto"):
        if pack_installed("all-minilm-l6-v2"):
            return "all-minilm-l6-v2"
        log.warning("embedding pack not installed (pip install 'mhqa-graph[models]'); using the hash embedder")
        return "hash:256"
    return spec


def hash_dim(spec: str) -> int:
    """The dimension of a "hash" or "hash:<dim>" spec; InvalidInput unless it is an integer in 1..MAX_DIM."""
    digits = spec.partition(":")[2] if ":" in spec else "256"
    dim = int(digits) if re.fullmatch(r"[0-9]{1,7}", digits) else 0
    if not 1 <= dim <= MAX_DIM:
        raise InvalidInput(f"embedder {spec!r}: the dimension must be an integer in 1..{MAX_DIM}")
    return dim


def check_spec(spec: str | None) -> None:
    """InvalidInput for a spec that can never load (a hash dimension out of range), before a store is opened with it
    and anything written; other specs are checked when loaded."""
    if spec == "hash" or (isinstance(spec, str) and spec.startswith("hash:")):
        hash_dim(spec)


def load_embedder(spec: str | None = "auto") -> Embedder:
    """The embedder for `spec`, loaded once per process."""
    spec = resolve_spec(spec)
    with _cache_lock:
        if spec not in _cache:
            _cache[spec] = _build(spec)
        return _cache[spec]


def _build(spec: str) -> Embedder:
    if spec == "hash" or spec.startswith("hash:"):
        return HashEmbedder(hash_dim(spec))
    if spec.startswith("st:"):
        return SentenceTransformerEmbedder(spec, spec[3:])
    from .models.packs import PACKS, pack_path

    if spec in PACKS and PACKS[spec].kind == "embedding":
        return SentenceTransformerEmbedder(spec, str(pack_path(spec)))
    if spec in PACKS:
        raise ModelError(f"{spec!r} is a chat model pack, not an embedding model")
    raise ModelNotInstalled(f"unknown embedder {spec!r}; use 'all-minilm-l6-v2', 'hash[:dim]' or 'st:<folder>'")
