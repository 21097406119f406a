"""The knowledge-store interface. Backends implement the `_`-prefixed methods;
the public methods validate arguments once, here, so every backend behaves alike."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ..errors import InvalidInput
from ..text import encodable
from ..types import SEARCH_MODES, EntityHit, NodeInfo, Passage, PassageHit, SearchMode, StoreStats, Triple

if TYPE_CHECKING:
    from ..retriever import StoreRetriever

MAX_K = 1000
MAX_QUERY_CHARS = 10_000
MAX_NODE_FACTS = 1000  # node_info returns at most this many facts each way
KEY_SEPARATOR = "\u001f"  # joins the parts of a store key (Neo4j's `scope + SEP + name`): no name may hold it
# The longest name (graph, corpus, entity, relation, passage id), in bytes of UTF-8. Neo4j's range indexes refuse a
# value over 8,164 bytes, failing the whole batch's transaction; its keys join two names, and its (graph, folded)
# index holds a name's casefolded form, at most three times as long: 1,024 + 3 x 1,024 stays well under the limit.
# Every backend refuses the same names, so an ingest keeps the same rows on each (a file's over-long name is a bad
# row: ingest/files.py).
MAX_NAME_BYTES = 1024
COLLECTION_KINDS = ("graph", "corpus")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def name_too_long(kind: str, value: str) -> str | None:
    """Why `value` cannot be a name because of its length (over MAX_NAME_BYTES bytes of UTF-8), or None."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size <= MAX_NAME_BYTES:
        return None
    return f"{kind} {value!r:.60}... is {size:,} bytes long in UTF-8; a name takes at most {MAX_NAME_BYTES:,}"


def _name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{kind} must be a non-empty string, got {value!r}")
    if KEY_SEPARATOR in value:
        raise InvalidInput(f"{kind} {value!r:.100} holds the control character U+001F, which no name may hold")
    if too_long := name_too_long(kind, value):
        raise InvalidInput(too_long)
    return encodable(value)


def _kind(kind: str) -> str:
    if kind not in COLLECTION_KINDS:
        raise InvalidInput(f"kind must be one of {COLLECTION_KINDS}, got {kind!r}")
    return kind


def _k(k: int) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise InvalidInput(f"k must be an integer in 1..{MAX_K}, got {k!r}")
    return k


def _query(text: str) -> str:
    if not isinstance(text, str):
        raise InvalidInput(f"query must be a string, got {type(text).__name__}")
    return encodable(text[:MAX_QUERY_CHARS])


def clean_triples(triples: Iterable[Triple]) -> list[Triple]:
    """Validate triples and drop repeats, keeping first-seen order."""
    seen: dict[Triple, None] = {}
    for t in triples:
        if not (isinstance(t, (tuple, list)) and len(t) == 3):
            raise InvalidInput(f"a triple is (subject, relation, object), got {t!r}")
        s, r, o = (_name("triple part", str(x) if isinstance(x, (int, float)) else x).strip() for x in t)
        seen.setdefault((s, r, o), None)
    return list(seen)


def clean_passages(passages: Iterable[Passage]) -> list[Passage]:
    """Validate passages and keep the first of each id."""
    seen: dict[str, Passage] = {}
    for p in passages:
        if not isinstance(p, Passage):
            raise InvalidInput(f"expected a Passage, got {type(p).__name__}")
        _name("passage id", p.id)
        if not isinstance(p.title, str) or not isinstance(p.text, str):
            raise InvalidInput(f"passage {p.id!r}: title and text must be strings")
        p = Passage(encodable(p.id), encodable(p.title), encodable(p.text))
        seen.setdefault(p.id, p)
    return list(seen.values())


