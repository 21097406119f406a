"""The call cache: every model call's reply, kept in one SQLite file under a key of everything that decides it, so
that a later run makes only the calls whose key is new (`--llm-cache PATH`, the `llm_cache` setting).

It is LangChain's cache interface (`BaseCache`, a chat model's `cache=`), so any LangChain chat model can use it.
The key is the sha256 of the messages (as LangChain serialises them) and of the model's `_get_llm_string`: its
settings, the call's kwargs (tools, grammar or response format, log-probabilities, reply length) and stop
sequences. The local models put the sha256 of their model file and adapter there instead of their paths
(`model_key`), so that a changed file is a new key and another machine's copy of the same file is the same key.

A reply the cache gave is marked in its `response_metadata` (`FROM_CACHE`), so traces count it (`llm_calls_cached`).
A damaged file, or an entry that cannot be read, is a `CorruptCache` error, never a reply.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import uuid
import warnings
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core._api import LangChainBetaWarning
from langchain_core.caches import BaseCache
from langchain_core.load import dumps, loads
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, Generation

from ..errors import CorruptCache

FORMAT = 1  # of the file: another is refused
UNREPEATABLE = "unrepeatable:"  # the key of a call the cache passes by
FROM_CACHE = "mhqa_from_cache"  # response_metadata key of a reply the cache gave
REPLY_CLASSES = [Generation, ChatGeneration, ChatGenerationChunk, AIMessage, AIMessageChunk]  # all an entry may hold


def model_key(kind: str, settings: dict[str, Any], stop: Sequence[str] | None, kwargs: dict[str, Any],
              repeatable: bool = True) -> str:
    """A local model's `_get_llm_string`: its kind, the settings that decide a reply (model and adapter digests
    in place of their paths), the stop sequences and the call's kwargs, as one JSON text. A call that is not
    `repeatable` (sampling: each call draws anew) gets a key the cache neither reads nor writes."""
    if not repeatable:
        return f"{UNREPEATABLE}{uuid.uuid4()}"
    return json.dumps({"kind": kind, **settings, "stop": list(stop or []), "call": kwargs}, sort_keys=True,
                      default=repr)


class CallCache(BaseCache):
    """Model replies in one SQLite file (see the module docstring). Safe to share between threads and processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self._db.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, reply BLOB NOT NULL)")
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (str(FORMAT),))
            (found,) = self._db.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise CorruptCache(f"{self.path} is not a call cache that can be read ({exc}); move it away to start "
                               "a new one") from None
        if found != str(FORMAT):
            raise CorruptCache(f"{self.path} is a call cache of format {found}; this version reads format {FORMAT}")

    @staticmethod
    def key(prompt: str, llm_string: str) -> str:
        return hashlib.sha256(f"{llm_string}\0{prompt}".encode("utf-8", "surrogatepass")).hexdigest()

    def lookup(self, prompt: str, llm_string: str) -> list[Generation] | None:
        if llm_string.startswith(UNREPEATABLE):
            return None
        key = self.key(prompt, llm_string)
        try:
            with self._lock:
                row = self._db.execute("SELECT reply FROM calls WHERE key = ?", (key,)).fetchone()
        except sqlite3.DatabaseError as exc:
            raise CorruptCache(f"{self.path}: {exc}") from None
        if row is None:
            return None
        try:
            with warnings.catch_warnings():  # `loads` is in beta
                warnings.simplefilter("ignore", LangChainBetaWarning)
                generations = loads(zlib.decompress(row[0]).decode("utf-8"), allowed_objects=REPLY_CLASSES)
            assert isinstance(generations, list) and all(isinstance(g, Generation) for g in generations)
        except Exception as exc:  # noqa: BLE001 (anything that is not a reply is a damaged entry)
            raise CorruptCache(f"{self.path}: the entry {key[:12]} cannot be read ({type(exc).__name__}); move the "
                               "file away to start a new one") from None
        for generation in generations:
            if isinstance(generation, ChatGeneration):
                generation.message.response_metadata = {**generation.message.response_metadata, FROM_CACHE: True}
        return generations

    def update(self, prompt: str, llm_string: str, return_val: Sequence[Generation]) -> None:
        if llm_string.startswith(UNREPEATABLE):
            return
        reply = zlib.compress(dumps(list(return_val)).encode("utf-8", "surrogatepass"), 9)
        try:
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO calls VALUES (?, ?)", (self.key(prompt, llm_string), reply))
        except sqlite3.DatabaseError as exc:
            raise CorruptCache(f"{self.path}: {exc}") from None

    def clear(self, **kwargs: Any) -> None:
        with self._lock:
            self._db.execute("DELETE FROM calls")

    def checkpoint(self) -> None:
        """Write the replies kept in the write-ahead log into the file itself, so that a copy of the file alone
        (a commit) holds them all."""
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM calls").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


_caches: dict[str, CallCache] = {}
_caches_lock = threading.Lock()


def call_cache(path: str | Path) -> CallCache:
    """The process's one `CallCache` of a file."""
    key = str(Path(path).expanduser().resolve())
    with _caches_lock:
        if key not in _caches:
            _caches[key] = CallCache(key)
        return _caches[key]
