"""A pool of database connections lent to one thread at a time.

A connection per thread would stay open after its thread ends (a process that makes fresh thread
pools then runs out of file handles); a pool keeps at most `keep` idle ones and closes the rest when
they come back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, Protocol, TypeVar


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


class Pool(Generic[C]):
    """Connections made by `make`, reused; `close()` closes the idle ones and each lent one on its return."""

    def __init__(self, make: Callable[[], C], keep: int = 8) -> None:
        self._make = make
        self._keep = keep
        self._idle: list[C] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def lend(self) -> Iterator[C]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._make()
        try:
            yield conn
        finally:
            with self._lock:
                keep = not self._closed and len(self._idle) < self._keep
                if keep:
                    self._idle.append(conn)
            if not keep:
                conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
