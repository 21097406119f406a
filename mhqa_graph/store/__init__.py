"""Open a knowledge store from a URI.

    embedded:///abs/dir, embedded:rel/dir   the embedded backend (ladybug + faiss + SQLite FTS5)
    neo4j://host:7687, neo4j+s://..., bolt://...   a Neo4j 5 server

No URI: $MHQA_STORE, else an embedded store in the user data dir.
Query parameters: `embedder=<spec>` (both backends), `database=<name>` (Neo4j).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import InvalidStoreURI
from .base import KnowledgeStore

NEO4J_SCHEMES = ("neo4j", "neo4j+s", "neo4j+ssc", "bolt", "bolt+s", "bolt+ssc")


def default_store_uri() -> str:
    if os.environ.get("MHQA_STORE"):
        return os.environ["MHQA_STORE"]
    from platformdirs import user_data_dir

    return "embedded://" + str(Path(user_data_dir("mhqa-graph")) / "store")


def open_store(uri: str | None = None, *, embedder: str | None = None, read_only: bool = False) -> KnowledgeStore:
    """Open (creating if needed) the store at `uri`. See the module docstring for URIs."""
    uri = uri or default_store_uri()
    parts = urlsplit(uri)
    params = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    embedder = embedder or params.get("embedder")
    if parts.scheme == "embedded":
        path = unquote(parts.netloc + parts.path) if parts.netloc else unquote(parts.path)
        if not path:
            raise InvalidStoreURI(f"{uri!r}: embedded URI needs a directory, e.g. embedded:///data/store")
        from .embedded import EmbeddedStore

        return EmbeddedStore(Path(path).expanduser(), embedder=embedder, read_only=read_only)
    if parts.scheme in NEO4J_SCHEMES:
        from .neo4j_backend import Neo4jStore

        return Neo4jStore.from_uri(uri, embedder=embedder, database=params.get("database"), read_only=read_only)
    raise InvalidStoreURI(f"{uri!r}: scheme must be 'embedded' or one of {', '.join(NEO4J_SCHEMES)}")


__all__ = ["KnowledgeStore", "open_store", "default_store_uri"]