class KnowledgeStore(ABC):
    """Named knowledge graphs (triples) and passage corpora behind one API.

    Open one with :func:`mhqa_graph.open_store`. Use as a context manager or call `close()`.
    """

    uri: str
    backend: str

    # -- writing ---------------------------------------------------------------
    def add_triples(self, graph: str, triples: Iterable[Triple]) -> int:
        """Add (subject, relation, object) triples to `graph`, creating it if needed.
        Idempotent: returns the number of triples that were not there before."""
        return self._add_triples(_name("graph", graph), clean_triples(triples))

    def add_passages(self, corpus: str, passages: Iterable[Passage]) -> int:
        """Add passages to `corpus`, creating it if needed. A passage whose id is
        already in the corpus is skipped. Returns the number added."""
        return self._add_passages(_name("corpus", corpus), clean_passages(passages))

    def set_file_sha256(self, kind: str, name: str, sha256: str) -> None:
        """Record that graph or corpus `name` (`kind`) holds what the file whose bytes have this sha256 offers
        (`ingest_dataset` does, once the file is in): `mhqa eval` then knows an edited file from the one it built."""
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise InvalidInput(f"sha256 must be 64 lowercase hex digits, got {sha256!r:.80}")
        self._set_file_sha256(_kind(kind), _name(kind, name), sha256)

    # -- reading -----------------------------------------------------------------
    def file_sha256(self, kind: str, name: str) -> str | None:
        """The sha256 of the file graph or corpus `name` was last built from in full (`set_file_sha256`); None where
        none was recorded (no such collection, one built before stores kept it, or one not built from a file)."""
        return self._file_sha256(_kind(kind), _name(kind, name))

    def match_entities(self, graph: str, text: str, k: int = 5) -> list[EntityHit]:
        """Entities of `graph` whose names best match `text` (semantic + lexical), best first."""
        text = _query(text)
        if not text.strip():
            return []
        return self._match_entities(_name("graph", graph), text, _k(k))

    def node_info(self, graph: str, name: str) -> NodeInfo:
        """The node's facts: outgoing and incoming edges, at most MAX_NODE_FACTS each way. Raises EntityNotFound."""
        return self._node_info(_name("graph", graph), _name("entity name", name))

    def search(self, corpus: str, query: str, k: int = 5, mode: SearchMode = "hybrid") -> list[PassageHit]:
        """Top-k passages of `corpus` for `query`; mode is "bm25", "dense" or "hybrid"."""
        if mode not in SEARCH_MODES:
            raise InvalidInput(f"mode must be one of {SEARCH_MODES}, got {mode!r}")
        query = _query(query)
        if not query.strip():
            return []
        return self._search(_name("corpus", corpus), query, _k(k), mode)

    def passages(self, corpus: str) -> Iterator[Passage]:
        """Every passage of `corpus`, in insertion order."""
        return self._passages(_name("corpus", corpus))

    def stats(self) -> StoreStats:
        """Graphs and corpora in this store, with their sizes."""
        return self._stats()

    def graphs(self) -> list[str]:
        """Names of the graphs, sorted (without counting their contents, unlike `stats`)."""
        return self._collection_names("graph")

    def corpora(self) -> list[str]:
        """Names of the corpora, sorted."""
        return self._collection_names("corpus")

    def as_retriever(self, corpus: str, k: int = 5, mode: SearchMode = "hybrid") -> StoreRetriever:
        """A LangChain `BaseRetriever` over `corpus`."""
        from ..retriever import StoreRetriever

        return StoreRetriever(store=self, corpus=corpus, k=k, mode=mode)

    # -- lifecycle ---------------------------------------------------------------
    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> KnowledgeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.uri}>"

    # -- backend hooks -----------------------------------------------------------
    @abstractmethod
    def _add_triples(self, graph: str, triples: list[Triple]) -> int: ...

    @abstractmethod
    def _add_passages(self, corpus: str, passages: list[Passage]) -> int: ...

    @abstractmethod
    def _match_entities(self, graph: str, text: str, k: int) -> list[EntityHit]: ...

    @abstractmethod
    def _node_info(self, graph: str, name: str) -> NodeInfo: ...

    @abstractmethod
    def _search(self, corpus: str, query: str, k: int, mode: SearchMode) -> list[PassageHit]: ...

    @abstractmethod
    def _passages(self, corpus: str) -> Iterator[Passage]: ...

    @abstractmethod
    def _collection_names(self, kind: str) -> list[str]: ...

    @abstractmethod
    def _stats(self) -> StoreStats: ...

    def _file_sha256(self, kind: str, name: str) -> str | None:
        """A backend that keeps no file digests (a test double) has none: evaluations then check a sample."""
        return None

    def _set_file_sha256(self, kind: str, name: str, sha256: str) -> None:
        return None
