"""Open a knowledge store from a URI.

    embedded:///abs/dir, embedded:rel/dir   the embedded backend (SQLite + FTS5 + faiss)
    neo4j://host:7687, neo4j+s://..., bolt://...   a Neo4j 5 server

No URI: $MHQA_STORE, else an embedded store in the user data dir.
Query parameters: `embedder=<spec>` (both backends), `database=<name>` (Neo4j); any other is an
InvalidStoreURI (a misspelt option is never ignored), as is a `#` (a fragment would hide what follows it: a folder
name's `#` is written `%23`). A hash embedder's dimension is checked before anything opens (InvalidInput).

Only writers create a store: `open_store(uri, create=False)` (what every read-only command, agent
and eval uses) raises `StoreNotFound` for an embedded directory that holds no store.
"""

from __future__ import annotations

import os
from difflib import get_close_matches
from pathlib import Path
from urllib.parse import SplitResult, parse_qs, quote, unquote, urlencode, urlsplit

from ..embeddings import check_spec
from ..errors import InvalidStoreURI, StoreError, StoreNotFound, shown
from ..paths import expand_user_path
from .base import KnowledgeStore

NEO4J_SCHEMES = ("neo4j", "neo4j+s", "neo4j+ssc", "bolt", "bolt+s", "bolt+ssc")
URI_OPTIONS = {"embedded": ("embedder",), "neo4j": ("embedder", "database")}


def default_store_uri() -> str:
    if os.environ.get("MHQA_STORE"):
        return os.environ["MHQA_STORE"]
    from platformdirs import user_data_dir

    return "embedded://" + str(Path(user_data_dir("mhqa-graph")) / "store")


def _split(uri: str) -> SplitResult:
    """`urlsplit(uri)`; InvalidStoreURI for one it cannot split (an unclosed IPv6 bracket: neo4j://u:p@[::1)."""
    try:
        return urlsplit(uri)
    except ValueError as e:
        raise InvalidStoreURI(f"{shown(uri)}: {e}") from None


def _no_fragment(uri: str) -> None:
    """InvalidStoreURI for a URI holding '#': what follows it (a fragment) would be dropped unseen, `?embedder=`
    too, and an embedded store's folder name cut at it."""
    if "#" in uri:
        raise InvalidStoreURI(f"{uri!r}: a store URI takes no '#' (what follows it would be ignored); write a '#' of a "
                              "folder name as %23, e.g. embedded:///data/st%231")


def _embedded_dir(uri: str) -> Path | None:
    """The directory of an embedded URI, None for a Neo4j one; InvalidStoreURI for anything else."""
    _no_fragment(uri)
    parts = _split(uri)
    if parts.scheme == "embedded":
        path = unquote(parts.netloc + parts.path) if parts.netloc else unquote(parts.path)
        if not path:
            raise InvalidStoreURI(f"{uri!r}: embedded URI needs a directory, e.g. embedded:///data/store")
        return expand_user_path(path, InvalidStoreURI)
    if parts.scheme in NEO4J_SCHEMES:
        return None
    hint = ""
    if not parts.scheme or len(parts.scheme) == 1:  # a plain path (or a Windows drive letter)
        hint = f"; did you mean embedded://{expand_user_path(uri, InvalidStoreURI).resolve()}?"
    raise InvalidStoreURI(f"{uri!r}: scheme must be 'embedded' or one of {', '.join(NEO4J_SCHEMES)}{hint}")


def uri_options(uri: str) -> dict[str, str]:
    """The query parameters of a store URI (the last of a repeated one); InvalidStoreURI for one its
    backend does not know, with the closest known name as a hint."""
    _no_fragment(uri)
    parts = _split(uri)
    known = URI_OPTIONS["neo4j" if parts.scheme in NEO4J_SCHEMES else "embedded"]
    params = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    for key in params:
        if key not in known:
            close = get_close_matches(key, known, 1)
            hint = f"; did you mean {close[0]}=?" if close else ""
            raise InvalidStoreURI(f"{uri!r}: unknown option {key!r} (known: {', '.join(known)}){hint}")
    return params


def store_key(uri: str) -> str:
    """One spelling of a store URI: an embedded store's directory resolved (`~`, `..`, `//`, a relative path) and
    its options sorted, so that one store opened under several spellings is opened once."""
    root = _embedded_dir(uri)
    options = sorted(uri_options(uri).items())
    if root is None:
        return uri
    return f"embedded://{quote(str(root.resolve()))}" + (f"?{urlencode(options)}" if options else "")


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
    check_spec(embedder)
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


__all__ = ["KnowledgeStore", "check_store_exists", "default_store_uri", "open_store", "store_key", "uri_options"]
