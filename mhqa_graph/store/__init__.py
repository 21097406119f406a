"""Open a knowledge store from a URI.

    embedded:///abs/dir, embedded:rel/dir   the embedded backend (SQLite + FTS5 + faiss)
    neo4j://host:7687, neo4j+s://..., bolt://...   a Neo4j 5 server

No URI: $MHQA_STORE, else an embedded store in the user data dir.
Query parameters: `embedder=<spec>` (both backends), `database=<name>` (Neo4j); any other is an
InvalidStoreURI (a misspelt option is never ignored).

Only writers create a store: `open_store(uri, create=False)` (what every read-only command, agent
and eval uses) raises `StoreNotFound` for an embedded directory that holds no store.
"""

from __future__ import annotations

import os
from difflib import get_close_matches
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import InvalidStoreURI, StoreError, StoreNotFound
from .base import KnowledgeStore

NEO4J_SCHEMES = ("neo4j", "neo4j+s", "neo4j+ssc", "bolt", "bolt+s", "bolt+ssc")
URI_OPTIONS = {"embedded": ("embedder",), "neo4j": ("embedder", "database")}


def default_store_uri() -> str:
    if os.environ.get("MHQA_STORE"):
        return os.environ["MHQA_STORE"]
    from platformdirs import user_data_dir

    return "embedded://" + str(Path(user_data_dir("mhqa-graph")) / "store")


def _embedded_dir(uri: str) -> Path | None:
    """The directory of an embedded URI, None for a Neo4j one; InvalidStoreURI for anything else."""
    parts = urlsplit(uri)
    if parts.scheme == "embedded":
        path = unquote(parts.netloc + parts.path) if parts.netloc else unquote(parts.path)
        if not path:
            raise InvalidStoreURI(f"{uri!r}: embedded URI needs a directory, e.g. embedded:///data/store")
        return Path(path).expanduser()
    if parts.scheme in NEO4J_SCHEMES:
        return None
    hint = ""
    if not parts.scheme or len(parts.scheme) == 1:  # a plain path (or a Windows drive letter)
        hint = f"; did you mean embedded://{Path(uri).expanduser().resolve()}?"
    raise InvalidStoreURI(f"{uri!r}: scheme must be 'embedded' or one of {', '.join(NEO4J_SCHEMES)}{hint}")


def uri_options(uri: str) -> dict[str, str]:
    """The query parameters of a store URI (the last of a repeated one); InvalidStoreURI for one its
    backend does not know, with the closest known name as a hint."""
    parts = urlsplit(uri)
    known = URI_OPTIONS["neo4j" if parts.scheme in NEO4J_SCHEMES else "embedded"]
    params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    for key in params:
        if key not in known:
            close = get_close_matches(key, known, 1)
            hint = f"; did you mean {close[0]}=?" if close else ""
            raise InvalidStoreURI(f"{uri!r}: unknown option {key!r} (known: {', '.join(known)}){hint}")
    return params


def check_store_exists(uri: str | None = None) -> str:
    """The URI (default: `default_store_uri()`) if a store is there; StoreNotFound if an embedded
    directory holds none. A Neo4j URI passes: whether the server is up shows when it is opened."""
    uri = uri or default_store_uri()
    root = _embedded_dir(uri)
    uri_options(uri)
    if root is not None and not (root / "store.sqlite").is_file():
        raise StoreNotFound(f"no store at {uri}; build one with `mhqa ingest ... --store {uri}`, "
                            "or check --store / MHQA_STORE")
    return uri


def open_store(uri: str | None = None, *, embedder: str | None = None, read_only: bool = False,
               create: bool = True) -> KnowledgeStore:
    """Open the store at `uri`, creating an embedded one if needed unless `create` is False
    (then StoreNotFound). See the module docstring for URIs."""
    uri = uri or default_store_uri()
    root = _embedded_dir(uri)
    params = uri_options(uri)
    embedder = embedder or params.get("embedder") or None
    if root is not None:
        if not create:
            check_store_exists(uri)
        from .embedded import EmbeddedStore

        return EmbeddedStore(root, embedder=embedder, read_only=read_only)
    try:
        from .neo4j_backend import Neo4jStore
    except ImportError as exc:  # the neo4j extra is not installed
        missing = (exc.name or "").partition(".")[0]
        if missing not in ("neo4j", "langchain_neo4j"):
            raise
        raise StoreError(f"{uri}: a Neo4j store needs the neo4j extra ({missing} is missing); "
                         "pip install 'mhqa-graph[neo4j]'") from None

    return Neo4jStore.from_uri(uri, embedder=embedder, database=params.get("database"), read_only=read_only)


__all__ = ["KnowledgeStore", "check_store_exists", "default_store_uri", "open_store", "uri_options"]
